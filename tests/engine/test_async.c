/* SPDX-License-Identifier: BSD-3-Clause */
/* The asynchronous engine: many requests in flight on one thread.
 *
 * - On real files, with io_uring and psync, at the file's alignment and at
 *   align=4096: QD requests at once of random kinds (reads, writes with and
 *   without FUA, zeroes, trims, flushes) at random offsets and lengths,
 *   unaligned ones included, from unaligned memory and from the pool.
 *   Overlapping writes must take effect in submission order (the range
 *   lock's FIFO), so a shadow updated at submit time is exact; a read is
 *   checked when no overlapping write, zero or trim was in flight during
 *   it.  Every done() runs exactly once, from poll, never from submit.
 *   At the end the file equals the shadow.
 * - Aligned requests in aligned pool memory bounce nothing
 *   (stats.bounced_bytes stays 0) and go direct.
 * - Backpressure: a pool with only its bounce region and many large
 *   unaligned requests in flight: they wait for memory, none fails;
 *   pdio_buf_get says NULL when the pool is empty and the free callback
 *   runs when memory comes back.
 * - Several threads, each with its own ring and many writes in flight,
 *   writing interleaved byte runs of the same blocks: the range lock
 *   serialises their read-modify-writes across threads (grants wake the
 *   waiter's own thread), and no write is lost.
 * - A write that comes in pieces: PDIO_OP_LOCK holds its range until
 *   pdio_unlock, PDIO_HELD pieces go inside it, an overlapping write
 *   waits for the unlock; a lock past the end fails with ENOSPC.
 * - On a memory disk that returns short transfers, EAGAIN and EIO: reads,
 *   writes and zeroes in flight together still match the shadow (short
 *   transfers and retries), and with EIO every request still completes
 *   once with 0 or -EIO, and the locks and the pool are all given back.
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

#include "engine_internal.h"
#include "req.h"                /* EXT_BATCH */
#include "mem_backend.h"
#include "req_done.h"
#include "unit.h"
#include "pagesize.h"

#ifdef PDIO_TEST_ASYNC_THREADS_ONLY
#define THREADS_ONLY 1
#else
#define THREADS_ONLY 0
#endif

#define QD 32
#define MAX_LEN (300 << 10)

static char dir[4096];
static uint64_t seed;
static char last_msg[4096];

static void
capture (const char *fmt, va_list args)
{
  vsnprintf (last_msg, sizeof last_msg, fmt, args);
}

/* ---- one run: QD slots over an image and its shadow ------------------------ */

struct slot {
  struct pdio_req r;
  struct run *run;
  bool busy;
  bool tainted;                 /* an overlapping change was in flight */
  bool from_pool;
  size_t pool_len;
  unsigned char *mem;           /* this slot's own memory */
  unsigned char *expect;        /* a read's expected bytes */
};

struct run {
  struct pdio_thread *t;
  struct pdio_info info;
  unsigned char *shadow;
  uint64_t size;
  struct slot slot[QD];
  unsigned in_flight, completed, submitted;
  bool in_submit;               /* done() must not run in here */
  bool allow_eio;               /* the memory disk fails some transfers */
  unsigned eio;
  bool check_reads;
  unsigned reads_checked;
};

static bool
overlaps (uint64_t a, uint64_t alen, uint64_t b, uint64_t blen)
{
  return a < b + blen && b < a + alen;
}

static bool
changes (enum pdio_op op)
{
  return op == PDIO_OP_WRITE || op == PDIO_OP_ZERO || op == PDIO_OP_TRIM;
}

static void
slot_done (struct pdio_req *r, int err)
{
  struct slot *s = r->opaque;
  struct run *run = s->run;

  CHECK (!run->in_submit, "done() called from inside pdio_submit");
  CHECK (s->busy, "done() called twice");
  s->busy = false;
  run->in_flight--;
  run->completed++;
  if (run->allow_eio && err == -EIO) {
    run->eio++;
    if (s->from_pool)
      pdio_buf_put (run->t, r->buf, s->pool_len);
    s->from_pool = false;
    return;
  }
  CHECK (err == 0, "op %d of %zu at %" PRIu64 ": %s", r->op, r->count,
         r->offset, strerror (-err));
  if (r->op == PDIO_OP_READ && !s->tainted && run->check_reads) {
    const unsigned char *got = r->buf;
    size_t i;

    for (i = 0; i < r->count; i++)
      CHECK (got[i] == s->expect[i], "read %zu at %" PRIu64 ": byte %zu is "
             "%#x, want %#x", r->count, r->offset, i, got[i], s->expect[i]);
    run->reads_checked++;
  }
  if (s->from_pool) {
    pdio_buf_put (run->t, r->buf, s->pool_len);
    s->from_pool = false;
  }
}

/* The whole allocation units a trim deallocates (as zero.c decides). */
static void
trim_units (const struct run *run, uint64_t off, uint64_t len, uint64_t *u0,
            uint64_t *u1)
{
  uint64_t g = run->info.fs_block, limit = run->size / g * g;

  *u0 = (off + g - 1) / g * g;
  *u1 = (off + len) / g * g;
  if (*u1 > limit)
    *u1 = limit;
  if (*u0 > *u1)
    *u0 = *u1;
}

