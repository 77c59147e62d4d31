/* SPDX-License-Identifier: BSD-3-Clause */
/* Shared pieces of the integration clients: see harness.h. */
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

const char *progname = "test";

/* The connections to wind down before exiting on a failure. */
static struct nbd_handle **tracked;
static int ntracked;
static bool exiting;

void
track_handles (struct nbd_handle **hs, int n)
{
  tracked = hs;
  ntracked = n;
}

/* Lets the replies still due arrive, then disconnects politely.  Hanging
 * up with replies queued crashes nbdkit 1.32.5 (see the field notes),
 * which would bury the failure being reported under a server crash.
 * Anything going wrong in here just ends the wait.
 */
static void
quiesce (void)
{
  if (exiting || !tracked)
    return;
  exiting = true;
  while (in_flight (tracked, ntracked) > 0)
    poll_handles (tracked, ntracked, 10);
  for (int i = 0; i < ntracked; i++)
    nbd_shutdown (tracked[i], 0);
}

static void
vreport (const char *kind, const char *fmt, va_list args)
{
  fprintf (stderr, "%s: %s", progname, kind);
  vfprintf (stderr, fmt, args);
  fputc ('\n', stderr);
}

void
fail_exit (int status)
{
  fflush (stdout);
  fflush (stderr);
  quiesce ();
  exit (status);
}

void
fail (const char *fmt, ...)
{
  va_list args;

  va_start (args, fmt);
  vreport ("FAIL: ", fmt, args);
  va_end (args);
  fail_exit (EXIT_SERVER_BUG);
}

void
hard_error (const char *fmt, ...)
{
  va_list args;

  va_start (args, fmt);
  vreport ("ERROR: ", fmt, args);
  va_end (args);
  fail_exit (EXIT_HARD_ERROR);
}

void
nbd_fail (const char *what)
{
  fail ("%s: %s (errno %d)", what, nbd_get_error (), nbd_get_errno ());
}

void *
xmalloc (size_t n)
{
  void *p = malloc (n ? n : 1);

  if (!p)
    hard_error ("out of memory (%zu bytes)", n);
  return p;
}

void *
xcalloc (size_t n, size_t size)
{
  void *p = calloc (n ? n : 1, size ? size : 1);

  if (!p)
    hard_error ("out of memory (%zu x %zu bytes)", n, size);
  return p;
}

uint64_t
parse_u64 (const char *s, const char *what)
{
  char *end;
  unsigned long long v;

  errno = 0;
  v = strtoull (s, &end, 0);
  if (errno || end == s || *end)
    hard_error ("%s: not a number: '%s'", what, s);
  return v;
}

uint64_t
rng_next (struct rng *r)
{
  uint64_t z = (r->s += UINT64_C (0x9e3779b97f4a7c15));

  z = (z ^ (z >> 30)) * UINT64_C (0xbf58476d1ce4e5b9);
  z = (z ^ (z >> 27)) * UINT64_C (0x94d049bb133111eb);
  return z ^ (z >> 31);
}

uint64_t
rng_below (struct rng *r, uint64_t n)
{
  /* The modulo bias is irrelevant for n far below 2^64. */
  return rng_next (r) % n;
}

uint64_t
rng_range (struct rng *r, uint64_t lo, uint64_t hi)
{
  return lo + rng_below (r, hi - lo + 1);
}

void
rng_fill (struct rng *r, void *buf, size_t len)
{
  uint8_t *p = buf;

  while (len >= 8) {
    uint64_t v = rng_next (r);
    memcpy (p, &v, 8);
    p += 8;
    len -= 8;
  }
  if (len) {
    uint64_t v = rng_next (r);
    memcpy (p, &v, len);
  }
}

uint64_t
seed_from_clock (void)
{
  struct timespec ts;

  clock_gettime (CLOCK_REALTIME, &ts);
  return ((uint64_t) ts.tv_sec * 1000000007u) ^ (uint64_t) ts.tv_nsec
    ^ ((uint64_t) getpid () << 32);
}

int
nbd_connect_unix_or_uri (struct nbd_handle *h, const char *where)
{
  if (strstr (where, "://") == NULL)
    return nbd_connect_unix (h, where);
  /* tls-certificates= and tls-psk-file= name local files. */
  if (nbd_set_uri_allow_local_file (h, true) == -1)
    return -1;
  return nbd_connect_uri (h, where);
}

