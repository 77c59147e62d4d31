/* SPDX-License-Identifier: BSD-3-Clause */
/* faultreq: a scripted NBD client with a shadow of the whole image, for
 * tests that make the storage fail under the server.
 *
 *   faultreq -i IMAGE [-o SHADOW_OUT] [-c CONTROL] [-s SEED] SOCKET REQ...
 *
 * The shadow starts as IMAGE's content (the file the server will serve,
 * read before the test changes anything).  Requests run one at a time, in
 * order, on one connection (so "the request that failed" is never in
 * doubt):
 *   write:OFF:LEN[:fua]        LEN bytes of fresh pseudo-random data
 *   read:OFF:LEN               checked against the shadow
 *   zero:OFF:LEN[:notrim][:fast][:fua]
 *   trim:OFF:LEN[:fua]
 *   flush
 *   verify                     read the whole export, check every byte
 *   rule:TEXT                  write TEXT to the faultfs control file (-c);
 *                              "rule:clear" drops every rule, "rule:reset"
 *                              the list of faults that fired too
 *   reconnect                  a new connection (the old one closes cleanly,
 *                              unless the server hung up on it)
 *   reconnect:SIZE             the same, offered SIZE bytes (no more than
 *                              the image had: pdio serve offers what the
 *                              image has now); the export is SIZE from then
 *                              on
 *   simple                     reconnect, and from now on ask for simple
 *                              replies (the kernel client's) instead of
 *                              structured ones
 *   fill:OFF:LEN:CHUNK         write CHUNK-byte pieces of fresh data from
 *                              OFF on, until one fails or LEN is covered;
 *                              the errno is that of the failed piece
 *   retry                      send the last failed write again, same
 *                              offset, length and data
 *   sh:COMMAND                 run COMMAND with sh -c between requests (to
 *                              free space, shrink or delete the image...);
 *                              it must exit 0
 * With PDIO_FAULTS_DRY_RUN=1 in the environment, rule: requests are not
 * sent (only printed): a test run that way must fail, which proves that
 * it detects the faults it injects and does not pass by accident.
 * REQ!ERRNAME: the request must fail with that errno (EIO, ENOSPC, ...);
 * REQ?ERRNAME: it may also succeed.  Without a suffix it must succeed.
 * ENOTCONN stands for "the server hung up on it".
 *
 * What a failed request leaves behind is undefined by NBD, but not
 * arbitrary: each byte of a failed write must read back as its old value
 * or the value the write carried, and of a failed zero or trim as its old
 * value or zero.  The shadow records both candidates; the next read that
 * covers the byte must see one of them and adopts it.  Bytes outside every
 * failed request must never change: any read (and `verify`) checks that.
 * A successful trim leaves "old value or zero" the same way.
 *
 * With -o, the export is verified once more at the end and the shadow
 * written out, so the caller can cmp it with the image file after the
 * server has exited.  Exit: 0 every request met its expectation and every
 * byte matched, 1 otherwise, 99 the test could not run.
 */
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"

#define MAX_FIELDS 8

enum { KNOWN = 0, EITHER = 1, ANY = 2 };

static struct {
  struct nbd_handle *h;
  bool simple;                  /* simple replies asked for */
  const char *sock, *control;
  uint64_t size;
  uint8_t *shadow;              /* the value, or the old candidate */
  uint8_t *alt;                 /* the other candidate when EITHER */
  uint8_t *state;
  struct rng rng;
  int status;
  /* The last write that failed, for retry. */
  uint8_t *failed_buf;
  uint64_t failed_off, failed_len;
  uint32_t failed_flags;
} t;

static void
connect_now (void)
{
  if (t.simple) {
    if ((t.h = nbd_create ()) == NULL)
      nbd_fail ("nbd_create");
    if (nbd_set_request_structured_replies (t.h, false) == -1)
      nbd_fail ("nbd_set_request_structured_replies");
    if (nbd_connect_unix (t.h, t.sock) == -1)
      nbd_fail ("nbd_connect_unix");
  }
  else
    t.h = connect_socket (t.sock);
  /* Send what the export does not advertise too: refusing it is the
   * server's job, and the tests check how it refuses.
   */
  if (nbd_set_strict_mode (t.h, nbd_get_strict_mode (t.h)
                           & ~(LIBNBD_STRICT_COMMANDS | LIBNBD_STRICT_ALIGN))
      == -1)
    nbd_fail ("nbd_set_strict_mode");
  track_handles (&t.h, 1);
  expect_export_size (t.h, t.size);
}

