/* SPDX-License-Identifier: BSD-3-Clause */
/* The remote supervisor's decisions (src/cli/link_policy.c, compiled in
 * alone): the reconnect backoff grows, carries jitter and never exceeds
 * 2 s, whatever the attempt and the jitter; a new connection is the same
 * export only with the same size, flags, name and description (where
 * both offers have them), and the refusal says what differs.
 */
#include <config.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pdio.h"
#include "unit.h"

static void
check_backoff (void)
{
  uint64_t seed = 42;
  long prev = 0;

  /* Without jitter: 100, 200, 400, 800, 1600, then the cap. */
  for (unsigned a = 0; a < 8; a++) {
    long d = link_backoff_ms (a, 0);
    long want = a < 5 ? 100L << a : 2000;

    CHECK (d == want, "attempt %u: %ld ms, expected %ld", a, d, want);
    CHECK (d >= prev, "attempt %u: %ld ms, less than before", a, d);
    prev = d;
  }
  /* Any attempt, any jitter: within [base, base * 1.25] and the cap. */
  for (unsigned i = 0; i < 100000; i++) {
    unsigned a = unit_rand (&seed) % 100000;
    unsigned j = unit_rand (&seed);
    long base = link_backoff_ms (a, 0), d = link_backoff_ms (a, j);

    CHECK (d >= base && d <= base + base / 4 && d <= 2000,
           "attempt %u jitter %u: %ld ms (base %ld)", a, j, d, base);
  }
  /* Jitter spreads the first attempts. */
  {
    long lo = 1000000, hi = 0;

    for (unsigned j = 0; j < 1000; j++) {
      long d = link_backoff_ms (2, j * 7919);

      lo = d < lo ? d : lo;
      hi = d > hi ? d : hi;
    }
    CHECK (hi - lo >= 50, "attempt 2: jitter spans only %ld..%ld ms", lo,
           hi);
  }
}

static void
check_same_export (void)
{
  struct nbd_offer was = { .size = 1 << 20, .eflags = 0x4d,
                           .has_name = true, .has_description = true };
  struct nbd_offer now;
  char why[512];

  strcpy (was.name, "disk");
  strcpy (was.description, "vm1's disk");
  now = was;
  CHECK (link_same_export (&was, &now, 1 << 20, why, sizeof why),
         "the same export refused: %s", why);
  /* What the device has now (after a resize) is the size to match. */
  CHECK (!link_same_export (&was, &now, 2 << 20, why, sizeof why) &&
         strstr (why, "1048576 bytes, the device's has 2097152"),
         "a smaller export let through: %s", why);
  now.size = 1 << 19;
  CHECK (!link_same_export (&was, &now, 1 << 20, why, sizeof why) &&
         strstr (why, "524288 bytes"), "a different size: %s", why);
  now = was;
  now.eflags |= 0x2;
  CHECK (!link_same_export (&was, &now, 1 << 20, why, sizeof why) &&
         strstr (why, "flags 0x4f"), "different flags: %s", why);
  now = was;
  strcpy (now.name, "other");
  CHECK (!link_same_export (&was, &now, 1 << 20, why, sizeof why) &&
         strstr (why, "named \"other\""), "another name: %s", why);
  now = was;
  strcpy (now.description, "vm2's disk");
  CHECK (!link_same_export (&was, &now, 1 << 20, why, sizeof why) &&
         strstr (why, "vm2's disk"), "another description: %s", why);
  /* A server that does not say (nbd-server gives no description) is
   * judged by what it does say.
   */
  now = was;
  now.has_description = false;
  now.description[0] = '\0';
  CHECK (link_same_export (&was, &now, 1 << 20, why, sizeof why),
         "no description refused: %s", why);
}

int
main (void)
{
  check_backoff ();
  check_same_export ();
  printf ("backoff and export identity as expected\n");
  return 0;
}
