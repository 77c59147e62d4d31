/* SPDX-License-Identifier: BSD-3-Clause */
/* The engine on real files, through its public API, with both backends:
 *
 * - every bad-input case of pdio_open gives its error and message;
 * - random reads, writes (with FUA), zeroes (with and without may-trim and
 *   fast-zero), trims and flushes on odd- and even-sized images, at the
 *   file's own alignment and at align=4096, checked against a shadow copy
 *   read by read and again on the file itself at the end; the file's size
 *   never changes;
 * - after the workload none of the image is in the page cache (mincore);
 * - threads writing disjoint bytes of the same blocks lose nothing;
 * - an image truncated or deleted under it refuses what would grow it back
 *   or be lost, checked once per round of the thread, never with what it
 *   saw before the request came in;
 * - a resize (pdio_refresh_size) moves the end every request after it is
 *   checked against, and the end a file check asks for; a request given a
 *   size (PDIO_SIZED) is judged against that one;
 * - read-only images refuse writes with EPERM;
 * - extents match a known layout of data and holes.
 */
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "engine.h"
#include "req_done.h"
#include "unit.h"

static char dir[4096];
static char last_msg[4096];
static uint64_t seed;

static void
capture (const char *fmt, va_list args)
{
  vsnprintf (last_msg, sizeof last_msg, fmt, args);
}

static const struct pdio_log quiet_log = { capture, capture, NULL };

/* A block device to test on instead of files (argv[1]), or NULL. */
static const char *blockdev;

static void
drop_cache (const char *path)
{
  int fd = open (path, O_RDONLY);

  CHECK (fd >= 0, "open %s: %m", path);
  CHECK (posix_fadvise (fd, 0, 0, POSIX_FADV_DONTNEED) == 0, "fadvise");
  close (fd);
}

/* Fills the first size bytes of path (random or zero), creating a file of
 * that size unless path is the block device; copies what it wrote to
 * content if that is not NULL.
 */
static void
make_file_content (const char *path, uint64_t size, bool random_data,
                   unsigned char *content)
{
  int fd = blockdev ? open (path, O_RDWR)
                    : open (path, O_RDWR | O_CREAT | O_TRUNC, 0644);
  unsigned char buf[65536];
  uint64_t pos;

  CHECK (fd >= 0, "create %s: %m", path);
  CHECK (blockdev || ftruncate (fd, size) == 0, "ftruncate: %m");
  memset (buf, 0, sizeof buf);
  for (pos = 0; (random_data || blockdev) && pos < size; pos += sizeof buf) {
    size_t n = size - pos < sizeof buf ? size - pos : sizeof buf, i;
    for (i = 0; random_data && i < n; i++)
      buf[i] = unit_rand (&seed);
    CHECK (pwrite (fd, buf, n, pos) == (ssize_t) n, "pwrite: %m");
    if (content)
      memcpy (content + pos, buf, n);
  }
  if (content && !random_data && !blockdev)
    memset (content, 0, size);
  /* Start with none of it cached, so residency afterwards is ours. */
  CHECK (fsync (fd) == 0, "fsync: %m");
  CHECK (posix_fadvise (fd, 0, 0, POSIX_FADV_DONTNEED) == 0, "fadvise");
  close (fd);
}

static void
make_file (const char *path, uint64_t size, bool random_data)
{
  make_file_content (path, size, random_data, NULL);
}

static void
read_file (const char *path, unsigned char *buf, uint64_t size)
{
  int fd = open (path, O_RDONLY);
  struct stat st;

  CHECK (fd >= 0 && fstat (fd, &st) == 0, "open %s: %m", path);
  CHECK (blockdev || (uint64_t) st.st_size == size, "%s: size %jd, want %"
         PRIu64, path, (intmax_t) st.st_size, size);
  CHECK (pread (fd, buf, size, 0) == (ssize_t) size, "pread: %m");
  close (fd);
}

/* Pages of the file in the page cache, by mincore on a mapping. */
static size_t
resident_pages (const char *path)
{
  int fd = open (path, O_RDONLY);
  struct stat st;
  unsigned char *vec;
  size_t pages, i, n = 0;
  void *map;

  /* valgrind reads the first pages of every file a program maps: ask
   * fincore(1), which runs outside valgrind, instead.
   */
  if (getenv ("PDIO_TEST_VALGRIND")) {
    char cmd[4200];
    FILE *fp;

    snprintf (cmd, sizeof cmd, "fincore --noheadings --output PAGES '%s'",
              path);
    fp = popen (cmd, "r");
    CHECK (fp && fscanf (fp, "%zu", &n) == 1, "fincore %s", path);
    pclose (fp);
    close (fd);
    return n;
  }
  CHECK (fd >= 0 && fstat (fd, &st) == 0, "open %s: %m", path);
  if (S_ISBLK (st.st_mode))
    st.st_size = lseek (fd, 0, SEEK_END);
  pages = (st.st_size + 4095) / 4096;
  map = mmap (NULL, st.st_size, PROT_READ, MAP_SHARED, fd, 0);
  vec = malloc (pages);
  CHECK (map != MAP_FAILED && vec, "mmap: %m");
  CHECK (mincore (map, st.st_size, vec) == 0, "mincore: %m");
  for (i = 0; i < pages; i++)
    n += vec[i] & 1;
  munmap (map, st.st_size);
  free (vec);
  close (fd);
  return n;
}