static void
check_range (uint64_t off, uint64_t len)
{
  if (off > t.size || len > t.size - off)
    hard_error ("request [%" PRIu64 ", +%" PRIu64 ") is outside the image "
                "(%" PRIu64 " bytes): use hostile for that", off, len, t.size);
}

/* The range may now hold either its old bytes or alt (fill, or data).
 * A byte that already had two candidates and gets a third is no longer
 * checked (ANY) until a read adopts what it holds: that only happens when
 * failed requests overlap with no read in between, and it is said.
 */
static void
mark_either (uint64_t off, uint64_t len, const uint8_t *data, int fill)
{
  uint64_t any = 0;

  for (uint64_t i = off; i < off + len; i++) {
    uint8_t v = data ? data[i - off] : fill;

    if (t.state[i] == ANY)
      continue;
    if (t.state[i] == EITHER) {
      if (t.alt[i] != v && t.shadow[i] != v) {
        t.state[i] = ANY;
        any++;
      }
      continue;
    }
    t.alt[i] = v;
    t.state[i] = EITHER;
  }
  if (any)
    printf ("  note: %" PRIu64 " bytes in [%" PRIu64 ", +%" PRIu64 ") had "
            "two failed changes with no read between: not checked until "
            "read\n", any, off, len);
}

static void
set_known (uint64_t off, uint64_t len, const uint8_t *data)
{
  if (data)
    memcpy (t.shadow + off, data, len);
  else
    memset (t.shadow + off, 0, len);
  memset (t.state + off, KNOWN, len);
}

/* Checks what a read returned; adopts the candidate it saw.  Returns
 * false (after reporting) on a wrong byte.
 */
static bool
check_read (const char *what, uint64_t off, const uint8_t *got, uint64_t len)
{
  uint64_t bad = 0, first = UINT64_MAX, canary = 0;

  for (uint64_t i = 0; i < len; i++) {
    uint64_t o = off + i;
    bool ok = got[i] == t.shadow[o] || t.state[o] == ANY ||
      (t.state[o] == EITHER && got[i] == t.alt[o]);

    if (!ok) {
      if (first == UINT64_MAX) {
        first = o;
        fprintf (stderr, "%s: %s: wrong data:\n  offset            "
                 "expected        got\n", progname, what);
      }
      if (bad < 8) {
        if (t.state[o] == EITHER)
          fprintf (stderr, "  %-16" PRIu64 "  0x%02x or 0x%02x  0x%02x\n",
                   o, t.shadow[o], t.alt[o], got[i]);
        else
          fprintf (stderr, "  %-16" PRIu64 "  0x%02x          0x%02x\n",
                   o, t.shadow[o], got[i]);
      }
      bad++;
      canary += got[i] == 0xa5;
      continue;
    }
    t.shadow[o] = got[i];
    t.state[o] = KNOWN;
  }
  if (bad) {
    fprintf (stderr, "  %" PRIu64 " of %" PRIu64 " bytes wrong, first at %"
             PRIu64 "%s\n", bad, len, first,
             canary == bad ? " (every one 0xa5: the bounce canary)" : "");
    return false;
  }
  return true;
}

static void
write_control (const char *text)
{
  size_t len = strlen (text);
  char *line;
  int fd;

  if (t.control == NULL)
    hard_error ("rule: needs -c CONTROL");
  line = xmalloc (len + 2);
  memcpy (line, text, len);
  line[len] = '\n';
  fd = open (t.control, O_WRONLY | O_TRUNC);
  if (fd == -1)
    hard_error ("open %s: %m", t.control);
  if (write (fd, line, len + 1) != (ssize_t) len + 1)
    hard_error ("rule '%s' refused by %s: %m", text, t.control);
  if (close (fd) == -1)
    hard_error ("close %s: %m", t.control);
  free (line);
}

static int
last_errno (void)
{
  int err = nbd_get_errno ();

  /* libnbd gives no errno when the server hangs up on a request. */
  if (err == 0 && nbd_aio_is_dead (t.h))
    return ENOTCONN;
  if (err == 0)                 /* not the server: libnbd itself refused */
    hard_error ("%s", nbd_get_error ());
  return err;
}

