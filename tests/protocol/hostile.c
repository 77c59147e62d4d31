/* SPDX-License-Identifier: BSD-3-Clause */
/* hostile: send malformed and abusive NBD requests and check each answer.
 *
 *   hostile -i IMAGE [-o OUT] SOCKET REQ...
 *
 * Two kinds of client:
 *  - libnbd with strict mode 0 (every LIBNBD_STRICT_* check off), so
 *    out-of-range, zero-length, oversize and wrongly flagged requests go
 *    over the wire as asked; structured replies and base:allocation are
 *    negotiated as any modern client does;
 *  - a raw socket speaking the protocol itself, with src/protocol's
 *    codec (fixed newstyle, NBD_OPT_GO, no structured replies), for what
 *    libnbd refuses to send at all: data requests over 64 MiB, unknown
 *    command types, a bad request magic, a write whose payload never
 *    comes.  One fresh connection per raw request.
 *
 * REQ is KIND:ARGS=EXPECT.
 *   read:OFF:LEN[:FLAGS]        libnbd requests; FLAGS is a number (NBD
 *   write:OFF:LEN[:FLAGS]       command flags, any bits up to 0xffff)
 *   same:OFF:LEN[:FLAGS]        a write whose payload is what the image
 *                               already holds (harmless if it is accepted)
 *   zero:OFF:LEN[:FLAGS]  trim:OFF:LEN[:FLAGS]  cache:OFF:LEN[:FLAGS]
 *   bs:OFF:LEN[:FLAGS]    flush[:FLAGS]
 *                               (trim is only expected to fail)
 *   raw-read:OFF:LEN[:FLAGS]    raw requests; raw-write sends LEN bytes of
 *   raw-write:OFF:LEN[:FLAGS]   payload (the complement of the image)
 *   raw-cmd:TYPE:OFF:LEN[:FLAGS]  any command type, no payload
 *   raw-badmagic                a request with a wrong magic
 *   raw-halfwrite:OFF:LEN       a write header, half its payload, hang up:
 *                               the half sent may have been written (a
 *                               server that streams a large payload to
 *                               disk as it comes, as pdio serve does
 *                               over 2 MiB): each of its bytes must hold
 *                               its old value or the one sent; the half
 *                               never sent must be unchanged
 * EXPECT is ok, or errno names separated by | (EINVAL|ENOSPC), where
 * DISCONNECT means the server closed the connection without a reply and
 * LIBNBD that libnbd itself refused to send it; "any" accepts anything
 * (to explore by hand what a server answers).
 *
 * Writes carry the complement of the bytes the image holds (zeroes past
 * its end), so any byte a refused write changes shows; a write or zero
 * the server accepts is applied to the reference (trim is not offered:
 * what it leaves is not determined).  After every
 * request a probe read on the libnbd connection checks that the server
 * still answers (reconnecting if it dropped the connection); after a raw
 * request that got an error reply, a read on the same raw connection
 * checks that the stream is still in step.  At the end the whole export
 * is read and must equal the reference: nothing outside (or inside) a
 * refused request changed.  With -o the reference is saved, for the
 * caller to compare with the image file once the server has exited.
 * Exit 0 all as expected, 1 otherwise, 99 the test could not run.
 */
#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "harness.h"
#include "proto.h"

#define OUT_DISCONNECT (-1000)
#define OUT_LIBNBD (-1001)
#define RAW_TIMEOUT_MS 20000

static struct {
  const char *sock;
  struct nbd_handle *h;
  uint64_t size;
  uint8_t *image;               /* what the image must hold: its content at
                                   the start, with the writes and zeroes the
                                   server accepted applied */
  int status;
} t;

static const struct {
  const char *name;
  int err;
} names[] = {
  { "ok", 0 }, { "EPERM", EPERM }, { "EIO", EIO }, { "ENOMEM", ENOMEM },
  { "EINVAL", EINVAL }, { "ENOSPC", ENOSPC }, { "EOVERFLOW", EOVERFLOW },
  { "ENOTSUP", ENOTSUP }, { "ESHUTDOWN", ESHUTDOWN }, { "ERANGE", ERANGE },
  { "DISCONNECT", OUT_DISCONNECT }, { "LIBNBD", OUT_LIBNBD },
};

static const char *
outname (int out)
{
  static char buf[32];

  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    if (names[i].err == out)
      return names[i].name;
  snprintf (buf, sizeof buf, "errno %d", out);
  return buf;
}

static int
parse_out (const char *s)
{
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    if (strcmp (s, names[i].name) == 0)
      return names[i].err;
  hard_error ("unknown outcome '%s'", s);
}