static struct pdio_image *
open_image (const char *file, enum pdio_backend backend, uint32_t align,
            bool readonly)
{
  const struct pdio_config cfg = {
    .file = file, .backend = backend, .align = align, .readonly = readonly,
    .log = quiet_log,
  };
  struct pdio_image *img;
  int r = pdio_open (&cfg, &img);

  CHECK (r == 0, "open %s: %s: %s", file, strerror (-r), last_msg);
  return img;
}

/* This thread's engine context for img (each test thread makes its own). */
/* A fresh file NAME of SIZE bytes in dir (its path in PATH), opened. */
static struct pdio_image *
new_image (char path[static 4200], const char *name, uint64_t size,
           bool random_data, enum pdio_backend backend, bool readonly)
{
  snprintf (path, 4200, "%s/%s", dir, name);
  make_file (path, size, random_data);
  return open_image (path, backend, 0, readonly);
}

static struct pdio_thread *
new_thread (struct pdio_image *img)
{
  struct pdio_thread *t;
  const struct pdio_thread_config cfg = { .pool_bytes = 8 << 20 };
  int r = pdio_thread_new (img, &cfg, &t);

  CHECK (r == 0, "pdio_thread_new: %s", strerror (-r));
  return t;
}

static const char *
backend_name (enum pdio_backend b)
{
  return b == PDIO_BACKEND_URING ? "io_uring"
    : b == PDIO_BACKEND_PSYNC ? "psync" : "default";
}

/* The pass tests the backend it is named for: the image chose it, and for
 * io_uring this thread has its ring.  (A thread whose ring setup fails
 * runs the image's I/O on psync, with only a debug line to say so.)
 */
static void
check_backend (struct pdio_image *img, struct pdio_thread *t,
               enum pdio_backend want)
{
  struct pdio_info info;

  pdio_get_info (img, &info);
  CHECK (info.backend == want, "backend %s in use, the test asked for %s",
         backend_name (info.backend), backend_name (want));
  CHECK (want != PDIO_BACKEND_URING || pdio_thread_ring (t) != NULL,
         "the io_uring pass has no ring: this thread fell back to psync");
}

static void
expect_open_error (const char *file, uint32_t align, int err,
                   const char *msg)
{
  const struct pdio_config cfg = { .file = file, .align = align,
                                   .log = quiet_log };
  struct pdio_image *img;
  int r;

  last_msg[0] = '\0';
  r = pdio_open (&cfg, &img);
  CHECK (r == -err && img == NULL, "open %s align %u: got %d, want %d",
         file, align, r, -err);
  CHECK (strstr (last_msg, msg), "open %s: message \"%s\" lacks \"%s\"",
         file ? file : "(null)", last_msg, msg);
}

static void
test_open_errors (void)
{
  char path[4200], missing[4200];

  snprintf (path, sizeof path, "%s/errors.img", dir);
  snprintf (missing, sizeof missing, "%s/no-such.img", dir);
  make_file (path, 1 << 20, false);
  expect_open_error (NULL, 0, EINVAL, "file=IMAGE parameter is required");
  expect_open_error (missing, 0, ENOENT, "No such file or directory");
  expect_open_error (dir, 0, EISDIR, "is a directory");
  expect_open_error ("/dev/null", 0, EINVAL, "not a regular file or block");
  expect_open_error (path, 1000, EINVAL, "align=1000: must be a power of two");
  expect_open_error (path, 256, EINVAL, "align=256");
  expect_open_error (path, 2 << 20, EINVAL, "align=2097152");

  /* A second writer is refused by the image lock; a reader too. */
  {
    struct pdio_image *a = open_image (path, PDIO_BACKEND_DEFAULT, 0, false);
    char holder[64];

    /* The message names the holder: here, this very process. */
    snprintf (holder, sizeof holder, "is in use: pid %d (", (int) getpid ());
    expect_open_error (path, 0, EBUSY, holder);
    pdio_close (a);
  }
  unlink (path);
}

struct shadow_run {
  struct pdio_image *img;
  struct pdio_thread *t;
  unsigned char *shadow;
  uint64_t size;
  unsigned char *area;          /* for buffers at any page offset */
  size_t area_len;
};

static unsigned char *
some_buffer (struct shadow_run *s, uint64_t file_off, size_t len)
{
  /* A third of the buffers line up with the file offset, as a page cache
   * page would (the direct path); the rest are anywhere.
   */
  size_t off = unit_rand (&seed) % 3 == 0 ? file_off % 4096
                                          : unit_rand (&seed) % 4096;

  CHECK (off + len <= s->area_len, "buffer too large");
  return s->area + off;
}