/* Reads [off, off+len) in pieces of at most 32 MiB and checks it. */
static int
read_check (const char *what, uint64_t off, uint64_t len)
{
  const uint64_t piece = 32 << 20;
  uint8_t *buf = xmalloc (len < piece ? len : piece);
  int err = 0;

  for (uint64_t at = off; at < off + len; at += piece) {
    uint64_t n = off + len - at < piece ? off + len - at : piece;

    if (nbd_pread (t.h, buf, n, at, 0) == -1) {
      err = last_errno ();
      break;
    }
    if (!check_read (what, at, buf, n)) {
      t.status = 1;
      break;
    }
  }
  free (buf);
  return err;
}

static void
remember_failed (const uint8_t *buf, uint64_t off, uint64_t len,
                 uint32_t flags)
{
  free (t.failed_buf);
  t.failed_buf = xmalloc (len);
  memcpy (t.failed_buf, buf, len);
  t.failed_off = off;
  t.failed_len = len;
  t.failed_flags = flags;
}

/* One write of fresh data; 0 or the errno. */
static int
do_write (uint64_t off, uint64_t len, uint32_t flags)
{
  uint8_t *buf = xmalloc (len);
  int err = 0;

  check_range (off, len);
  rng_fill (&t.rng, buf, len);
  if (nbd_pwrite (t.h, buf, len, off, flags) == -1) {
    err = last_errno ();
    mark_either (off, len, buf, 0);
    remember_failed (buf, off, len, flags);
  }
  else
    set_known (off, len, buf);
  free (buf);
  return err;
}

/* Runs one request; returns 0 or the errno it failed with. */
static int
run (char **f, int n, const char *text)
{
  const char *name = f[0];
  uint64_t off = n > 1 ? parse_u64 (f[1], "offset") : 0;
  uint64_t len = n > 2 ? parse_u64 (f[2], "length") : 0;
  uint32_t flags = has_word (f, n, 3, "fua") ? LIBNBD_CMD_FLAG_FUA : 0;
  int err = 0;

  if (strcmp (name, "write") == 0 && n >= 3)
    err = do_write (off, len, flags);
  else if (strcmp (name, "fill") == 0 && n == 4) {
    uint64_t chunk = parse_u64 (f[3], "chunk"), at;

    if (chunk == 0)
      hard_error ("fill: chunk must not be 0");
    for (at = off; at < off + len && err == 0; at += chunk)
      err = do_write (at, off + len - at < chunk ? off + len - at : chunk, 0);
    if (err)
      printf ("  %" PRIu64 " bytes written from %" PRIu64 ", then the piece "
              "at %" PRIu64 " failed\n", t.failed_off - off, off,
              t.failed_off);
  }
  else if (strcmp (name, "retry") == 0 && n == 1) {
    if (t.failed_buf == NULL)
      hard_error ("retry: no write has failed yet");
    if (nbd_pwrite (t.h, t.failed_buf, t.failed_len, t.failed_off,
                    t.failed_flags) == -1)
      err = last_errno ();
    else {
      set_known (t.failed_off, t.failed_len, t.failed_buf);
      printf ("  rewrote %" PRIu64 " bytes at %" PRIu64 "\n", t.failed_len,
              t.failed_off);
    }
  }
  else if (strcmp (name, "read") == 0 && n == 3) {
    check_range (off, len);
    err = read_check (text, off, len);
  }
  else if (strcmp (name, "zero") == 0 && n >= 3) {
    check_range (off, len);
    if (has_word (f, n, 3, "notrim"))
      flags |= LIBNBD_CMD_FLAG_NO_HOLE;
    if (has_word (f, n, 3, "fast"))
      flags |= LIBNBD_CMD_FLAG_FAST_ZERO;
    if (nbd_zero (t.h, len, off, flags) == -1) {
      err = last_errno ();
      /* A refused fast zero changes nothing; any other failure may have
       * zeroed part of the range.
       */
      if (!(err == ENOTSUP && (flags & LIBNBD_CMD_FLAG_FAST_ZERO)))
        mark_either (off, len, NULL, 0);
    }
    else
      set_known (off, len, NULL);
  }
  else if (strcmp (name, "trim") == 0 && n >= 3) {
    check_range (off, len);
    if (nbd_trim (t.h, len, off, flags) == -1)
      err = last_errno ();
    mark_either (off, len, NULL, 0);
  }
  else if (strcmp (name, "flush") == 0 && n == 1) {
    if (nbd_flush (t.h, 0) == -1)
      err = last_errno ();
  }
  else if (strcmp (name, "verify") == 0 && n == 1)
    err = read_check ("verify", 0, t.size);
  else if ((strcmp (name, "reconnect") == 0 && n <= 2) ||
           (strcmp (name, "simple") == 0 && n == 1)) {
    /* A server may hang up (a read that fails after a simple reply's
     * header went out): then there is nothing to close cleanly.
     */
    if (nbd_aio_is_dead (t.h) || nbd_aio_is_closed (t.h))
      nbd_close (t.h);
    else
      disconnect (t.h);
    if (strcmp (name, "simple") == 0)
      t.simple = true;
    if (n == 2) {
      uint64_t size = parse_u64 (f[1], "size");

      if (size > t.size)
        hard_error ("reconnect:%" PRIu64 ": more than the %" PRIu64
                    " bytes the shadow holds", size, t.size);
      t.size = size;
    }
    connect_now ();
  }
  else
    hard_error ("bad request '%s' (see the comment at the top of "
                "faultreq.c)", text);
  return err;
}