static void
submit (struct run *run, struct slot *s, enum pdio_op op, uint64_t off,
        size_t len, unsigned flags, bool aligned_pool)
{
  struct pdio_req *r = &s->r;
  unsigned i;

  s->tainted = false;
  s->from_pool = false;
  r->buf = NULL;
  if (op == PDIO_OP_READ || op == PDIO_OP_WRITE) {
    void *p = aligned_pool ? pdio_buf_get (run->t, len) : NULL;

    if (p) {
      s->from_pool = true;
      s->pool_len = len;
      r->buf = p;
    }
    else
      r->buf = s->mem + unit_rand (&seed) % 4096;
  }
  if (op == PDIO_OP_WRITE) {
    unsigned char *b = r->buf;
    size_t k;

    for (k = 0; k < len; k++)
      b[k] = unit_rand (&seed);
  }
  if (op == PDIO_OP_READ)
    memset (r->buf, 0x5a, len);
  *r = (struct pdio_req) {
    .op = op, .flags = flags, .offset = off, .count = len, .buf = r->buf,
    .done = slot_done, .opaque = s,
  };

  /* Reads racing a change may see either: only check the others. */
  for (i = 0; i < QD; i++) {
    struct slot *o = &run->slot[i];

    if (!o->busy || o == s)
      continue;
    if (op == PDIO_OP_READ && changes (o->r.op) &&
        overlaps (off, len, o->r.offset, o->r.count))
      s->tainted = true;
    if (changes (op) && o->r.op == PDIO_OP_READ &&
        overlaps (off, len, o->r.offset, o->r.count))
      o->tainted = true;
  }
  /* Changes take effect in submission order: update the shadow now. */
  if (op == PDIO_OP_WRITE)
    memcpy (run->shadow + off, r->buf, len);
  else if (op == PDIO_OP_ZERO)
    memset (run->shadow + off, 0, len);
  else if (op == PDIO_OP_TRIM) {
    uint64_t u0, u1;

    trim_units (run, off, len, &u0, &u1);
    memset (run->shadow + u0, 0, u1 - u0);
  }
  else if (op == PDIO_OP_READ)
    memcpy (s->expect, run->shadow + off, len);

  s->busy = true;
  run->in_flight++;
  run->submitted++;
  run->in_submit = true;
  pdio_submit (run->t, r);
  run->in_submit = false;
}

static struct slot *
free_slot (struct run *run)
{
  unsigned i;

  for (i = 0; i < QD; i++)
    if (!run->slot[i].busy)
      return &run->slot[i];
  return NULL;
}

static void
poll_once (struct run *run, unsigned wait_nr)
{
  int n = pdio_thread_poll (run->t, wait_nr, NULL);

  CHECK (n >= 0, "pdio_thread_poll: %s", strerror (-n));
}

static void
drain (struct run *run)
{
  while (run->in_flight)
    poll_once (run, 1);
  CHECK (run->completed == run->submitted, "%u submitted, %u completed",
         run->submitted, run->completed);
}

/* A random range; often unaligned, sometimes overlapping the tail. */
static void
pick (struct run *run, uint64_t *off, size_t *len)
{
  uint32_t a = run->info.offset_align;

  *len = 1 + unit_rand (&seed) % (unit_rand (&seed) % 4 ? 16384 : MAX_LEN);
  if (unit_rand (&seed) % 3 == 0)
    *len = (*len + a - 1) / a * a;
  if (*len > run->size)
    *len = run->size;
  /* A few hot spots, so that writes overlap each other in flight. */
  if (unit_rand (&seed) % 2)
    *off = (unit_rand (&seed) % 8) * 65536 + unit_rand (&seed) % 1000;
  else
    *off = unit_rand (&seed) % (run->size - *len + 1);
  if (unit_rand (&seed) % 3 == 0)
    *off = *off / a * a;
  /* The image's end, where an unaligned size has its buffered tail. */
  if (unit_rand (&seed) % 10 == 0)
    *off = run->size - *len;
  if (*off + *len > run->size)
    *off = run->size - *len;
}

static void
random_ops (struct run *run, unsigned ops, bool with_trim)
{
  unsigned i;

  for (i = 0; i < ops; i++) {
    struct slot *s;
    uint64_t off;
    size_t len;
    unsigned kind = unit_rand (&seed) % 16;
    unsigned fua = unit_rand (&seed) % 4 == 0 ? PDIO_FUA : 0;

    while ((s = free_slot (run)) == NULL)
      poll_once (run, 1);
    pick (run, &off, &len);
    if (kind < 6)
      submit (run, s, PDIO_OP_WRITE, off, len, fua, kind == 0);
    else if (kind < 12)
      submit (run, s, PDIO_OP_READ, off, len, 0, kind == 6);
    else if (kind < 14)
      submit (run, s, PDIO_OP_ZERO, off, len,
              fua | (unit_rand (&seed) % 2 ? PDIO_MAY_TRIM : 0), false);
    else if (kind == 14 && with_trim)
      submit (run, s, PDIO_OP_TRIM, off, len, fua, false);
    else
      submit (run, s, PDIO_OP_FLUSH, 0, 0, 0, false);
    /* Now and then let completions in without waiting. */
    if (unit_rand (&seed) % 4 == 0)
      poll_once (run, 0);
  }
  drain (run);
}