static void
pick_range (struct shadow_run *s, uint64_t *off, size_t *len)
{
  size_t max;

  switch (unit_rand (&seed) % 5) {
  case 0: max = 16; break;
  case 1: max = 5000; break;
  case 2: max = 70000; break;
  case 3: max = 3 << 20; break;                 /* > the bounce cap */
  default: max = 512 * (1 + unit_rand (&seed) % 16); break;
  }
  *len = 1 + unit_rand (&seed) % max;
  if (*len > s->size)
    *len = s->size;
  /* Often near the end, where the unaligned tail is. */
  if (unit_rand (&seed) % 4 == 0)
    *off = s->size - *len - (unit_rand (&seed) % 3 ? 0 : unit_rand (&seed) % (s->size - *len + 1));
  else
    *off = unit_rand (&seed) % (s->size - *len + 1);
}

static void
check_read (struct shadow_run *s, uint64_t off, size_t len)
{
  unsigned char *buf = some_buffer (s, off, len);
  int r = pdio_read (s->t, buf, len, off);
  size_t i;

  CHECK (r == 0, "read %zu at %" PRIu64 ": %s", len, off, strerror (-r));
  for (i = 0; i < len; i++)
    CHECK (buf[i] == s->shadow[off + i], "read %zu at %" PRIu64 ": byte %"
           PRIu64 " is %#x, want %#x", len, off, off + i, buf[i],
           s->shadow[off + i]);
}

static void
random_op (struct shadow_run *s)
{
  uint64_t off;
  size_t len, i;
  unsigned char *buf;
  unsigned flags;
  int r;

  pick_range (s, &off, &len);
  switch (unit_rand (&seed) % 10) {
  case 0: case 1: case 2: case 3:
    buf = some_buffer (s, off, len);
    for (i = 0; i < len; i++)
      buf[i] = unit_rand (&seed);
    flags = unit_rand (&seed) % 4 == 0 ? PDIO_FUA : 0;
    r = pdio_write (s->t, buf, len, off, flags);
    CHECK (r == 0, "write %zu at %" PRIu64 ": %s", len, off, strerror (-r));
    memcpy (s->shadow + off, buf, len);
    break;
  case 4:
    flags = unit_rand (&seed) % 8;
    r = pdio_zero (s->t, len, off, flags);
    if (r == -ENOTSUP && (flags & PDIO_FAST_ZERO))
      break;                    /* honest "that would be slow": unchanged */
    CHECK (r == 0, "zero %zu at %" PRIu64 " flags %u: %s", len, off, flags,
           strerror (-r));
    memset (s->shadow + off, 0, len);
    break;
  case 5:
    r = pdio_trim (s->t, len, off, 0);
    CHECK (r == 0, "trim %zu at %" PRIu64 ": %s", len, off, strerror (-r));
    /* Trimmed bytes read back as before or as zero; learn which. */
    buf = some_buffer (s, off, len);
    r = pdio_read (s->t, buf, len, off);
    CHECK (r == 0, "read after trim: %s", strerror (-r));
    for (i = 0; i < len; i++)
      CHECK (buf[i] == s->shadow[off + i] || buf[i] == 0, "trim changed "
             "byte %" PRIu64 " to %#x", off + i, buf[i]);
    memcpy (s->shadow + off, buf, len);
    break;
  case 6:
    CHECK (pdio_flush (s->t) == 0, "flush");
    break;
  default:
    check_read (s, off, len);
  }
}

static void
test_shadow (enum pdio_backend backend, uint32_t align, uint64_t size,
             unsigned ops)
{
  char path[4200];
  struct shadow_run s = { .size = size };
  struct pdio_stats st;
  struct pdio_info info;
  char stats[512];
  unsigned char *disk;
  uint64_t pos;
  unsigned i;

  snprintf (path, sizeof path, "%s", blockdev ? blockdev : "");
  if (!blockdev)
    snprintf (path, sizeof path, "%s/shadow.img", dir);
  s.shadow = malloc (size);
  disk = malloc (size);
  s.area_len = (4 << 20) + 8192;
  s.area = aligned_alloc (4096, s.area_len);
  CHECK (s.shadow && disk && s.area, "out of memory");
  make_file_content (path, size, true, s.shadow);
  CHECK (resident_pages (path) == 0, "image cached before the test");

  s.img = open_image (path, backend, align, false);
  s.t = new_thread (s.img);
  check_backend (s.img, s.t, backend);
  pdio_get_info (s.img, &info);
  CHECK ((blockdev || info.size == size) && !info.readonly &&
         info.blockdev == (blockdev != NULL), "info");
  CHECK (align == 0 || info.offset_align == align, "align not applied");
  CHECK (info.block_min == 1 &&
         info.block_preferred == (info.offset_align > 512
                                  ? info.offset_align : 512)
         && info.block_max == 32 << 20, "block sizes %u/%u/%u",
         info.block_min, info.block_preferred, info.block_max);

  for (i = 0; i < ops; i++)
    random_op (&s);
  for (pos = 0; pos < size; pos += 1 << 20)
    check_read (&s, pos, size - pos < (1 << 20) ? size - pos : 1 << 20);

  pdio_get_stats (s.img, &st);
  pdio_format_stats (&st, stats, sizeof stats);
  printf ("  %s align %u size %" PRIu64 ": %s\n",
          backend_name (info.backend),
          info.offset_align, size, stats);
  CHECK (st.direct > 0 && st.bounced > 0 && st.rmw_blocks > 0,
         "a path went unused");
  CHECK (size % info.offset_align == 0 || st.tail_writes > 0,
         "the unaligned tail was never written");

  /* The point of pdio: nothing of the image in the page cache. */
  i = resident_pages (path);
  CHECK (i == 0, "%u pages of the image are in the page cache", i);
  pdio_thread_free (s.t);
  pdio_close (s.img);

  read_file (path, disk, size);
  if (blockdev)
    drop_cache (path);
  for (pos = 0; pos < size; pos++)
    CHECK (disk[pos] == s.shadow[pos], "file byte %" PRIu64 " is %#x, want "
           "%#x", pos, disk[pos], s.shadow[pos]);
  if (!blockdev)
    unlink (path);
  free (s.shadow);
  free (disk);
  free (s.area);
}