struct nbd_handle *
connect_socket (const char *sock)
{
  struct nbd_handle *h = nbd_create ();
  uint32_t strict;

  if (!h)
    nbd_fail ("nbd_create");
  strict = nbd_get_strict_mode (h);
  if (nbd_set_strict_mode (h, strict & ~LIBNBD_STRICT_ALIGN) == -1)
    nbd_fail ("nbd_set_strict_mode");
  /* For block status (nbdreq map); costs nothing otherwise. */
  if (nbd_add_meta_context (h, LIBNBD_CONTEXT_BASE_ALLOCATION) == -1)
    nbd_fail ("nbd_add_meta_context");
  if (nbd_connect_unix_or_uri (h, sock) == -1)
    nbd_fail (strstr (sock, "://") ? "nbd_connect_uri" : "nbd_connect_unix");
  return h;
}

void
expect_export_size (struct nbd_handle *h, uint64_t size)
{
  int64_t got = nbd_get_size (h);

  if (got == -1)
    nbd_fail ("nbd_get_size");
  if ((uint64_t) got != size)
    fail ("the export is %" PRId64 " bytes, the image %" PRIu64, got, size);
}

void
disconnect (struct nbd_handle *h)
{
  if (nbd_aio_in_flight (h) > 0)
    hard_error ("disconnect with %d commands in flight",
                nbd_aio_in_flight (h));
  if (nbd_shutdown (h, 0) == -1)
    nbd_fail ("nbd_shutdown");
  nbd_close (h);
}

unsigned
in_flight (struct nbd_handle **hs, int n)
{
  unsigned total = 0;

  for (int i = 0; i < n; i++) {
    int f = nbd_aio_in_flight (hs[i]);
    if (f == -1)
      nbd_fail ("nbd_aio_in_flight");
    total += f;
  }
  return total;
}

void
poll_handles (struct nbd_handle **hs, int n, int timeout_s)
{
  struct pollfd fds[MAX_HANDLES];
  int r;

  if (n > MAX_HANDLES)
    hard_error ("at most %d connections", MAX_HANDLES);

  for (int i = 0; i < n; i++) {
    unsigned dir = nbd_aio_get_direction (hs[i]);

    fds[i].fd = nbd_aio_in_flight (hs[i]) > 0 || (dir & LIBNBD_AIO_DIRECTION_WRITE)
      ? nbd_aio_get_fd (hs[i]) : -1;
    fds[i].events = 0;
    fds[i].revents = 0;
    if (dir & LIBNBD_AIO_DIRECTION_READ)
      fds[i].events |= POLLIN;
    if (dir & LIBNBD_AIO_DIRECTION_WRITE)
      fds[i].events |= POLLOUT;
  }

  r = poll (fds, n, timeout_s * 1000);
  if (r == -1) {
    if (errno == EINTR)
      return;
    hard_error ("poll: %m");
  }
  if (r == 0)
    fail ("no reply from the server for %d s with %u commands in flight",
          timeout_s, in_flight (hs, n));

  for (int i = 0; i < n; i++) {
    if (fds[i].fd == -1 || fds[i].revents == 0)
      continue;
    /* Read first: a reply can change what the connection wants next. */
    if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) {
      if (nbd_aio_notify_read (hs[i]) == -1)
        nbd_fail ("nbd_aio_notify_read");
    }
    else if (fds[i].revents & POLLOUT) {
      if (nbd_aio_notify_write (hs[i]) == -1)
        nbd_fail ("nbd_aio_notify_write");
    }
  }
}

/* O_DIRECT needs an aligned buffer and an aligned length; 4096 covers
 * every device these tests run on.  The last read may come back short at
 * EOF, which O_DIRECT allows.
 */
static bool
load_direct (int fd, uint8_t *buf, uint64_t size)
{
  const size_t chunk = 1 << 20;
  void *bounce;
  uint64_t off = 0;

  if (posix_memalign (&bounce, 4096, chunk))
    hard_error ("out of memory");
  while (off < size) {
    ssize_t r = pread (fd, bounce, chunk, off);
    if (r == -1) {
      free (bounce);
      return false;
    }
    if (r == 0)
      hard_error ("image shorter than expected at %" PRIu64, off);
    if ((uint64_t) r > size - off)
      r = size - off;
    memcpy (buf + off, bounce, r);
    off += r;
  }
  free (bounce);
  return true;
}