static void
run_init (struct run *run, struct pdio_thread *t, uint64_t size)
{
  unsigned i;

  memset (run, 0, sizeof *run);
  run->t = t;
  run->size = size;
  run->check_reads = true;
  pdio_get_info (pdio_thread_image (t), &run->info);
  run->shadow = malloc (size);
  CHECK (run->shadow, "out of memory");
  for (i = 0; i < QD; i++) {
    run->slot[i].run = run;
    run->slot[i].mem = malloc (MAX_LEN + 4096);
    run->slot[i].expect = malloc (MAX_LEN);
    CHECK (run->slot[i].mem && run->slot[i].expect, "out of memory");
  }
}

static void
run_free (struct run *run)
{
  unsigned i;

  for (i = 0; i < QD; i++) {
    free (run->slot[i].mem);
    free (run->slot[i].expect);
  }
  free (run->shadow);
}

/* ---- real files ---------------------------------------------------------- */

static void
make_image (const char *path, uint64_t size, unsigned char *content)
{
  int fd = open (path, O_RDWR | O_CREAT | O_TRUNC, 0644);
  uint64_t i;

  CHECK (fd >= 0, "create %s: %m", path);
  for (i = 0; i < size; i++)
    content[i] = unit_rand (&seed);
  CHECK (pwrite (fd, content, size, 0) == (ssize_t) size, "pwrite: %m");
  CHECK (fsync (fd) == 0, "fsync: %m");
  CHECK (posix_fadvise (fd, 0, 0, POSIX_FADV_DONTNEED) == 0, "fadvise");
  close (fd);
}

static struct pdio_image *
open_image (const char *path, enum pdio_backend backend, uint32_t align)
{
  const struct pdio_config cfg = {
    .file = path, .backend = backend, .align = align,
    .log = { capture, capture, NULL },
  };
  struct pdio_image *img;
  int r = pdio_open (&cfg, &img);

  CHECK (r == 0, "open %s: %s: %s", path, strerror (-r), last_msg);
  return img;
}

/* A fresh image NAME of SIZE random bytes in dir (its path in PATH),
 * opened with BACKEND and ALIGN, a thread on it with CFG, and RUN on that
 * thread with the image's bytes as its shadow.
 */
static struct pdio_image *
run_on_new_image (struct run *run, char path[static 4200], const char *name,
                  uint64_t size, enum pdio_backend backend, uint32_t align,
                  const struct pdio_thread_config *cfg)
{
  unsigned char *content = malloc (size);
  struct pdio_image *img;
  struct pdio_thread *t;

  CHECK (content, "out of memory");
  snprintf (path, 4200, "%s/%s", dir, name);
  make_image (path, size, content);
  img = open_image (path, backend, align);
  CHECK (pdio_thread_new (img, cfg, &t) == 0, "pdio_thread_new");
  run_init (run, t, size);
  memcpy (run->shadow, content, size);
  free (content);
  return img;
}

static void
test_file (enum pdio_backend backend, uint32_t align, uint64_t size)
{
  const struct pdio_thread_config cfg = { .pool_bytes = 16 << 20 };
  char path[4200], stats[512];
  struct pdio_image *img;
  struct pdio_thread *t;
  struct pdio_stats st;
  struct run run;
  unsigned char *disk = malloc (size);
  int fd;

  CHECK (disk, "out of memory");
  img = run_on_new_image (&run, path, "async.img", size, backend, align, &cfg);
  t = run.t;
  random_ops (&run, 3000, true);

  pdio_get_stats (img, &st);
  pdio_format_stats (&st, stats, sizeof stats);
  printf ("  %s align %u: %u requests, %u reads checked; %s\n",
          run.info.backend == PDIO_BACKEND_URING ? "io_uring" : "psync",
          run.info.offset_align, run.submitted, run.reads_checked, stats);
  CHECK (run.reads_checked > 100, "too few reads checked");
  CHECK (st.direct && st.bounced && st.rmw_blocks, "a path went unused");
  CHECK (size % run.info.offset_align == 0 || st.tail_writes > 0,
         "the unaligned tail was never written");

  pdio_thread_free (t);
  pdio_close (img);
  fd = open (path, O_RDONLY);
  CHECK (fd >= 0 && pread (fd, disk, size, 0) == (ssize_t) size, "read back");
  close (fd);
  CHECK (memcmp (disk, run.shadow, size) == 0, "the file differs from the "
         "shadow");
  run_free (&run);
  free (disk);
  unlink (path);
}

/* Aligned requests in aligned pool memory: zero copies. */
static void
test_zero_copy (void)
{
  /* Room for QD buffers of up to 256 KiB besides the bounce region. */
  const struct pdio_thread_config cfg = { .pool_bytes = 16 << 20 };
  const uint64_t size = 4 << 20;
  char path[4200];
  struct pdio_image *img;
  struct pdio_thread *t;
  struct pdio_stats st;
  struct run run;
  unsigned i;

  img = run_on_new_image (&run, path, "zerocopy.img", size,
                          PDIO_BACKEND_DEFAULT, 0, &cfg);
  t = run.t;
  for (i = 0; i < 400; i++) {
    struct slot *s;
    size_t len = 4096 * (1 + unit_rand (&seed) % 64);
    uint64_t off = (unit_rand (&seed) % ((size - len) / 4096)) * 4096;

    while ((s = free_slot (&run)) == NULL)
      poll_once (&run, 1);
    submit (&run, s, i % 2 ? PDIO_OP_READ : PDIO_OP_WRITE, off, len, 0,
            true);
    CHECK (s->from_pool || !s->busy, "the pool gave no buffer");
  }
  drain (&run);
  pdio_get_stats (img, &st);
  printf ("  zero copy: %" PRIu64 " direct chunks, bounced_bytes=%" PRIu64
          "\n", st.direct, st.bounced_bytes);
  CHECK (st.bounced_bytes == 0 && st.bounced == 0 && st.direct == 400,
         "aligned requests bounced %" PRIu64 " bytes", st.bounced_bytes);
  pdio_thread_free (t);
  pdio_close (img);
  run_free (&run);
  unlink (path);
}

