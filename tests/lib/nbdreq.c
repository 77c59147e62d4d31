/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdreq: send a few NBD requests from a shell test and check each result.
 *
 *   nbdreq SOCKET REQUEST...
 *
 * Each REQUEST is NAME:ARG:... with an optional expectation suffix:
 *   write:OFF:LEN:BYTE[:fua]   write LEN bytes of value BYTE
 *   read:OFF:LEN:BYTE          read, and check every byte is BYTE
 *   zero:OFF:LEN[:notrim][:fast][:fua]
 *                              zero; may deallocate unless notrim
 *   trim:OFF:LEN[:fua]
 *   flush
 *   map:OFF:LEN                block status (base:allocation) of the range,
 *                              printed as "extent OFFSET LENGTH TYPE" lines,
 *                              adjacent extents of one type merged (TYPE 0
 *                              data, 3 hole+zero, as nbdinfo --map shows)
 * REQUEST!ERRNAME   the request must fail with that errno (EPERM, ...)
 * REQUEST?ERRNAME   it may succeed or fail with that errno; prints which
 *                   (a fast zero may be refused with ENOTSUP)
 * Without a suffix the request must succeed.  Numbers may be decimal or
 * 0x hex.  Each request prints one line: the request and "ok" or the
 * error.  Exits 0 if every request met its expectation, 1 otherwise.
 */
#include <config.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

#define MAX_FIELDS 8

/* Extents of a map request, merged as they arrive. */
struct map {
  uint64_t off, len;            /* the pending extent */
  uint32_t type;
  uint64_t next;                /* where the server's answer stopped */
};

static void
map_flush (struct map *m)
{
  if (m->len)
    printf ("extent %lu %lu %u\n", (unsigned long) m->off,
            (unsigned long) m->len, m->type);
  m->len = 0;
}

static int
on_extents (void *opaque, const char *context, uint64_t offset,
            uint32_t *entries, size_t nr, int *error)
{
  struct map *m = opaque;

  (void) error;
  if (strcmp (context, LIBNBD_CONTEXT_BASE_ALLOCATION) != 0)
    return 0;
  if (offset != m->next)
    fail ("block status answer starts at %lu, not %lu",
          (unsigned long) offset, (unsigned long) m->next);
  for (size_t i = 0; i + 1 < nr; i += 2) {
    if (m->len && m->type == entries[i + 1])
      m->len += entries[i];
    else {
      map_flush (m);
      m->off = offset;
      m->len = entries[i];
      m->type = entries[i + 1];
    }
    offset += entries[i];
  }
  m->next = offset;
  return 0;
}

/* Block status until [off, off+len) is covered (a server may answer for
 * less than was asked).  The last extent may run past the range: the
 * caller sees exactly what the server said.
 */
static int
map (struct nbd_handle *h, uint64_t off, uint64_t len)
{
  struct map m = { .next = off };
  nbd_extent_callback cb = { .callback = on_extents, .user_data = &m };

  while (m.next < off + len) {
    uint64_t at = m.next;
    if (nbd_block_status (h, off + len - at, at, cb, 0) == -1)
      return -1;
    if (m.next == at)
      fail ("block status at %lu made no progress", (unsigned long) at);
  }
  map_flush (&m);
  return 0;
}

/* Runs one request; returns 0 or the errno it failed with. */
static int
run (struct nbd_handle *h, char **f, int n, uint64_t *bad_byte_at)
{
  const char *name = f[0];
  uint64_t off = n > 1 ? parse_u64 (f[1], "offset") : 0;
  uint64_t len = n > 2 ? parse_u64 (f[2], "length") : 0;
  uint32_t flags = has_word (f, n, 3, "fua") ? LIBNBD_CMD_FLAG_FUA : 0;
  int r = 0;

  if (strcmp (name, "write") == 0 && n >= 4) {
    uint8_t *buf = xmalloc (len);
    memset (buf, parse_u64 (f[3], "byte"), len);
    r = nbd_pwrite (h, buf, len, off, flags);
    free (buf);
  }
  else if (strcmp (name, "read") == 0 && n == 4) {
    uint8_t *buf = xmalloc (len);
    uint8_t want = parse_u64 (f[3], "byte");
    r = nbd_pread (h, buf, len, off, 0);
    for (uint64_t i = 0; r == 0 && i < len; i++)
      if (buf[i] != want) {
        *bad_byte_at = off + i;
        printf ("  byte %lu is 0x%02x, expected 0x%02x\n",
                (unsigned long) (off + i), buf[i], want);
        break;
      }
    free (buf);
  }
  else if (strcmp (name, "zero") == 0 && n >= 3) {
    if (has_word (f, n, 3, "notrim"))
      flags |= LIBNBD_CMD_FLAG_NO_HOLE;
    if (has_word (f, n, 3, "fast"))
      flags |= LIBNBD_CMD_FLAG_FAST_ZERO;
    r = nbd_zero (h, len, off, flags);
  }
  else if (strcmp (name, "trim") == 0 && n >= 3)
    r = nbd_trim (h, len, off, flags);
  else if (strcmp (name, "flush") == 0 && n == 1)
    r = nbd_flush (h, 0);
  else if (strcmp (name, "map") == 0 && n == 3)
    r = map (h, off, len);
  else
    hard_error ("bad request '%s' (see the comment at the top of nbdreq.c)",
                name);

  if (r == -1) {
    int err = nbd_get_errno ();
    if (err == 0)               /* not a server error: libnbd refused */
      hard_error ("%s: %s", name, nbd_get_error ());
    return err;
  }
  return 0;
}

int
main (int argc, char *argv[])
{
  struct nbd_handle *h;
  int status = 0;

  progname = "nbdreq";
  if (argc < 3)
    hard_error ("usage: nbdreq SOCKET REQUEST...");
  h = connect_socket (argv[1]);
  /* Send even what the export does not advertise (writes to a read-only
   * export): it is the server's refusal that is being tested.
   */
  if (nbd_set_strict_mode (h, nbd_get_strict_mode (h)
                           & ~LIBNBD_STRICT_COMMANDS) == -1)
    nbd_fail ("nbd_set_strict_mode");

  for (int i = 2; i < argc; i++) {
    char *req = strdup (argv[i]), *f[MAX_FIELDS];
    int n, want, err;
    bool optional;
    uint64_t bad_byte_at = UINT64_MAX;

    if (!req)
      hard_error ("out of memory");
    n = split_request (req, f, MAX_FIELDS, &want, &optional);

    err = run (h, f, n, &bad_byte_at);
    printf ("%s -> %s\n", argv[i], err ? errname (err) : "ok");
    if (bad_byte_at != UINT64_MAX) {
      printf ("FAIL: %s: wrong data\n", argv[i]);
      status = 1;
    }
    else if (err != want && !(optional && err == 0)) {
      printf ("FAIL: %s: expected %s, got %s\n", argv[i],
              want ? errname (want) : "success", err ? errname (err) : "success");
      status = 1;
    }
    free (req);
  }
  fflush (stdout);
  disconnect (h);
  return status;
}