/* Does EXPECT ("EINVAL|ENOSPC") allow out? */
static bool
allowed (const char *expect, int out)
{
  char *copy, *save, *w;
  bool ok = false;

  if (strcmp (expect, "any") == 0)     /* to explore a server by hand */
    return true;
  copy = strdup (expect);

  if (!copy)
    hard_error ("out of memory");
  for (w = strtok_r (copy, "|", &save); w; w = strtok_r (NULL, "|", &save))
    if (parse_out (w) == out)
      ok = true;
  free (copy);
  return ok;
}

/* The payload of a write: the complement of the image where it exists
 * (so that any byte written shows), or its own content for "same".
 */
static uint8_t *
payload (uint64_t off, uint64_t len, bool same)
{
  uint8_t *buf = xcalloc (len, 1);

  for (uint64_t i = 0; i < len; i++) {
    if (off + i < off || off + i >= t.size)     /* past the end, or wraps */
      break;
    buf[i] = same ? t.image[off + i] : (uint8_t) ~t.image[off + i];
  }
  return buf;
}

/* A request the server accepted: the reference follows it.  (Requests
 * that reach past the end cannot be accepted; if one is, the final check
 * fails anyway, since its payload differs from the image.)
 */
static void
accepted (uint64_t off, uint64_t len, const uint8_t *data)
{
  if (off > t.size || len > t.size - off)
    return;
  if (data)
    memcpy (t.image + off, data, len);
  else
    memset (t.image + off, 0, len);
}

/* A write abandoned after n bytes of its payload: each of those bytes
 * must now read as its old value or as data (those are adopted); the
 * rest of the write's range is checked later like any byte.
 */
static void
abandoned (uint64_t off, uint64_t n, const uint8_t *data)
{
  const uint64_t piece = 32 << 20;
  uint8_t *buf;

  if (off > t.size || n > t.size - off)
    return;
  buf = xmalloc (n < piece ? n : piece);
  for (uint64_t at = 0; at < n; at += piece) {
    uint64_t len = n - at < piece ? n - at : piece;

    if (nbd_pread (t.h, buf, len, off + at, 0) == -1)
      fail ("reading back an abandoned write: %s", nbd_get_error ());
    for (uint64_t i = 0; i < len; i++) {
      if (buf[i] != t.image[off + at + i] && buf[i] != data[at + i])
        fail ("an abandoned write left byte %" PRIu64 " as 0x%02x: neither "
              "its old value 0x%02x nor the one sent 0x%02x", off + at + i,
              buf[i], t.image[off + at + i], data[at + i]);
      t.image[off + at + i] = buf[i];
    }
  }
  free (buf);
}

/* ---- libnbd ------------------------------------------------------------ */

static void
connect_libnbd (void)
{
  t.h = connect_socket (t.sock);
  if (nbd_set_strict_mode (t.h, 0) == -1)
    nbd_fail ("nbd_set_strict_mode");
  track_handles (&t.h, 1);
  expect_export_size (t.h, t.size);
}

static int
extent_cb (void *opaque, const char *context, uint64_t offset,
           uint32_t *entries, size_t nr, int *error)
{
  (void) opaque; (void) context; (void) offset; (void) entries; (void) nr;
  (void) error;
  return 0;
}

/* The outcome of the last libnbd call that failed. */
static int
libnbd_outcome (void)
{
  int err = nbd_get_errno ();

  if (nbd_aio_is_dead (t.h) || nbd_aio_is_closed (t.h))
    return OUT_DISCONNECT;
  printf ("  (libnbd: %s)\n", nbd_get_error ());
  if (err == 0)
    return OUT_LIBNBD;
  return err;
}

static int
run_libnbd (const char *kind, uint64_t off, uint64_t len, uint32_t flags)
{
  nbd_extent_callback cb = { .callback = extent_cb };
  int r;

  if (strcmp (kind, "read") == 0) {
    uint8_t *buf = xmalloc (len);

    r = nbd_pread (t.h, buf, len, off, flags);
    if (r == 0 && off < t.size && len <= t.size - off &&
        report_mismatch ("read", off, t.image + off, buf, len) >= 0) {
      printf ("FAIL: read:%" PRIu64 ":%" PRIu64 " returned wrong data\n",
              off, len);
      t.status = 1;
    }
    free (buf);
  }
  else if (strcmp (kind, "write") == 0 || strcmp (kind, "same") == 0) {
    uint8_t *buf = payload (off, len, strcmp (kind, "same") == 0);

    r = nbd_pwrite (t.h, buf, len, off, flags);
    if (r == 0)
      accepted (off, len, buf);
    free (buf);
  }
  else if (strcmp (kind, "zero") == 0) {
    r = nbd_zero (t.h, len, off, flags);
    if (r == 0)
      accepted (off, len, NULL);
  }
  else if (strcmp (kind, "trim") == 0)
    r = nbd_trim (t.h, len, off, flags);
  else if (strcmp (kind, "cache") == 0)
    r = nbd_cache (t.h, len, off, flags);
  else if (strcmp (kind, "bs") == 0)
    r = nbd_block_status (t.h, len, off, cb, flags);
  else
    hard_error ("unknown request kind '%s'", kind);
  return r == 0 ? 0 : libnbd_outcome ();
}