static unsigned buf_free_calls;

static void
note_buf_free (void *opaque)
{
  (void) opaque;
  buf_free_calls++;
}

/* A pool of just the bounce region: requests queue for it, none fails. */
static void
test_backpressure (enum pdio_backend backend)
{
  const struct pdio_thread_config small = {
    .pool_bytes = PDIO_POOL_BOUNCE_ONLY, .ring_entries = 8,
  };
  const struct pdio_thread_config tiny_bufs = {
    .pool_bytes = 0, .ring_entries = 8,
  };
  const uint64_t size = 8 << 20;
  char path[4200];
  struct pdio_image *img;
  struct pdio_thread *t;
  struct run run;
  unsigned i;

  img = run_on_new_image (&run, path, "pressure.img", size, backend, 0, &small);
  t = run.t;
  CHECK (pdio_buf_max (t) == 0 && pdio_buf_get (t, 4096) == NULL,
         "a bounce-only pool hands out buffers");
  /* QD x ~300 KiB unaligned: about 10 MiB of bounce against 2 MiB. */
  for (i = 0; i < 600; i++) {
    struct slot *s;
    size_t len = MAX_LEN - unit_rand (&seed) % 4096;
    uint64_t off = 1 + unit_rand (&seed) % (size - len - 1);

    while ((s = free_slot (&run)) == NULL)
      poll_once (&run, 1);
    submit (&run, s, i % 3 ? PDIO_OP_READ : PDIO_OP_WRITE, off, len, 0,
            false);
  }
  drain (&run);
  printf ("  backpressure (%s): %u unaligned requests through a 2 MiB bounce "
          "region, %u reads checked\n",
          run.info.backend == PDIO_BACKEND_URING ? "io_uring" : "psync",
          run.submitted, run.reads_checked);
  CHECK (t->pool.bounce.free_pages == t->pool.bounce.npages,
         "bounce memory not all given back");
  /* Given back and merged again: the whole region is one block. */
  {
    void *all = pool_get_bounce (&t->pool, pdio_thread_bounce_bytes (img));

    CHECK (all != NULL, "the bounce region did not coalesce");
    pool_put (&t->pool, all, pdio_thread_bounce_bytes (img));
  }
  pdio_thread_free (t);

  /* pdio_buf_get: NULL when the buffer region is empty, the callback
   * after memory came back.
   */
  CHECK (pdio_thread_new (img, &tiny_bufs, &t) == 0, "pdio_thread_new");
  {
    size_t max = pdio_buf_max (t), got = 0;
    void *held[4096];
    unsigned n = 0;

    CHECK (max == (2 << 20), "buf max %zu, not one pool chunk", max);
    buf_free_calls = 0;
    pdio_thread_on_buf_free (t, note_buf_free, NULL);
    while (n < 4096 && (held[n] = pdio_buf_get (t, 1 << 20)) != NULL) {
      got += 1 << 20;
      n++;
    }
    CHECK (got == PDIO_POOL_DEFAULT - pdio_thread_bounce_bytes (img),
           "the pool ran out after %zu MiB", got >> 20);
    CHECK (pdio_buf_get (t, 4096) == NULL, "a page from an empty pool");
    pdio_buf_put (t, held[--n], 1 << 20);
    CHECK (pdio_thread_poll (t, 0, NULL) >= 0 && buf_free_calls == 1,
           "no free callback (%u)", buf_free_calls);
    CHECK (pdio_buf_get (t, 4096) != NULL, "no page after a put");
    printf ("  pdio_buf_get: %zu MiB until NULL, callback after a put\n",
            got >> 20);
  }
  pdio_thread_free (t);
  pdio_close (img);
  run_free (&run);
  unlink (path);
}

/* ---- several threads, each with its own ring, sharing blocks ---------------- */

/* Each thread owns interleaved runs of TH_RUN bytes, so their writes share
 * blocks (read-modify-write across threads, serialised by the range lock
 * and its cross-thread wakeups) but never bytes: each thread's own shadow
 * of its bytes is exact, whatever the interleaving.
 */
#define TH_THREADS 3
#define TH_QD 16
#define TH_RUN 700
#define TH_SIZE ((2 << 20) + 333)

struct th_slot {
  struct pdio_req r;
  struct th_arg *a;
  bool busy;
  unsigned char mem[TH_RUN + 64];
};

struct th_arg {
  struct pdio_image *img;
  unsigned id;
  unsigned char *shadow;        /* this thread's bytes only */
  unsigned in_flight;
  struct th_slot slot[TH_QD];
};

