/* SPDX-License-Identifier: BSD-3-Clause */
/* The engine under concurrency, built with ThreadSanitizer (the engine's
 * sources are compiled into this program with -fsanitize=thread; see the
 * robust block of tests/Makefile.am).
 *
 * Every public call the plugin makes from nbdkit's worker threads runs at
 * once on one shared image, with both backends:
 *   - writers own interleaved 61-byte stripes, so every 512/4096-byte
 *     block is shared by several of them and each write is a read-modify-
 *     write racing its neighbours' (the range lock must serialise them);
 *     some with FUA; each writer reads its own bytes back as it goes;
 *   - zero (with and without may-trim) and trim on a region each writer
 *     owns, and writes into the image's unaligned tail (the buffered
 *     descriptor path), owned by one thread;
 *   - flushes, extents, pdio_get_stats/pdio_get_info from a monitor thread;
 *   - threads come and go in waves, so per-thread contexts (rings, bounce
 *     arenas) are created and destroyed while others do I/O.
 * At the end the file is compared with the shadow each writer kept.
 *
 * Exit codes: 0 pass, 1 a wrong byte, 66 a TSan report (tsan_options.c:
 * halt_on_error=1).  io_uring's kernel-side
 * writes into buffers are invisible to TSan; that is fine, the kernel is
 * not what is tested here.
 */
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine.h"
#include "unit.h"

#define WRITERS 6
#define STRIPE 61
#define SHARED_SIZE (192 << 10)         /* striped among the writers */
#define OWN_SIZE (64 << 10)             /* each writer's zero/trim region */
#define OWN_BASE SHARED_SIZE
#define TAIL_BASE (OWN_BASE + WRITERS * OWN_SIZE)
#define TAIL_EXTRA 1234                 /* unaligned tail */
#define IMAGE_SIZE (TAIL_BASE + 8192 + TAIL_EXTRA)
#define ROUNDS 300
#define WAVES 3

static unsigned char shadow[IMAGE_SIZE];
static atomic_bool stop_monitor;

static void
quiet (const char *fmt, va_list args)
{
  (void) fmt; (void) args;
}

struct arg {
  struct pdio_image *img;
  unsigned id, wave;
};

/* Each thread's own engine context (bounce region only: one request at a
 * time, like the nbdkit plugin).
 */
static struct pdio_thread *
new_thread (struct pdio_image *img)
{
  const struct pdio_thread_config cfg = {
    .pool_bytes = PDIO_POOL_BOUNCE_ONLY, .ring_entries = 8,
  };
  struct pdio_thread *t;

  CHECK (pdio_thread_new (img, &cfg, &t) == 0, "pdio_thread_new");
  return t;
}

/* Byte p of the shared area belongs to writer (p / STRIPE) % WRITERS. */
static void *
writer (void *p)
{
  struct arg *a = p;
  struct pdio_thread *t = new_thread (a->img);
  uint64_t s = 0x9e3779b97f4a7c15ULL * (a->id + 1) + a->wave;
  unsigned char buf[STRIPE + 32], back[STRIPE + 32];
  unsigned char big[8192 + 64];
  const uint64_t own = OWN_BASE + (uint64_t) a->id * OWN_SIZE;

  for (int i = 0; i < ROUNDS; i++) {
    /* A piece of one of my stripes, at a random buffer alignment. */
    uint64_t nstripes = SHARED_SIZE / STRIPE / WRITERS;
    uint64_t stripe = (unit_rand (&s) % nstripes) * WRITERS + a->id;
    uint64_t off = stripe * STRIPE + unit_rand (&s) % 8;
    size_t len = 1 + unit_rand (&s) % (STRIPE - 8);
    unsigned char *b = buf + unit_rand (&s) % 32;
    unsigned flags = unit_rand (&s) % 8 == 0 ? PDIO_FUA : 0;

    for (size_t k = 0; k < len; k++)
      b[k] = unit_rand (&s);
    CHECK (pdio_write (t, b, len, off, flags) == 0, "write");
    memcpy (shadow + off, b, len);         /* my bytes only */
    CHECK (pdio_read (t, back, len, off) == 0, "read");
    CHECK (memcmp (back, b, len) == 0, "writer %u lost its write of %zu"
           " bytes at %" PRIu64 " (a racing read-modify-write?)", a->id,
           len, off);

    /* My own region: writes, zeroes, trims. */
    uint64_t o2 = own + unit_rand (&s) % (OWN_SIZE - 8192);
    size_t l2 = 1 + unit_rand (&s) % 8192;
    switch (unit_rand (&s) % 4) {
    case 0: case 1: {
      unsigned char *bb = big + unit_rand (&s) % 64;
      for (size_t k = 0; k < l2; k++)
        bb[k] = unit_rand (&s);
      CHECK (pdio_write (t, bb, l2, o2, flags) == 0, "own write");
      memcpy (shadow + o2, bb, l2);
      break;
    }
    case 2:
      CHECK (pdio_zero (t, l2, o2,
                        (unit_rand (&s) % 2 ? PDIO_MAY_TRIM : 0) | flags) == 0,
             "zero");
      memset (shadow + o2, 0, l2);
      break;
    case 3: {
      /* Trimmed bytes read back as old or zero: settle them by reading. */
      CHECK (pdio_trim (t, l2, o2, flags) == 0, "trim");
      CHECK (pdio_read (t, big, l2, o2) == 0, "read after trim");
      for (size_t k = 0; k < l2; k++)
        CHECK (big[k] == 0 || big[k] == shadow[o2 + k], "trim made up"
               " byte %" PRIu64, o2 + k);
      memcpy (shadow + o2, big, l2);
      break;
    }
    }

    /* Writer 0 also owns the tail (buffered path, page-wide lock). */
    if (a->id == 0 && i % 10 == 0) {
      uint64_t o3 = TAIL_BASE + unit_rand (&s) % (IMAGE_SIZE - TAIL_BASE);
      size_t l3 = 1 + unit_rand (&s) % (IMAGE_SIZE - o3);
      if (l3 > 4096)
        l3 = 4096;
      for (size_t k = 0; k < l3; k++)
        big[k] = unit_rand (&s);
      CHECK (pdio_write (t, big, l3, o3, flags) == 0, "tail write");
      memcpy (shadow + o3, big, l3);
    }
  }
  pdio_thread_free (t);
  return NULL;
}