int
main (int argc, char *argv[])
{
  const char *image = NULL, *out = NULL;
  uint64_t seed = 1;
  struct stat st;
  int c;

  progname = "faultreq";
  while ((c = getopt (argc, argv, "i:o:c:s:")) != -1)
    switch (c) {
    case 'i': image = optarg; break;
    case 'o': out = optarg; break;
    case 'c': t.control = optarg; break;
    case 's': seed = parse_u64 (optarg, "seed"); break;
    default: hard_error ("usage: faultreq -i IMAGE [-o SHADOW_OUT] "
                         "[-c CONTROL] [-s SEED] SOCKET REQ...");
    }
  if (image == NULL || optind >= argc)
    hard_error ("usage: faultreq -i IMAGE [-o SHADOW_OUT] [-c CONTROL] "
                "[-s SEED] SOCKET REQ...");
  t.sock = argv[optind++];
  t.rng.s = seed;
  if (stat (image, &st) == -1)
    hard_error ("%s: %m", image);
  t.size = st.st_size;
  t.shadow = xmalloc (t.size);
  t.alt = xmalloc (t.size);
  t.state = xcalloc (t.size, 1);
  load_image (image, t.shadow, t.size);
  connect_now ();

  for (int i = optind; i < argc; i++) {
    char *req = strdup (argv[i]), *f[MAX_FIELDS];
    int n, want, err, before;
    bool optional;

    if (!req)
      hard_error ("out of memory");
    if (strncmp (req, "sh:", 3) == 0) {
      int rc;

      fflush (stdout);
      rc = system (req + 3);
      printf ("%s -> exit %d\n", argv[i], rc);
      if (rc != 0)
        hard_error ("'%s' failed", req + 3);
      free (req);
      continue;
    }
    if (strncmp (req, "rule:", 5) == 0) {
      const char *dry = getenv ("PDIO_FAULTS_DRY_RUN");

      if (dry && strcmp (dry, "1") == 0)
        printf ("%s (dry run: not installed)\n", argv[i]);
      else {
        write_control (req + 5);
        printf ("%s\n", argv[i]);
      }
      free (req);
      continue;
    }
    n = split_request (req, f, MAX_FIELDS, &want, &optional);

    before = t.status;
    t.status = 0;
    err = run (f, n, argv[i]);
    printf ("%s -> %s%s\n", argv[i], err ? errname (err) : "ok",
            t.status ? ", WRONG DATA (see above)" : "");
    t.status |= before;
    if (err != want && !(optional && err == 0)) {
      printf ("FAIL: %s: expected %s, got %s\n", argv[i],
              want ? errname (want) : "success",
              err ? errname (err) : "success");
      t.status = 1;
    }
    fflush (stdout);
    free (req);
  }

  if (out) {
    if (read_check ("final verify", 0, t.size) != 0) {
      printf ("FAIL: the final read of the whole export failed: %s\n",
              nbd_get_error ());
      t.status = 1;
    }
    save_file (out, t.shadow, t.size);
  }
  fflush (stdout);
  fflush (stderr);
  disconnect (t.h);
  return t.status;
}