static void
th_done (struct pdio_req *r, int err)
{
  struct th_slot *s = r->opaque;

  CHECK (err == 0, "thread %u: write %zu at %" PRIu64 ": %s", s->a->id,
         r->count, r->offset, strerror (-err));
  CHECK (s->busy, "done() twice");
  s->busy = false;
  s->a->in_flight--;
}

static void *
th_worker (void *p)
{
  struct th_arg *a = p;
  const struct pdio_thread_config cfg = {
    .pool_bytes = PDIO_POOL_BOUNCE_ONLY, .ring_entries = 32,
  };
  uint64_t s = seed ^ (0x9e3779b97f4a7c15ULL * (a->id + 1));
  const uint64_t runs = TH_SIZE / TH_RUN;
  struct pdio_thread *t;
  unsigned i, k;

  CHECK (pdio_thread_new (a->img, &cfg, &t) == 0, "pdio_thread_new");
  for (i = 0; i < 1500; i++) {
    struct th_slot *sl = NULL;
    uint64_t run, off;
    size_t len;

    while (sl == NULL) {
      for (k = 0; k < TH_QD && !sl; k++)
        if (!a->slot[k].busy)
          sl = &a->slot[k];
      if (!sl)
        CHECK (pdio_thread_poll (t, 1, NULL) >= 0, "poll");
    }
    /* A piece of one of my runs, from unaligned memory. */
    run = (unit_rand (&s) % (runs / TH_THREADS)) * TH_THREADS + a->id;
    off = run * TH_RUN + unit_rand (&s) % 64;
    len = 1 + unit_rand (&s) % (TH_RUN - 64);
    sl->a = a;
    sl->r = (struct pdio_req) {
      .op = PDIO_OP_WRITE, .offset = off, .count = len,
      .buf = sl->mem + unit_rand (&s) % 64, .done = th_done, .opaque = sl,
      .flags = unit_rand (&s) % 16 == 0 ? PDIO_FUA : 0,
    };
    for (k = 0; k < len; k++)
      ((unsigned char *) sl->r.buf)[k] = unit_rand (&s);
    memcpy (a->shadow + off, sl->r.buf, len);
    sl->busy = true;
    a->in_flight++;
    pdio_submit (t, &sl->r);
    if (unit_rand (&s) % 3 == 0)
      CHECK (pdio_thread_poll (t, 0, NULL) >= 0, "poll");
  }
  while (a->in_flight)
    CHECK (pdio_thread_poll (t, 1, NULL) >= 0, "poll");
  pdio_thread_free (t);
  return NULL;
}

static void
test_threads (enum pdio_backend backend, uint32_t align)
{
  char path[4200];
  struct th_arg args[TH_THREADS];
  pthread_t th[TH_THREADS];
  struct pdio_image *img;
  unsigned char *disk = calloc (1, TH_SIZE), *zero = calloc (1, TH_SIZE);
  uint64_t b;
  unsigned i;
  int fd;

  snprintf (path, sizeof path, "%s/threads.img", dir);
  make_image (path, TH_SIZE, disk);
  memset (disk, 0, TH_SIZE);
  fd = open (path, O_WRONLY);
  CHECK (fd >= 0 && pwrite (fd, zero, TH_SIZE, 0) == TH_SIZE && fsync (fd) == 0,
         "zero the image: %m");
  close (fd);
  img = open_image (path, backend, align);
  for (i = 0; i < TH_THREADS; i++) {
    args[i] = (struct th_arg) { .img = img, .id = i };
    args[i].shadow = calloc (1, TH_SIZE);
    CHECK (args[i].shadow, "out of memory");
    CHECK (pthread_create (&th[i], NULL, th_worker, &args[i]) == 0,
           "pthread_create");
  }
  for (i = 0; i < TH_THREADS; i++)
    pthread_join (th[i], NULL);
  pdio_close (img);
  fd = open (path, O_RDONLY);
  CHECK (fd >= 0 && pread (fd, disk, TH_SIZE, 0) == TH_SIZE, "read back");
  close (fd);
  for (b = 0; b < TH_SIZE; b++) {
    uint64_t run = b / TH_RUN;
    unsigned owner = run % TH_THREADS;
    unsigned char want = run < TH_SIZE / TH_RUN ? args[owner].shadow[b] : 0;

    CHECK (disk[b] == want, "byte %" PRIu64 " (thread %u's) is %#x, want "
           "%#x: a write was lost", b, owner, disk[b], want);
  }
  printf ("  %u threads x %u in flight, %s align %u: interleaved writes "
          "into shared blocks, none lost\n", TH_THREADS, TH_QD,
          backend == PDIO_BACKEND_PSYNC ? "psync" : "io_uring", align);
  for (i = 0; i < TH_THREADS; i++)
    free (args[i].shadow);
  free (disk);
  free (zero);
  unlink (path);
}

/* ---- a memory disk: short transfers, EAGAIN, EIO ---------------------------- */

#define MEM_SIZE (4 << 20)