/* Threads own interleaved byte runs inside the same blocks. */
#define CW_THREADS 6
#define CW_RUN 100
#define CW_SIZE (256 << 10)

struct cw_arg {
  struct pdio_image *img;
  enum pdio_backend backend;
  unsigned id;
};

static void *
concurrent_writer (void *p)
{
  struct cw_arg *a = p;
  struct pdio_thread *t = new_thread (a->img);
  unsigned char buf[CW_RUN + 16];
  uint64_t off;
  int pass;

  check_backend (a->img, t, a->backend);
  for (pass = 0; pass < 3; pass++)
    for (off = (uint64_t) a->id * CW_RUN; off + CW_RUN <= CW_SIZE;
         off += CW_THREADS * CW_RUN) {
      unsigned char *b = buf + (off % 13);
      memset (b, 'A' + a->id + pass, CW_RUN);
      CHECK (pdio_write (t, b, CW_RUN, off, 0) == 0, "concurrent write");
    }
  pdio_thread_free (t);
  return NULL;
}

static void
test_concurrent (enum pdio_backend backend, uint32_t align)
{
  char path[4200];
  struct cw_arg args[CW_THREADS];
  pthread_t t[CW_THREADS];
  struct pdio_image *img;
  unsigned char *disk = malloc (CW_SIZE);
  uint64_t off;
  unsigned i;

  snprintf (path, sizeof path, "%s", blockdev ? blockdev : "");
  if (!blockdev)
    snprintf (path, sizeof path, "%s/concurrent.img", dir);
  make_file (path, CW_SIZE, false);
  img = open_image (path, backend, align, false);
  for (i = 0; i < CW_THREADS; i++) {
    args[i] = (struct cw_arg) { img, backend, i };
    CHECK (pthread_create (&t[i], NULL, concurrent_writer, &args[i]) == 0,
           "pthread_create");
  }
  for (i = 0; i < CW_THREADS; i++)
    pthread_join (t[i], NULL);
  pdio_close (img);
  read_file (path, disk, CW_SIZE);
  if (blockdev)
    drop_cache (path);
  for (off = 0; off < CW_SIZE; off++) {
    uint64_t run = off / CW_RUN;
    unsigned char want = (run + 1) * CW_RUN <= CW_SIZE
      ? 'A' + run % CW_THREADS + 2 : 0;
    CHECK (disk[off] == want, "byte %" PRIu64 " is %#x, want %#x: a write "
           "was lost", off, disk[off], want);
  }
  if (!blockdev)
    unlink (path);
  free (disk);
}

static void
test_readonly (void)
{
  char path[4200];
  struct pdio_image *img;
  struct pdio_thread *t;
  struct pdio_info info;
  char buf[512] = "x";

  img = new_image (path, "ro.img", 1 << 20, true, PDIO_BACKEND_DEFAULT, true);
  t = new_thread (img);
  pdio_get_info (img, &info);
  CHECK (info.readonly, "readonly not reported");
  CHECK (pdio_write (t, buf, 512, 0, 0) == -EPERM, "write allowed");
  CHECK (pdio_zero (t, 4096, 0, 0) == -EPERM, "zero allowed");
  CHECK (pdio_trim (t, 4096, 0, 0) == -EPERM, "trim allowed");
  CHECK (pdio_read (t, buf, 512, 0) == 0, "read refused");
  /* Read-only images take a shared lock: a second reader is fine. */
  {
    struct pdio_image *b = open_image (path, PDIO_BACKEND_DEFAULT, 0, true);
    pdio_close (b);
  }
  pdio_thread_free (t);
  pdio_close (img);
  unlink (path);
}

/* The file shrinks, then is deleted, while open: reads past the new end
 * and writes that would grow it back fail; so does everything once it is
 * gone.
 */