void
load_image (const char *path, void *buf, uint64_t expect_size)
{
  struct stat st;
  int fd = open (path, O_RDONLY | O_DIRECT);
  bool direct = fd >= 0;

  if (fd == -1)
    fd = open (path, O_RDONLY);
  if (fd == -1)
    hard_error ("open %s: %m", path);
  if (fstat (fd, &st) == -1)
    hard_error ("fstat %s: %m", path);
  if ((uint64_t) st.st_size != expect_size)
    fail ("%s is %" PRIu64 " bytes, the export %" PRIu64,
          path, (uint64_t) st.st_size, expect_size);

  if (!direct || !load_direct (fd, buf, expect_size)) {
    uint64_t off = 0;
    while (off < expect_size) {
      ssize_t r = pread (fd, (uint8_t *) buf + off, expect_size - off, off);
      if (r <= 0)
        hard_error ("read %s: %m", path);
      off += r;
    }
    /* Leave the cache as we found it (as far as we can). */
    posix_fadvise (fd, 0, 0, POSIX_FADV_DONTNEED);
  }
  close (fd);
}

void
save_file (const char *path, const void *buf, uint64_t len)
{
  FILE *f = fopen (path, "w");

  if (!f)
    hard_error ("create %s: %m", path);
  if (len && fwrite (buf, len, 1, f) != 1)
    hard_error ("write %s: %m", path);
  if (fclose (f) == EOF)
    hard_error ("close %s: %m", path);
}

int64_t
report_mismatch (const char *what, uint64_t base,
                 const uint8_t *want, const uint8_t *got, size_t len)
{
  size_t first, last, count = 0;

  if (memcmp (want, got, len) == 0)
    return -1;
  for (first = 0; want[first] == got[first]; first++)
    ;
  last = first;
  for (size_t i = first; i < len; i++)
    if (want[i] != got[i]) {
      count++;
      last = i;
    }

  fprintf (stderr,
           "%s: %s: %zu of %zu bytes differ, first at offset %" PRIu64
           " (+%zu), last at %" PRIu64 "\n",
           progname, what, count, len, base + first, first, base + last);
  fprintf (stderr, "  offset            expected got\n");
  for (size_t i = first, shown = 0; i <= last && shown < 8; i++)
    if (want[i] != got[i]) {
      fprintf (stderr, "  %-16" PRIu64 "  0x%02x     0x%02x\n",
               base + i, want[i], got[i]);
      shown++;
    }
  return first;
}

static const struct {
  const char *name;
  int err;
} errnames[] = {
  { "EPERM", EPERM }, { "EIO", EIO }, { "ENOMEM", ENOMEM },
  { "EINVAL", EINVAL }, { "ENOSPC", ENOSPC }, { "EOVERFLOW", EOVERFLOW },
  { "ENOTSUP", ENOTSUP }, { "ESHUTDOWN", ESHUTDOWN }, { "ERANGE", ERANGE },
  { "ENOTCONN", ENOTCONN },
};

int
parse_errname (const char *s)
{
  for (size_t i = 0; i < sizeof errnames / sizeof errnames[0]; i++)
    if (strcmp (s, errnames[i].name) == 0)
      return errnames[i].err;
  hard_error ("unknown errno name '%s'", s);
}

const char *
errname (int err)
{
  for (size_t i = 0; i < sizeof errnames / sizeof errnames[0]; i++)
    if (errnames[i].err == err)
      return errnames[i].name;
  return strerror (err);
}

bool
has_word (char **f, int n, int from, const char *word)
{
  for (int i = from; i < n; i++)
    if (strcmp (f[i], word) == 0)
      return true;
  return false;
}

int
split_request (char *req, char **f, int max, int *want, bool *optional)
{
  char *suffix, *save;
  int n = 0;

  *want = 0;
  *optional = false;
  if ((suffix = strpbrk (req, "!?")) != NULL) {
    *optional = *suffix == '?';
    *suffix++ = '\0';
    *want = parse_errname (suffix);
  }
  for (char *p = strtok_r (req, ":", &save); p && n < max;
       p = strtok_r (NULL, ":", &save))
    f[n++] = p;
  if (n == 0)
    hard_error ("empty request");
  return n;
}

int
note_completion (void *opaque, int *error)
{
  struct completion *c = opaque;

  c->done = true;
  c->err = *error;
  return 1;                     /* retire the command */
}

void
usage_exit (const char *synopsis)
{
  fprintf (stderr, "usage: %s %s\n", progname, synopsis);
  exit (EXIT_HARD_ERROR);
}