static void
test_mem_disk (uint32_t align, unsigned eio_every)
{
  const struct pdio_thread_config cfg = {
    .pool_bytes = 4 << 20, .ring_entries = 8,
  };
  struct pdio_image img;
  struct mem_disk disk = {
    .size = MEM_SIZE, .align = align, .mem_align = 512,
    .short_every = 3, .eagain_every = 7, .eio_every = eio_every,
  };
  struct pdio_thread *t;
  struct run run;
  uint64_t i;

  /* A block device as far as the engine knows (no file checks, no tail),
   * whose I/O goes to the memory disk.
   */
  memset (&img, 0, sizeof img);
  img.file = (char *) "memdisk";
  img.fd = img.tail_fd = -1;
  img.geo = (struct geometry) {
    .size = MEM_SIZE, .offset_align = align, .read_align = align,
    .mem_align = 512, .fs_block = align, .blockdev = true,
  };
  img.size = MEM_SIZE;
  img.bounce_cap = BOUNCE_CAP;
  img.zero_mem = mmap (NULL, ZERO_LEN + PDIO_PAGE_SIZE, PROT_READ,
                       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  CHECK (img.zero_mem != MAP_FAILED, "mmap");
  range_lock_init (&img.lock);
  disk.data = malloc (MEM_SIZE);
  CHECK (disk.data, "out of memory");

  CHECK (pdio_thread_new (&img, &cfg, &t) == 0, "pdio_thread_new");
  thread_set_backend (t, &mem_backend, &disk);
  run_init (&run, t, MEM_SIZE);
  for (i = 0; i < MEM_SIZE; i++)
    run.shadow[i] = disk.data[i] = unit_rand (&seed);
  run.allow_eio = eio_every != 0;
  /* After a failed write the disk holds part of it: no exact shadow. */
  run.check_reads = eio_every == 0;
  random_ops (&run, 2000, false);

  printf ("  memory disk align %u: %u requests, %lu transfers, %u reads "
          "checked, %u EIO; short every 3, EAGAIN every 7%s\n", align,
          run.submitted, disk.transfers, run.reads_checked, run.eio,
          eio_every ? ", EIO injected" : "");
  CHECK (disk.violations == 0, "O_DIRECT rules broken %lu times",
         disk.violations);
  CHECK (atomic_load (&img.stats.io.short_io) > 0, "no short transfer seen");
  if (eio_every)
    CHECK (run.eio > 0, "no EIO reached a client");
  else {
    CHECK (memcmp (disk.data, run.shadow, MEM_SIZE) == 0,
           "the memory disk differs from the shadow");
    CHECK (run.reads_checked > 100, "too few reads checked");
  }
  /* Everything given back, whatever failed. */
  CHECK (img.lock.held == NULL && img.lock.waiters == NULL,
         "a range is still locked");
  CHECK (t->pool.bounce.free_pages == t->pool.bounce.npages &&
         t->pool.bufs.free_pages == t->pool.bufs.npages,
         "pool memory not given back");
  CHECK (t->requests == 0, "%u requests still counted", t->requests);

  pdio_thread_free (t);
  run_free (&run);
  range_lock_destroy (&img.lock);
  munmap (img.zero_mem, ZERO_LEN + PDIO_PAGE_SIZE);
  free (disk.data);
}

/* ---- extents off the worker, and a ring that refuses submissions ------- */

struct slot_count {
  unsigned done;
};

static void
count_done (struct pdio_req *r, int err)
{
  struct slot_count *c = r->opaque;

  CHECK (err == 0, "request: %s", strerror (-err));
  c->done++;
}

struct ext_ctx {
  struct req_done d;            /* first: done() is req_done */
  pthread_t owner;
  uint64_t next;                /* where the next extent must start */
  unsigned n, data;
};

static int
ext_add (void *opaque, uint64_t off, uint64_t len, bool hole)
{
  struct ext_ctx *x = opaque;

  CHECK (pthread_equal (pthread_self (), x->owner),
         "an extent was reported on another thread");
  CHECK (off == x->next && len > 0, "extent %" PRIu64 "+%" PRIu64
         ", expected it at %" PRIu64, off, len, x->next);
  x->next = off + len;
  x->n++;
  x->data += !hole;
  return 0;
}

/* EXTENTS is a request like the others: its lseeks run on the engine's
 * helper thread, its extents are reported from poll on the submitting
 * thread, in order and covering the range, over several helper trips
 * (more extents than one batch holds), while reads submitted after it on
 * the same thread complete meanwhile.
 */
static void
test_extents_async (void)
{
  char path[4200];
  const uint64_t size = 4 << 20;
  struct pdio_image *img;
  struct pdio_thread *t;
  struct pdio_stats st0, st1;
  struct pdio_req er, rr[8];
  struct ext_ctx x = { .owner = pthread_self () };
  struct slot_count reads = { 0 };
  unsigned char *buf = aligned_alloc (4096, 8 * 4096);
  unsigned i;
  int fd;

  snprintf (path, sizeof path, "%s/extents.img", dir);
  fd = open (path, O_RDWR | O_CREAT | O_TRUNC, 0600);
  CHECK (fd >= 0 && ftruncate (fd, size) == 0, "%s: %m", path);
  memset (buf, 1, 4096);
  /* 3 * EXT_BATCH data extents, a hole after each. */
  for (i = 0; i < 3 * EXT_BATCH; i++)
    CHECK (pwrite (fd, buf, 4096, (uint64_t) i * 16384) == 4096, "pwrite");
  close (fd);
  img = open_image (path, PDIO_BACKEND_DEFAULT, 0);
  CHECK (pdio_thread_new (img, NULL, &t) == 0, "pdio_thread_new");
  pdio_get_stats (img, &st0);

  er = (struct pdio_req) { .op = PDIO_OP_EXTENTS, .offset = 0,
                           .count = size, .extent = ext_add, .opaque = &x,
                           .done = req_done };
  pdio_submit (t, &er);
  CHECK (x.n == 0 && !x.d.done, "extents reported from inside pdio_submit");
  for (i = 0; i < 8; i++) {
    rr[i] = (struct pdio_req) { .op = PDIO_OP_READ, .offset = i * 16384,
                                .count = 4096, .buf = buf + i * 4096,
                                .done = count_done, .opaque = &reads };
    pdio_submit (t, &rr[i]);
  }
  while (!x.d.done || reads.done < 8) {
    int n = pdio_thread_poll (t, 1, NULL);

    CHECK (n >= 0, "poll: %s", strerror (-n));
  }
  CHECK (x.d.err == 0, "extents: %s", strerror (-x.d.err));
  CHECK (x.next == size, "the extents end at %" PRIu64, x.next);
  CHECK (x.data == 3 * EXT_BATCH && x.n == 6 * EXT_BATCH,
         "%u extents, %u of data", x.n, x.data);
  pdio_get_stats (img, &st1);
  CHECK (st1.helper_calls - st0.helper_calls >= 6,
         "only %" PRIu64 " helper-thread calls for %u extents",
         st1.helper_calls - st0.helper_calls, x.n);

  /* REQ_ONE: one extent, one call. */
  x = (struct ext_ctx) { .owner = pthread_self () };
  er = (struct pdio_req) { .op = PDIO_OP_EXTENTS, .flags = PDIO_REQ_ONE,
                           .offset = 4096, .count = size - 4096,
                           .extent = ext_add, .opaque = &x, .done = req_done };
  x.next = 4096;
  pdio_submit (t, &er);
  req_wait (t, &x.d);
  CHECK (x.d.err == 0 && x.n == 1 && x.data == 0 && x.next == 16384,
         "REQ_ONE: %u extents to %" PRIu64, x.n, x.next);
  pdio_thread_free (t);
  pdio_close (img);
  unlink (path);
  free (buf);
}

/* The kernel refuses submissions (EBUSY) while its CQ is full, until
 * completions are reaped: with a 4-entry ring and many requests, every
 * SQE wanted finds the SQ full; each submit fails until pdio_thread_sqe
 * reaps.  Every request still completes once, with the right data.
 */
static void
test_full_ring (void)
{
  char path[4200];
  const unsigned n = 64;
  struct pdio_image *img;
  struct pdio_thread *t;
  struct pdio_req rr[64];
  struct slot_count reads = { 0 };
  unsigned char *buf = aligned_alloc (4096, 64 * 4096);
  unsigned char *want = malloc (64 * 4096);
  unsigned i;
  int fd;

  snprintf (path, sizeof path, "%s/ring.img", dir);
  for (i = 0; i < 64 * 4096; i++)
    want[i] = (unsigned char) unit_rand (&seed);
  fd = open (path, O_RDWR | O_CREAT | O_TRUNC, 0600);
  CHECK (fd >= 0 && pwrite (fd, want, 64 * 4096, 0) == 64 * 4096, "%m");
  close (fd);
  img = open_image (path, PDIO_BACKEND_URING, 0);
  CHECK (pdio_thread_new (img, &(struct pdio_thread_config) {
                            .ring_entries = 4 }, &t) == 0, "thread");
  thread_fault_busy (t, 1000);
  memset (buf, 0, 64 * 4096);
  for (i = 0; i < n; i++) {
    rr[i] = (struct pdio_req) { .op = PDIO_OP_READ,
                                .offset = (uint64_t) (n - 1 - i) * 4096,
                                .count = 4096, .buf = buf + i * 4096,
                                .done = count_done, .opaque = &reads };
    pdio_submit (t, &rr[i]);
    if (i % 16 == 15)
      CHECK (pdio_thread_poll (t, 0, NULL) >= 0, "poll");
  }
  while (reads.done < n)
    CHECK (pdio_thread_poll (t, 1, NULL) >= 0, "poll");
  for (i = 0; i < n; i++)
    CHECK (memcmp (buf + i * 4096, want + (n - 1 - i) * 4096, 4096) == 0,
           "read %u got the wrong data", i);
  CHECK (t->fault_busy < 1000, "the SQ never filled: nothing tested");
  pdio_thread_free (t);
  pdio_close (img);
  unlink (path);
  free (buf);
  free (want);
}

/* ---- a write that comes in pieces ----------------------------------------- */

/* PDIO_OP_LOCK holds a write's range from its done(0) until pdio_unlock:
 * a PDIO_HELD write inside it goes at once, an ordinary write that
 * overlaps it waits for the unlock (and so lands after the pieces); a
 * lock past the end fails as a write would, holding nothing.
 */
static void
test_lock_held (enum pdio_backend backend)
{
  char path[4200];
  const size_t size = 64 << 10;
  struct pdio_image *img;
  struct pdio_thread *t;
  struct pdio_req lock, piece, plain, bad;
  struct req_done dl = { 0 }, dp = { 0 }, dw = { 0 }, db = { 0 };
  unsigned char *want = malloc (size), *got = aligned_alloc (4096, size);
  unsigned char *a = malloc (4096), *b = malloc (8000);
  int fd;

  snprintf (path, sizeof path, "%s/lock.img", dir);
  for (size_t i = 0; i < size; i++)
    want[i] = (unsigned char) unit_rand (&seed);
  fd = open (path, O_RDWR | O_CREAT | O_TRUNC, 0600);
  CHECK (fd >= 0 && pwrite (fd, want, size, 0) == (ssize_t) size, "%m");
  close (fd);
  img = open_image (path, backend, 0);
  CHECK (pdio_thread_new (img, &(struct pdio_thread_config) { 0 }, &t) == 0,
         "thread");
  memset (a, 'A', 4096);
  memset (b, 'B', 8000);

  lock = (struct pdio_req) { .op = PDIO_OP_LOCK, .offset = 4196,
                             .count = 8000, .done = req_done,
                             .opaque = &dl };
  pdio_submit (t, &lock);
  CHECK (!dl.done, "a lock's done() ran inside pdio_submit");
  req_wait (t, &dl);
  CHECK (dl.err == 0, "lock: %s", strerror (-dl.err));

  plain = (struct pdio_req) { .op = PDIO_OP_WRITE, .offset = 8192,
                              .count = 4096, .buf = a, .done = req_done,
                              .opaque = &dw };
  pdio_submit (t, &plain);
  /* Queued behind the lock (a timing-free check: it is not merely slow). */
  CHECK (req_waits_remote (&plain),
         "a write overlapping a held range did not wait for it");
  piece = (struct pdio_req) { .op = PDIO_OP_WRITE, .flags = PDIO_HELD,
                              .offset = 4196, .count = 8000, .buf = b,
                              .done = req_done, .opaque = &dp };
  pdio_submit (t, &piece);
  req_wait (t, &dp);
  CHECK (dp.err == 0, "held write: %s", strerror (-dp.err));
  for (int i = 0; i < 20; i++)
    CHECK (pdio_thread_poll (t, 0, NULL) >= 0, "poll");
  CHECK (!dw.done && req_waits_remote (&plain),
         "a write overlapping a held range went before the unlock");
  pdio_unlock (t, &lock);
  req_wait (t, &dw);
  CHECK (dw.err == 0, "write after the unlock: %s", strerror (-dw.err));
  memcpy (want + 4196, b, 8000);
  memcpy (want + 8192, a, 4096);
  CHECK (pdio_read (t, got, size, 0) == 0, "read back");
  CHECK (memcmp (got, want, size) == 0,
         "the pieces and the later write did not land in that order");

  bad = (struct pdio_req) { .op = PDIO_OP_LOCK, .offset = size - 100,
                            .count = 200, .done = req_done, .opaque = &db };
  pdio_submit (t, &bad);
  req_wait (t, &db);
  CHECK (db.err == -ENOSPC, "a lock past the end: %s, want ENOSPC",
         strerror (-db.err));
  /* Nothing is held: a write of the same range goes at once. */
  CHECK (pdio_write (t, a, 100, size - 100, 0) == 0, "write after it");

  pdio_thread_free (t);
  pdio_close (img);
  unlink (path);
  free (want);
  free (got);
  free (a);
  free (b);
}

int
main (void)
{
  const char *base = getenv ("TESTS_BUILDDIR");
  const char *s = getenv ("PDIO_TEST_SEED");

  seed = s ? strtoull (s, NULL, 0) : (uint64_t) time (NULL) * 2654435761u;
  printf ("seed %" PRIu64 " (PDIO_TEST_SEED to repeat)\n", seed);
  seed |= 1;
  snprintf (dir, sizeof dir, "%s/tmp-async-XXXXXX", base ? base : ".");
  CHECK (mkdtemp (dir), "mkdtemp %s: %m", dir);

  /* engine/test_async_tsan: the parts where threads meet (range lock grants
   * across rings, remote work, eventfd wakeups), under ThreadSanitizer.
   */
  if (THREADS_ONLY) {
    test_threads (PDIO_BACKEND_DEFAULT, 0);
    test_threads (PDIO_BACKEND_PSYNC, 4096);
    test_mem_disk (512, 0);
    rmdir (dir);
    printf ("ok\n");
    return 0;
  }
  test_mem_disk (512, 0);
  test_mem_disk (4096, 0);
  test_mem_disk (512, 11);
  test_zero_copy ();
  test_extents_async ();
  test_full_ring ();
  test_lock_held (PDIO_BACKEND_DEFAULT);
  test_lock_held (PDIO_BACKEND_PSYNC);
  test_backpressure (PDIO_BACKEND_DEFAULT);
  test_backpressure (PDIO_BACKEND_PSYNC);
  test_threads (PDIO_BACKEND_DEFAULT, 0);
  test_threads (PDIO_BACKEND_PSYNC, 4096);
  test_file (PDIO_BACKEND_DEFAULT, 0, (8 << 20) + 1234);
  test_file (PDIO_BACKEND_DEFAULT, 4096, 8 << 20);
  test_file (PDIO_BACKEND_PSYNC, 0, (8 << 20) + 1234);
  test_file (PDIO_BACKEND_PSYNC, 4096, (8 << 20) + 512);
  rmdir (dir);
  printf ("ok\n");
  return 0;
}