static void
test_changed_under_us (void)
{
  char path[4200];
  struct pdio_image *img;
  struct pdio_thread *t;
  unsigned char *buf = aligned_alloc (4096, 65536);
  int r;

  /* What is written must be defined (valgrind.sh checks it, io_uring too). */
  memset (buf, 0x5a, 65536);
  img = new_image (path, "shrinks.img", 4 << 20, true, PDIO_BACKEND_DEFAULT,
                   false);
  t = new_thread (img);
  CHECK (truncate (path, 1 << 20) == 0, "truncate: %m");
  last_msg[0] = '\0';
  r = pdio_read (t, buf + 1, 5000, (2 << 20) + 7);
  CHECK (r == -EIO, "read past the new end: %d", r);
  CHECK (strstr (last_msg, "shrank"), "no message: \"%s\"", last_msg);
  r = pdio_write (t, buf + 1, 5000, (2 << 20) + 7, 0);
  CHECK (r == -ENOSPC, "write past the new end: %d", r);
  r = pdio_zero (t, 5000, (2 << 20) + 7, 0);
  CHECK (r == -ENOSPC, "zero past the new end: %d", r);
  r = pdio_write (t, buf + 1, 5000, 4096 + 7, 0);
  CHECK (r == 0, "write inside the new end: %d", r);
  CHECK (pdio_read (t, buf, 4096, 0) == 0, "read inside the new end");
  {
    struct stat st;
    CHECK (stat (path, &st) == 0 && st.st_size == 1 << 20,
           "the file grew back to %jd", (intmax_t) st.st_size);
  }
  CHECK (unlink (path) == 0, "unlink: %m");
  CHECK (pdio_write (t, buf, 4096, 0, 0) == -EIO, "write to a deleted file");
  CHECK (pdio_flush (t) == -EIO, "flush of a deleted file");
  pdio_thread_free (t);
  pdio_close (img);
  free (buf);
}

/* The file check asks the file once per round of the thread, and never
 * answers a request with what it saw before the request came in: a write
 * after a flush, a truncate or an unlink sees the change.
 */
/* Submits r (a write of buf at offset, arrived in round arrived), then
 * returns without polling.
 */
static void
submit_write (struct pdio_thread *t, struct pdio_req *r, struct req_done *d,
              void *buf, uint64_t offset, uint64_t arrived)
{
  *d = (struct req_done) { false, 0 };
  *r = (struct pdio_req) {
    .op = PDIO_OP_WRITE, .offset = offset, .count = 4096, .buf = buf,
    .done = req_done, .opaque = d, .arrived = arrived,
  };
  pdio_submit (t, r);
}

static void
wait_done (struct pdio_thread *t, const struct req_done *d, unsigned n)
{
  unsigned i;

  for (i = 0; i < n; i++)
    req_wait (t, &d[i]);
}

static uint64_t
file_checks (const struct pdio_image *img)
{
  struct pdio_stats st;

  pdio_get_stats (img, &st);
  return st.file_checks;
}

/* What the front end's receive completions do before a request starts:
 * take in whatever completed (the image's watch among them).
 */
static void
take_events (struct pdio_thread *t)
{
  struct __kernel_timespec zero = { 0 };

  CHECK (pdio_thread_poll (t, 0, &zero) >= 0, "poll");
}

/* As truncate(1) does: open, then ftruncate. */
static void
shrink_as_truncate_does (const char *path, off_t size)
{
  int fd = open (path, O_WRONLY);

  CHECK (fd >= 0 && ftruncate (fd, size) == 0, "truncate %s: %m", path);
  close (fd);
}

