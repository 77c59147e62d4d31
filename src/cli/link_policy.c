/* SPDX-License-Identifier: BSD-3-Clause */
/* What the supervisor of a remote device (link.c) decides without
 * looking at the world: how long to wait before the next reconnect
 * attempt, and whether a new connection reached the export the device
 * had.  Pure; tests/cli/test_link compiles it alone.
 */
#include <config.h>

#include <stdio.h>
#include <string.h>

#include "pdio.h"

/* The first retry after BACKOFF_FIRST_MS, doubling, never more than
 * BACKOFF_MAX_MS (jitter included): once the server is reachable again,
 * the device waits at most that long for the attempt that finds it.
 */
#define BACKOFF_FIRST_MS 100
#define BACKOFF_MAX_MS 2000

long
link_backoff_ms (unsigned attempt, unsigned jitter)
{
  long d = BACKOFF_FIRST_MS;

  for (unsigned i = 0; i < attempt && d < BACKOFF_MAX_MS; i++)
    d *= 2;
  /* Up to a quarter more, so that the devices of one server do not all
   * knock at once when it comes back; the cap stays the cap.
   */
  d += jitter % (d / 4 + 1);
  return d < BACKOFF_MAX_MS ? d : BACKOFF_MAX_MS;
}

bool
link_same_export (const struct nbd_offer *was, const struct nbd_offer *now,
                  uint64_t size, char *why, size_t len)
{
  if (now->size != size) {
    snprintf (why, len, "another export: %llu bytes, the device's has %llu",
              (unsigned long long) now->size, (unsigned long long) size);
    return false;
  }
  if (now->eflags != was->eflags) {
    snprintf (why, len, "another export: transmission flags %#x, the "
              "device's had %#x", now->eflags, was->eflags);
    return false;
  }
  if (was->has_name && now->has_name && strcmp (was->name, now->name)) {
    snprintf (why, len, "another export: named \"%s\", the device's was "
              "\"%s\"", now->name, was->name);
    return false;
  }
  if (was->has_description && now->has_description &&
      strcmp (was->description, now->description)) {
    snprintf (why, len, "another export: described as \"%s\", the "
              "device's as \"%s\"", now->description, was->description);
    return false;
  }
  return true;
}