static int
count_extent (void *opaque, uint64_t offset, uint64_t length, bool hole)
{
  (void) offset; (void) length; (void) hole;
  ++*(unsigned long *) opaque;
  return 0;
}

static void *
monitor (void *p)
{
  struct pdio_image *img = p;
  struct pdio_thread *t = new_thread (img);
  unsigned long n = 0, extents = 0;
  unsigned char buf[4096];

  while (!atomic_load (&stop_monitor)) {
    struct pdio_stats st;
    struct pdio_info info;
    char line[512];

    pdio_get_stats (img, &st);
    pdio_format_stats (&st, line, sizeof line);
    pdio_get_info (img, &info);
    CHECK (pdio_flush (t) == 0, "flush");
    CHECK (pdio_extents (img, IMAGE_SIZE, 0, false, count_extent,
                         &extents) == 0, "extents");
    /* Reads racing the writers: any value is allowed, no lock taken. */
    CHECK (pdio_read (t, buf, sizeof buf, (n * 4093) % (IMAGE_SIZE - 4096))
           == 0, "racing read");
    n++;
  }
  printf ("monitor: %lu rounds of stats, flush, extents and racing reads\n",
          n);
  pdio_thread_free (t);
  return NULL;
}

static void
run (const char *path, enum pdio_backend backend, uint32_t align)
{
  const struct pdio_config cfg = {
    .file = path, .backend = backend, .align = align,
    .log = { quiet, quiet, NULL },
  };
  struct pdio_image *img;
  struct arg args[WRITERS];
  pthread_t t[WRITERS], mon;
  unsigned char *disk = malloc (IMAGE_SIZE);
  int fd;

  fd = open (path, O_RDWR | O_CREAT | O_TRUNC, 0644);
  CHECK (fd >= 0 && ftruncate (fd, IMAGE_SIZE) == 0, "create %s: %m", path);
  close (fd);
  memset (shadow, 0, sizeof shadow);
  CHECK (pdio_open (&cfg, &img) == 0, "pdio_open %s", path);
  atomic_store (&stop_monitor, false);
  CHECK (pthread_create (&mon, NULL, monitor, img) == 0, "pthread_create");
  for (unsigned w = 0; w < WAVES; w++) {
    for (unsigned i = 0; i < WRITERS; i++) {
      args[i] = (struct arg) { img, i, w };
      CHECK (pthread_create (&t[i], NULL, writer, &args[i]) == 0,
             "pthread_create");
    }
    for (unsigned i = 0; i < WRITERS; i++)
      pthread_join (t[i], NULL);
  }
  atomic_store (&stop_monitor, true);
  pthread_join (mon, NULL);
  {
    struct pdio_stats st;
    char line[512];
    pdio_get_stats (img, &st);
    pdio_format_stats (&st, line, sizeof line);
    printf ("%s align=%u: %s\n", backend == PDIO_BACKEND_PSYNC ? "psync"
            : "io_uring", align, line);
  }
  pdio_close (img);

  fd = open (path, O_RDONLY);
  CHECK (fd >= 0 && pread (fd, disk, IMAGE_SIZE, 0) == IMAGE_SIZE, "read");
  close (fd);
  for (size_t p = 0; p < IMAGE_SIZE; p++)
    CHECK (disk[p] == shadow[p], "byte %zu is %#x, the shadow says %#x", p,
           disk[p], shadow[p]);
  unlink (path);
  free (disk);
}

int
main (void)
{
  const char *parent = getenv ("PDIO_TEST_TMPDIR");
  char path[4096];

  snprintf (path, sizeof path, "%s/pdio-tsan.%d.img",
            parent ? parent : "/var/tmp", (int) getpid ());
  run (path, PDIO_BACKEND_URING, 0);
  run (path, PDIO_BACKEND_PSYNC, 4096);
  run (path, PDIO_BACKEND_URING, 4096);
  printf ("no data race reported, every byte matches\n");
  return 0;
}