static void
test_check_rounds (enum pdio_backend backend)
{
  char path[4200];
  struct pdio_image *img;
  struct pdio_thread *t;
  struct pdio_req r[8];
  struct req_done d[8];
  unsigned char *buf = aligned_alloc (4096, 4096);
  uint64_t c0, round;
  unsigned i;
  int err;

  memset (buf, 0x6b, 4096);
  img = new_image (path, "rounds.img", 4 << 20, false, backend, false);
  t = new_thread (img);

  /* Eight writes submitted in one round: one fstat. */
  c0 = file_checks (img);
  for (i = 0; i < 8; i++)
    submit_write (t, &r[i], &d[i], buf, i * 65536, 0);
  wait_done (t, d, 8);
  for (i = 0; i < 8; i++)
    CHECK (d[i].err == 0, "write %u: %d", i, d[i].err);
  CHECK (file_checks (img) - c0 == 1, "%" PRIu64 " fstats for 8 writes of "
         "one round, expected 1", file_checks (img) - c0);

  /* The next round asks again... */
  round = pdio_thread_round (t);
  c0 = file_checks (img);
  CHECK (pdio_write (t, buf, 4096, 0, 0) == 0, "write");
  CHECK (file_checks (img) - c0 == 1, "a write of a later round made %"
         PRIu64 " fstats, expected 1", file_checks (img) - c0);
  /* ... but a request that came in before that check reuses it. */
  submit_write (t, &r[0], &d[0], buf, 8192, round);
  wait_done (t, d, 1);
  CHECK (d[0].err == 0, "write: %d", d[0].err);
  CHECK (file_checks (img) - c0 == 1, "a write that arrived before the "
         "last check made %" PRIu64 " more fstats, expected none",
         file_checks (img) - c0 - 1);

  /* Requests that came in through the ring, each in a round of its own:
   * with the image watched (polled on the thread's ring, whatever the
   * file backend), the answer stands while nothing happens to the file:
   * no fstat at any queue depth.  Without a ring, one a round.
   */
  c0 = file_checks (img);
  for (i = 0; i < 8; i++) {
    take_events (t);
    submit_write (t, &r[0], &d[0], buf, i * 4096, pdio_thread_round (t));
    wait_done (t, d, 1);
    CHECK (d[0].err == 0, "write %u: %d", i, d[0].err);
  }
  CHECK (file_checks (img) - c0 == (pdio_thread_ring (t) ? 0 : 8),
         "%" PRIu64 " fstats for 8 writes in 8 rounds, backend %d",
         file_checks (img) - c0, backend);

  /* What came in after a change sees it, whatever was checked before:
   * truncate(1) opens the file, which the watch reports; the request's
   * receive completes after that event is taken in.
   */
  shrink_as_truncate_does (path, 1 << 20);
  take_events (t);
  submit_write (t, &r[0], &d[0], buf, 2 << 20, pdio_thread_round (t));
  wait_done (t, d, 1);
  CHECK (d[0].err == -ENOSPC, "write past the new end, arrived after the "
         "truncate: %d", d[0].err);
  /* truncate(2) by path raises no event the watch listens for (only
   * IN_MODIFY, which our own writes raise too): the answer is trusted
   * for a second at most.
   */
  CHECK (truncate (path, 512 << 10) == 0, "truncate: %m");
  usleep (1100 * 1000);
  take_events (t);
  submit_write (t, &r[0], &d[0], buf, 768 << 10, pdio_thread_round (t));
  wait_done (t, d, 1);
  CHECK (d[0].err == -ENOSPC, "write past a truncate(2) by path, a second "
         "later: %d", d[0].err);
  {
    struct stat st;
    CHECK (stat (path, &st) == 0 && st.st_size == 512 << 10,
           "the file is %jd bytes, not 512 KiB", (intmax_t) st.st_size);
  }
  CHECK (pdio_write (t, buf, 4096, 4096, 0) == 0, "write inside the new end");
  CHECK (pdio_flush (t) == 0, "flush");
  CHECK (unlink (path) == 0, "unlink: %m");
  err = pdio_write (t, buf, 4096, 0, 0);
  CHECK (err == -EIO, "write after a flush and an unlink: %d", err);
  CHECK (pdio_zero (t, 4096, 0, 0) == -EIO, "zero of a deleted file");
  {
    struct stat st;
    CHECK (stat (path, &st) == -1 && errno == ENOENT, "the file came back");
  }
  pdio_thread_free (t);
  pdio_close (img);
  free (buf);
}

/* The size served follows the file once pdio_refresh_size says so, and a
 * request keeps the size it started with (or was given: PDIO_SIZED):
 * - a write into the space a resize added is not refused by a file check
 *   the thread made before the file grew;
 * - if that space is then cut off again behind the engine's back, a write
 *   there is refused (ENOSPC) and does not grow the file back: the file
 *   check asks for the end the request's size allows, not the size at
 *   open;
 * - a request given a size is judged against it, not the size served: a
 *   smaller one refuses what the image now has room for, and a larger
 *   one (a request taken in before a shrink) finds the image shrank (EIO),
 *   not a bad request (EINVAL).
 */
static int
sized (struct pdio_thread *t, enum pdio_op op, void *buf, uint64_t offset,
       size_t count, uint64_t size)
{
  struct req_done d = { false, 0 };
  struct pdio_req r = {
    .op = op, .flags = PDIO_SIZED, .offset = offset, .count = count,
    .buf = buf, .done = req_done, .opaque = &d, .size = size,
  };

  pdio_submit (t, &r);
  wait_done (t, &d, 1);
  return d.err;
}

static void
test_resized (enum pdio_backend backend)
{
  const uint64_t MiB = 1 << 20;
  char path[4200];
  struct pdio_image *img;
  struct pdio_thread *t;
  struct pdio_req r;
  struct req_done d;
  unsigned char *buf = aligned_alloc (4096, 8192);
  uint64_t size, round;
  struct stat st;
  int err;

  memset (buf, 0x3c, 8192);
  img = new_image (path, "resized.img", MiB, false, backend, false);
  t = new_thread (img);

  /* A check made at 1 MiB, then the image grows to 2 MiB. */
  CHECK (pdio_write (t, buf, 4096, 0, 0) == 0, "write");
  round = pdio_thread_round (t);
  CHECK (truncate (path, 2 * MiB) == 0, "truncate: %m");
  CHECK (pdio_refresh_size (img, &size) == 0 && size == 2 * MiB &&
         pdio_size (img) == 2 * MiB, "refresh: size %" PRIu64, size);
  submit_write (t, &r, &d, buf, MiB + MiB / 2, round);
  wait_done (t, &d, 1);
  CHECK (d.err == 0, "a write into the grown space, with a check of before "
         "the growth to reuse: %d", d.err);

  /* The grown space cut off behind the engine's back. */
  CHECK (truncate (path, MiB) == 0, "truncate: %m");
  err = pdio_write (t, buf, 4096, MiB + MiB / 2, 0);
  CHECK (err == -ENOSPC, "a write past the file's end, inside the size "
         "served: %d, want ENOSPC", err);
  CHECK (stat (path, &st) == 0 && st.st_size == (off_t) MiB,
         "the file grew back to %jd", (intmax_t) st.st_size);

  /* Given a size, a request is judged against it. */
  CHECK (truncate (path, 2 * MiB) == 0, "truncate: %m");
  err = sized (t, PDIO_OP_WRITE, buf, MiB + MiB / 2, 4096, MiB);
  CHECK (err == -ENOSPC, "a write past the size it was given: %d, want "
         "ENOSPC", err);
  err = sized (t, PDIO_OP_READ, buf, MiB + MiB / 2, 4096, MiB);
  CHECK (err == -EINVAL, "a read past the size it was given: %d, want "
         "EINVAL", err);
  CHECK (sized (t, PDIO_OP_WRITE, buf, MiB - 4096, 4096, MiB) == 0,
         "a write inside the size it was given");
  CHECK (truncate (path, MiB) == 0, "truncate: %m");
  CHECK (pdio_refresh_size (img, &size) == 0 && size == MiB,
         "refresh: size %" PRIu64, size);
  err = sized (t, PDIO_OP_READ, buf, MiB - 4096, 8192, 2 * MiB);
  CHECK (err == -EIO, "a read taken in before a shrink, past the new end: "
         "%d, want EIO", err);
  CHECK (pdio_read (t, buf, 4096, MiB - 4096) == 0, "read inside");

  pdio_thread_free (t);
  pdio_close (img);
  unlink (path);
  free (buf);
}