/* ---- the raw client ------------------------------------------------------ */

static int
raw_connect (void)
{
  struct sockaddr_un sun = { .sun_family = AF_UNIX };
  int fd = socket (AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

  if (fd == -1)
    hard_error ("socket: %m");
  snprintf (sun.sun_path, sizeof sun.sun_path, "%s", t.sock);
  if (connect (fd, (struct sockaddr *) &sun, sizeof sun) == -1)
    fail ("raw connect %s: %m (is the server still there?)", t.sock);
  return fd;
}

/* Sends or receives exactly len bytes within the timeout; false if the
 * server closed the connection (or reset it).
 */
static bool
xfer (int fd, void *buf, size_t len, bool out)
{
  char *p = buf;

  while (len) {
    struct pollfd pfd = { .fd = fd, .events = out ? POLLOUT : POLLIN };
    ssize_t r;

    if (poll (&pfd, 1, RAW_TIMEOUT_MS) == 0)
      fail ("raw connection: no progress for %d s", RAW_TIMEOUT_MS / 1000);
    r = out ? send (fd, p, len, MSG_NOSIGNAL) : recv (fd, p, len, 0);
    if (r == -1 && errno == EINTR)
      continue;
    if (r == -1 && (errno == EPIPE || errno == ECONNRESET))
      return false;
    if (r == -1)
      hard_error ("raw %s: %m", out ? "send" : "recv");
    if (r == 0)
      return false;
    p += r;
    len -= r;
  }
  return true;
}

/* Fixed newstyle handshake with NBD_OPT_GO on the default export. */
static int
raw_open (void)
{
  int fd = raw_connect ();
  uint8_t hello[NBD_GREETING_LEN], cflags[NBD_CLIENT_FLAGS_LEN];
  uint8_t opt[NBD_OPTION_HEADER_LEN], go[NBD_INFO_REQUEST_LEN (0, 0)];
  uint8_t rep[NBD_OPTION_REPLY_LEN];
  uint16_t gflags;

  if (!xfer (fd, hello, sizeof hello, false) ||
      !nbd_parse_greeting (hello, &gflags))
    fail ("raw: not a newstyle NBD server");
  nbd_client_flags (cflags, NBD_FLAG_C_FIXED_NEWSTYLE | NBD_FLAG_C_NO_ZEROES);
  /* The default export (""), no info requests. */
  nbd_option_header (opt, NBD_OPT_GO, nbd_info_request (go, "", 0, NULL, 0));
  if (!xfer (fd, cflags, sizeof cflags, true) ||
      !xfer (fd, opt, sizeof opt, true) || !xfer (fd, go, sizeof go, true))
    fail ("raw: handshake refused");
  for (;;) {
    uint32_t option, type, len;
    char skip[4096];

    if (!xfer (fd, rep, sizeof rep, false) ||
        !nbd_parse_option_reply (rep, &option, &type, &len))
      fail ("raw: bad option reply");
    if (len > sizeof skip || !xfer (fd, skip, len, false))
      fail ("raw: option reply too long");
    if (type == NBD_REP_ACK)
      return fd;
    if (type & NBD_REP_ERR_BIT)
      fail ("raw: NBD_OPT_GO failed (reply type 0x%x)", type);
  }
}

static bool
raw_request (int fd, uint16_t flags, uint16_t type, uint64_t cookie,
             uint64_t off, uint32_t len)
{
  const struct nbd_request r = {
    .flags = flags, .type = type, .cookie = cookie, .offset = off,
    .count = len,
  };
  uint8_t req[NBD_REQUEST_LEN];

  nbd_request_bytes (req, &r);
  return xfer (fd, req, sizeof req, true);
}

/* Reads a simple reply (and its data for a successful read into buf);
 * returns the NBD error, or OUT_DISCONNECT.
 */
static int
raw_reply (int fd, uint64_t cookie, void *buf, uint64_t len)
{
  uint8_t rep[NBD_SIMPLE_REPLY_LEN];
  uint32_t err;
  uint64_t got;

  if (!xfer (fd, rep, sizeof rep, false))
    return OUT_DISCONNECT;
  if (!nbd_parse_simple_reply (rep, &err, &got))
    fail ("raw: not a simple reply");
  if (got != cookie)
    fail ("raw: reply for cookie %" PRIu64 ", not %" PRIu64, got, cookie);
  if (err == 0 && buf && !xfer (fd, buf, len, false))
    return OUT_DISCONNECT;
  return err;
}

/* After an error reply: is the raw stream still in step?  A read of the
 * first 512 bytes must come back right.
 */
static void
raw_still_in_step (int fd, const char *what)
{
  uint8_t buf[512];
  int r;

  if (!raw_request (fd, 0, NBD_CMD_READ, 99, 0, sizeof buf)) {
    printf ("  (%s: the server closed the connection after its error "
            "reply)\n", what);
    return;
  }
  r = raw_reply (fd, 99, buf, sizeof buf);
  if (r == OUT_DISCONNECT)
    printf ("  (%s: the server closed the connection after its error "
            "reply)\n", what);
  else if (r != 0 || memcmp (buf, t.image, sizeof buf) != 0) {
    printf ("FAIL: %s: the connection is out of step after the error "
            "(read: %s)\n", what, outname (r));
    t.status = 1;
  }
  else
    printf ("  (%s: the same connection still serves reads)\n", what);
}

static int
run_raw (const char *kind, char **f, int n, const char *text)
{
  int fd = raw_open (), r;
  uint64_t off, len;
  uint32_t flags;

  if (strcmp (kind, "raw-badmagic") == 0) {
    uint8_t junk[NBD_REQUEST_LEN];

    /* A request's length of bytes that are none: the magic is wrong. */
    memset (junk, 0xde, sizeof junk);
    if (xfer (fd, junk, sizeof junk, true))
      r = raw_reply (fd, 1, NULL, 0);
    else
      r = OUT_DISCONNECT;
    /* An answer to garbage would be odd, but only its content matters. */
    close (fd);
    return r;
  }
  if (strcmp (kind, "raw-cmd") == 0) {
    uint16_t type;

    if (n < 4)
      hard_error ("%s: raw-cmd:TYPE:OFF:LEN[:FLAGS]", text);
    type = parse_u64 (f[1], "type");
    off = parse_u64 (f[2], "offset");
    len = parse_u64 (f[3], "length");
    flags = n > 4 ? parse_u64 (f[4], "flags") : 0;
    r = raw_request (fd, flags, type, 1, off, len)
      ? raw_reply (fd, 1, NULL, 0) : OUT_DISCONNECT;
    if (r > 0)
      raw_still_in_step (fd, text);
    close (fd);
    return r;
  }

  if (n < 3)
    hard_error ("%s: %s:OFF:LEN[:FLAGS]", text, kind);
  off = parse_u64 (f[1], "offset");
  len = parse_u64 (f[2], "length");
  flags = n > 3 ? parse_u64 (f[3], "flags") : 0;
  if (len > UINT32_MAX)
    hard_error ("%s: NBD lengths are 32 bits", text);

  if (strcmp (kind, "raw-read") == 0) {
    uint8_t *buf = xmalloc (len);

    r = raw_request (fd, flags, NBD_CMD_READ, 1, off, len)
      ? raw_reply (fd, 1, buf, len) : OUT_DISCONNECT;
    if (r == 0 && off < t.size && len <= t.size - off &&
        report_mismatch (text, off, t.image + off, buf, len) >= 0) {
      printf ("FAIL: %s returned wrong data\n", text);
      t.status = 1;
    }
    free (buf);
  }
  else if (strcmp (kind, "raw-write") == 0 ||
           strcmp (kind, "raw-halfwrite") == 0) {
    bool half = strcmp (kind, "raw-halfwrite") == 0;
    uint8_t *buf = payload (off, len, false);

    if (!raw_request (fd, flags, NBD_CMD_WRITE, 1, off, len) ||
        !xfer (fd, buf, half ? len / 2 : len, true))
      r = OUT_DISCONNECT;
    else if (half) {
      r = 0;                    /* hang up: nothing to wait for */
      close (fd);
      fd = -1;
      /* A one-byte write into its range waits, on the server, for the
       * range lock the abandoned write holds until what it started is
       * on disk: after it, the range no longer changes.
       */
      if (off < t.size && len / 2 > 0) {
        if (nbd_pwrite (t.h, buf, 1, off, 0) == -1)
          fail ("%s: a write into its range then failed: %s", text,
                nbd_get_error ());
        abandoned (off + 1, len / 2 - 1, buf + 1);
        accepted (off, 1, buf);
      }
    }
    else if ((r = raw_reply (fd, 1, NULL, 0)) == 0)
      accepted (off, len, buf);
    free (buf);
  }
  else
    hard_error ("unknown request kind '%s'", kind);
  if (r > 0)
    raw_still_in_step (fd, text);
  if (fd >= 0)
    close (fd);
  return r;
}

/* ---- main ---------------------------------------------------------------- */

/* The server must still answer on the libnbd connection (a new one if it
 * dropped the old one).
 */
static void
probe (const char *after)
{
  uint8_t buf[4096];
  uint64_t len = t.size < sizeof buf ? t.size : sizeof buf;

  if (nbd_aio_is_dead (t.h) || nbd_aio_is_closed (t.h)) {
    printf ("  (the libnbd connection was dropped: reconnecting)\n");
    nbd_close (t.h);
    connect_libnbd ();
  }
  if (nbd_pread (t.h, buf, len, 0, 0) == -1)
    fail ("after %s the server no longer answers a plain read: %s",
          after, nbd_get_error ());
  if (memcmp (buf, t.image, len) != 0)
    fail ("after %s a plain read returns wrong data", after);
}

int
main (int argc, char *argv[])
{
  const char *image = NULL, *save_to = NULL;
  struct stat st;
  int c;

  progname = "hostile";
  signal (SIGPIPE, SIG_IGN);
  while ((c = getopt (argc, argv, "i:o:")) != -1)
    switch (c) {
    case 'i': image = optarg; break;
    case 'o': save_to = optarg; break;
    default: hard_error ("usage: hostile -i IMAGE [-o OUT] SOCKET REQ...");
    }
  if (image == NULL || optind >= argc)
    hard_error ("usage: hostile -i IMAGE [-o OUT] SOCKET REQ...");
  t.sock = argv[optind++];
  if (stat (image, &st) == -1)
    hard_error ("%s: %m", image);
  t.size = st.st_size;
  t.image = xmalloc (t.size);
  load_image (image, t.image, t.size);
  connect_libnbd ();

  for (int i = optind; i < argc; i++) {
    char *req = strdup (argv[i]), *f[8], *expect, *save;
    int n = 0, out;

    if (!req)
      hard_error ("out of memory");
    expect = strrchr (req, '=');
    if (!expect)
      hard_error ("%s: no =EXPECT", argv[i]);
    *expect++ = '\0';
    for (char *p = strtok_r (req, ":", &save); p && n < 8;
         p = strtok_r (NULL, ":", &save))
      f[n++] = p;
    if (n == 0)
      hard_error ("empty request");

    if (strncmp (f[0], "raw-", 4) == 0)
      out = run_raw (f[0], f, n, argv[i]);
    else if (strcmp (f[0], "flush") == 0)
      out = nbd_flush (t.h, n > 1 ? parse_u64 (f[1], "flags") : 0) == 0
        ? 0 : libnbd_outcome ();
    else {
      if (n < 3)
        hard_error ("%s: KIND:OFF:LEN[:FLAGS]", argv[i]);
      out = run_libnbd (f[0], parse_u64 (f[1], "offset"),
                        parse_u64 (f[2], "length"),
                        n > 3 ? parse_u64 (f[3], "flags") : 0);
    }
    printf ("%s -> %s\n", argv[i], outname (out));
    if (!allowed (expect, out)) {
      printf ("FAIL: %s: got %s\n", argv[i], outname (out));
      t.status = 1;
    }
    fflush (stdout);
    probe (argv[i]);
    free (req);
  }

  /* Nothing may have changed anywhere. */
  {
    const uint64_t piece = 32 << 20;
    uint8_t *buf = xmalloc (piece);

    for (uint64_t at = 0; at < t.size; at += piece) {
      uint64_t len = t.size - at < piece ? t.size - at : piece;

      if (nbd_pread (t.h, buf, len, at, 0) == -1)
        fail ("final read at %" PRIu64 ": %s", at, nbd_get_error ());
      if (report_mismatch ("final read", at, t.image + at, buf, len) >= 0) {
        printf ("FAIL: the image changed\n");
        t.status = 1;
        break;
      }
    }
    free (buf);
    printf ("final read of the whole export: %s\n",
            t.status ? "checked" : "as expected");
  }
  if (save_to)
    save_file (save_to, t.image, t.size);
  fflush (stdout);
  disconnect (t.h);
  return t.status;
}