struct extent_list {
  uint64_t off[64], len[64];
  bool hole[64];
  unsigned n;
};

static int
collect (void *opaque, uint64_t off, uint64_t len, bool hole)
{
  struct extent_list *l = opaque;

  CHECK (l->n < 64, "too many extents");
  if (l->n && l->hole[l->n - 1] == hole) {      /* merge */
    l->len[l->n - 1] += len;
    return 0;
  }
  l->off[l->n] = off;
  l->len[l->n] = len;
  l->hole[l->n++] = hole;
  return 0;
}

static void
test_extents (void)
{
  char path[4200];
  const uint64_t size = (2 << 20) + 1000;       /* odd tail */
  struct extent_list l = { .n = 0 };
  struct pdio_image *img;
  struct pdio_thread *t;
  unsigned char *buf = aligned_alloc (4096, 65536);

  img = new_image (path, "extents.img", size, false, PDIO_BACKEND_DEFAULT,
                   false);
  t = new_thread (img);
  memset (buf, 7, 65536);
  CHECK (pdio_write (t, buf, 65536, 0, 0) == 0, "write");
  CHECK (pdio_write (t, buf, 4096, 1 << 20, 0) == 0, "write");
  CHECK (pdio_write (t, buf, 1000, 2 << 20, 0) == 0, "write tail");
  CHECK (pdio_extents (img, size, 0, false, collect, &l) == 0, "extents");
  CHECK (l.n == 5, "%u extents", l.n);
  CHECK (!l.hole[0] && l.off[0] == 0 && l.len[0] == 65536, "extent 0");
  CHECK (l.hole[1] && l.off[1] == 65536, "extent 1");
  CHECK (!l.hole[2] && l.off[2] == 1 << 20 && l.len[2] == 4096, "extent 2");
  CHECK (l.hole[3], "extent 3");
  CHECK (!l.hole[4] && l.off[4] == 2 << 20 && l.len[4] == 1000,
         "the tail extent ends at the image end: %" PRIu64 "+%" PRIu64,
         l.off[4], l.len[4]);

  /* Zero with may-trim over the first data run punches a hole. */
  CHECK (pdio_zero (t, 65536, 0, PDIO_MAY_TRIM) == 0, "zero");
  l.n = 0;
  CHECK (pdio_extents (img, 1 << 20, 0, true, collect, &l) == 0, "extents");
  CHECK (l.n == 1 && l.hole[0], "zeroed range not a hole");

  pdio_thread_free (t);
  pdio_close (img);
  unlink (path);
  free (buf);
}

/* A trim of a block device is BLKDISCARD on the engine's helper thread
 * (no ring opcode for it): the request completes from poll, the worker's
 * thread never issues the ioctl, and the discarded blocks read back as
 * zeroes (a loop device punches its backing file).
 */
static void
test_blockdev_trim (const char *dev)
{
  struct pdio_image *img = open_image (dev, PDIO_BACKEND_DEFAULT, 0, false);
  struct pdio_thread *t = new_thread (img);
  struct pdio_stats st0, st1;
  unsigned char *buf = aligned_alloc (4096, 1 << 20);
  size_t i;

  memset (buf, 0x3c, 1 << 20);
  CHECK (pdio_write (t, buf, 1 << 20, 1 << 20, 0) == 0, "write");
  pdio_get_stats (img, &st0);
  CHECK (pdio_trim (t, 1 << 20, 1 << 20, 0) == 0, "trim");
  CHECK (pdio_trim (t, 512 << 10, 256 << 10, PDIO_FUA) == 0, "FUA trim");
  pdio_get_stats (img, &st1);
  CHECK (st1.helper_calls - st0.helper_calls == 2,
         "%" PRIu64 " discards on the helper thread, expected 2",
         st1.helper_calls - st0.helper_calls);
  CHECK (pdio_read (t, buf, 1 << 20, 1 << 20) == 0, "read");
  for (i = 0; i < 1 << 20; i++)
    CHECK (buf[i] == 0, "byte %zu after the discard is %d", i, buf[i]);

  /* A large trim goes to the device in pieces of at most 64 MiB, so the
   * helper thread's other jobs are not held up behind one ioctl; the
   * MiB written on each side of it must survive, and its last MiB read
   * back as zeroes.
   */
  memset (buf, 0x5a, 1 << 20);
  CHECK (pdio_write (t, buf, 1 << 20, 15 << 20, 0) == 0, "write before");
  CHECK (pdio_write (t, buf, 1 << 20, 176 << 20, 0) == 0, "write after");
  CHECK (pdio_write (t, buf, 1 << 20, 175 << 20, 0) == 0, "write last");
  pdio_get_stats (img, &st0);
  CHECK (pdio_trim (t, 160 << 20, 16 << 20, 0) == 0, "160 MiB trim");
  pdio_get_stats (img, &st1);
  CHECK (st1.helper_calls - st0.helper_calls == 3,
         "a 160 MiB discard took %" PRIu64 " helper calls, expected 3 "
         "(64 + 64 + 32 MiB)", st1.helper_calls - st0.helper_calls);
  CHECK (pdio_read (t, buf, 1 << 20, 175 << 20) == 0, "read last");
  for (i = 0; i < 1 << 20; i++)
    CHECK (buf[i] == 0, "byte %zu of the trim's last MiB is %d", i, buf[i]);
  CHECK (pdio_read (t, buf, 1 << 20, 15 << 20) == 0, "read before");
  for (i = 0; i < 1 << 20; i++)
    CHECK (buf[i] == 0x5a, "byte %zu before the trim is %d", i, buf[i]);
  CHECK (pdio_read (t, buf, 1 << 20, 176 << 20) == 0, "read after");
  for (i = 0; i < 1 << 20; i++)
    CHECK (buf[i] == 0x5a, "byte %zu after the trim is %d", i, buf[i]);
  pdio_thread_free (t);
  pdio_close (img);
  free (buf);
}

int
main (int argc, char *argv[])
{
  const char *base = getenv ("TESTS_BUILDDIR");
  const enum pdio_backend backends[] = { PDIO_BACKEND_URING,
                                         PDIO_BACKEND_PSYNC };
  const char *s = getenv ("PDIO_TEST_SEED");
  unsigned b;

  seed = s ? strtoull (s, NULL, 0) : (uint64_t) time (NULL) * 2654435761u;
  printf ("seed %" PRIu64 " (PDIO_TEST_SEED to repeat)\n", seed);
  seed |= 1;
  snprintf (dir, sizeof dir, "%s/tmp-engine-XXXXXX", base ? base : ".");
  CHECK (mkdtemp (dir), "mkdtemp %s: %m", dir);

  if (argc > 1) {
    /* The same workloads on a block device: its whole size, its own
     * sector size, and align=4096 on top where that raises it.
     */
    int fd = open (argv[1], O_RDONLY);
    off_t size = fd >= 0 ? lseek (fd, 0, SEEK_END) : -1;

    CHECK (size > 0, "%s: %m", argv[1]);
    close (fd);
    blockdev = argv[1];
    test_blockdev_trim (argv[1]);
    for (b = 0; b < 2; b++) {
      test_shadow (backends[b], 0, size, 1000);
      test_shadow (backends[b], 4096, size, 500);
      test_concurrent (backends[b], 0);
    }
    rmdir (dir);
    printf ("ok\n");
    return 0;
  }

  test_open_errors ();
  test_changed_under_us ();
  test_check_rounds (PDIO_BACKEND_URING);
  test_check_rounds (PDIO_BACKEND_PSYNC);
  test_resized (PDIO_BACKEND_URING);
  test_resized (PDIO_BACKEND_PSYNC);
  test_readonly ();
  test_extents ();
  /* Under valgrind: psync only (valgrind cannot see the kernel write
   * into memory through io_uring) and fewer operations.
   */
  if (getenv ("PDIO_TEST_VALGRIND")) {
    test_shadow (PDIO_BACKEND_PSYNC, 0, (2 << 20) + 1234, 300);
    test_shadow (PDIO_BACKEND_PSYNC, 4096, (2 << 20) + 512 * 3, 200);
    test_concurrent (PDIO_BACKEND_PSYNC, 0);
    rmdir (dir);
    printf ("ok\n");
    return 0;
  }
  for (b = 0; b < 2; b++) {
    test_shadow (backends[b], 0, (8 << 20) + 1234, 1500);
    test_shadow (backends[b], 4096, (8 << 20) + 512 * 3, 1000);
    test_shadow (backends[b], 0, 8 << 20, 600);
    test_concurrent (backends[b], 0);
    test_concurrent (backends[b], 4096);
  }
  rmdir (dir);
  printf ("ok\n");
  return 0;
}
