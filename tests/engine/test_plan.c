/* SPDX-License-Identifier: BSD-3-Clause */
/* The block-mapping planner and its executor, exhaustively over small
 * geometries: alignments 512 and 4096, memory alignment as strict as the
 * offset alignment or as loose as 4 bytes (where the direct middle is
 * used), odd offsets and lengths, buffers at every offset within a page
 * (every byte of the first 64, then every 16th), a bounce cap small enough
 * to force chunking, and injected short transfers and EAGAIN.
 *
 * Two checks per case:
 * - the plan's invariants: every client byte is covered exactly once, by
 *   the client's own memory or by a copy; every direct segment is aligned
 *   in file offset, length and memory; every bounce byte a write sends to
 *   the disk is either a client byte or was read back first (RMW);
 * - the executor against a reference model on a memory disk that enforces
 *   the kernel's O_DIRECT rules: what a read returns and what a write
 *   leaves on the disk equal a plain memcpy, bytes past end of file read as
 *   zero, and nothing outside the client's buffer is touched.
 */
#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "engine_internal.h"
#include "mem_backend.h"
#include "pagesize.h"
#include "plan.h"
#include "plan_check.h"
#include "unit.h"

#define DISK_SIZE ((size_t) 96 << 10)
#define GUARD 4096
#define CANARY 0xa5

struct geom {
  uint32_t align, mem_align;
  size_t cap;
};

static unsigned long cases, chunks_direct, chunks_bounced;

static void
check_chunk (const struct plan_request *req, const struct plan_limits *lim,
             const struct plan_chunk *c, unsigned char *covered,
             unsigned char *bounce_state)
{
  uint64_t pos = c->file_off;
  unsigned s, i;
  size_t b;

  CHECK (c->file_off % lim->align == 0 && c->file_len % lim->align == 0 &&
         c->file_len > 0, "chunk [%" PRIu64 "+%zu] unaligned", c->file_off,
         c->file_len);
  CHECK (c->bounce_len <= lim->bounce_cap, "bounce %zu > cap", c->bounce_len);
  CHECK (c->file_off < req->offset + req->count &&
         c->file_off + c->file_len > req->offset, "chunk outside request");

  /* Bounce bytes: 0 unused, 1 filled by the client, 2 read back (RMW). */
  memset (bounce_state, 0, c->bounce_len);
  for (s = 0; s < c->nseg; s++) {
    const struct plan_seg *seg = &c->seg[s];

    CHECK (seg->len > 0 && seg->len % lim->align == 0, "seg len %zu",
           seg->len);
    if (seg->mem == PLAN_MEM_USER) {
      CHECK ((req->buf + seg->mem_off) % lim->mem_align == 0,
             "user seg memory unaligned");
      CHECK (seg->mem_off + seg->len <= req->count, "user seg overruns");
      CHECK (pos == req->offset + seg->mem_off, "user seg misplaced");
      for (b = 0; b < seg->len; b++)
        covered[seg->mem_off + b]++;
    }
    else {
      CHECK (seg->mem_off % PDIO_PAGE_SIZE % lim->mem_align == 0,
             "bounce seg unaligned");
      CHECK (seg->mem_off + seg->len <= c->bounce_len, "bounce overrun");
    }
    pos += seg->len;
  }
  CHECK (pos == c->file_off + c->file_len, "segs do not cover the chunk");

  for (i = 0; i < c->ncopy; i++) {
    const struct plan_copy *cp = &c->copy[i];

    CHECK (cp->user_off + cp->len <= req->count, "copy overruns client");
    CHECK (cp->bounce_off + cp->len <= c->bounce_len, "copy overruns bounce");
    CHECK (bounce_file_off (c, cp->bounce_off) ==
           req->offset + cp->user_off, "copy misplaced");
    CHECK (bounce_file_off (c, cp->bounce_off + cp->len - 1) ==
           req->offset + cp->user_off + cp->len - 1, "copy spans segments");
    for (b = 0; b < cp->len; b++) {
      covered[cp->user_off + b]++;
      bounce_state[cp->bounce_off + b] = 1;
    }
  }

  CHECK (c->nrmw == 0 || req->write, "RMW planned for a read");
  for (i = 0; i < c->nrmw; i++) {
    const struct plan_rmw *rm = &c->rmw[i];

    CHECK (rm->file_off % lim->align == 0, "rmw unaligned");
    CHECK (bounce_file_off (c, rm->bounce_off) == rm->file_off &&
           bounce_file_off (c, rm->bounce_off + lim->align - 1) ==
           rm->file_off + lim->align - 1, "rmw block misplaced");
    for (b = 0; b < lim->align; b++)
      if (bounce_state[rm->bounce_off + b] == 0)
        bounce_state[rm->bounce_off + b] = 2;
  }
  if (req->write)
    for (s = 0; s < c->nseg; s++)
      if (c->seg[s].mem == PLAN_MEM_BOUNCE)
        for (b = 0; b < c->seg[s].len; b++)
          CHECK (bounce_state[c->seg[s].mem_off + b] != 0,
                 "write sends bounce byte %zu that nobody filled",
                 c->seg[s].mem_off + b);
}

static void
check_plan (const struct plan_request *req, const struct plan_limits *lim)
{
  static unsigned char covered[DISK_SIZE], bounce_state[BOUNCE_CAP];
  struct plan_chunk c;
  size_t done, b;

  memset (covered, 0, req->count);
  for (done = 0; done < req->count; done = c.next) {
    plan_chunk (req, lim, done, &c);
    CHECK (c.next > done && c.next <= req->count, "no progress");
    check_chunk (req, lim, &c, covered, bounce_state);
    if (c.direct)
      chunks_direct++;
    else
      chunks_bounced++;
  }
  for (b = 0; b < req->count; b++)
    CHECK (covered[b] == 1, "client byte %zu covered %u times", b,
           covered[b]);
}

struct sim {
  struct pdio_image img;
  struct pdio_thread *t;
  struct mem_disk disk;
  unsigned char *ref;
  unsigned char *pool;          /* random bytes that writes copy from */
  unsigned char *user_area;     /* GUARD + buffer + GUARD */
  uint64_t seed;
};

static void
sim_init (struct sim *sim, const struct geom *g)
{
  size_t i;

  memset (sim, 0, sizeof *sim);
  sim->img.geo.offset_align = sim->img.geo.read_align = g->align;
  sim->img.geo.mem_align = g->mem_align;
  sim->img.geo.size = sim->img.size = DISK_SIZE;
  sim->img.bounce_cap = g->cap;
  sim->disk.data = malloc (DISK_SIZE);
  sim->ref = malloc (DISK_SIZE);
  sim->pool = malloc (2 * DISK_SIZE);
  sim->disk.size = DISK_SIZE;
  sim->disk.align = g->align;
  sim->disk.mem_align = g->mem_align;
  sim->img.fd = sim->img.tail_fd = -1;
  range_lock_init (&sim->img.lock);
  /* A thread with only the bounce region, its I/O on the memory disk. */
  {
    const struct pdio_thread_config cfg = {
      .pool_bytes = PDIO_POOL_BOUNCE_ONLY, .ring_entries = 4,
    };
    CHECK (pdio_thread_new (&sim->img, &cfg, &sim->t) == 0, "thread");
    thread_set_backend (sim->t, &mem_backend, &sim->disk);
  }
  sim->user_area = mmap (NULL, DISK_SIZE + 4 * GUARD, PROT_READ | PROT_WRITE,
                         MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  CHECK (sim->disk.data && sim->ref && sim->pool &&
         sim->user_area != MAP_FAILED, "out of memory");
  sim->seed = 0x9e3779b97f4a7c15ULL ^ g->align ^ g->mem_align;
  for (i = 0; i < DISK_SIZE; i++)
    sim->disk.data[i] = unit_rand (&sim->seed);
  for (i = 0; i < 2 * DISK_SIZE; i++)
    sim->pool[i] = unit_rand (&sim->seed);
  memcpy (sim->ref, sim->disk.data, DISK_SIZE);
}

static void
sim_free (struct sim *sim)
{
  pdio_thread_free (sim->t);
  range_lock_destroy (&sim->img.lock);
  munmap (sim->user_area, DISK_SIZE + 4 * GUARD);
  free (sim->disk.data);
  free (sim->ref);
  free (sim->pool);
}

/* One read or write through engine_rw_direct, checked against memcpy. */
static void
sim_run (struct sim *sim, bool write, uint64_t offset, size_t count,
         size_t page_off, size_t eof)
{
  unsigned char *buf = sim->user_area + GUARD + page_off;
  size_t i;
  int r;

  /* Guards around the buffer, and a canary in stale bounce memory. */
  memset (sim->user_area, 0x3c, GUARD + page_off + count + GUARD);
  memset (sim->t->pool.mem, CANARY, sim->t->pool.size);
  sim->disk.size = eof;
  /* An image that ends there, not one that shrank (which must be an
   * error).
   */
  sim->img.geo.size = sim->img.size = eof;

  if (write) {
    memcpy (buf, sim->pool + unit_rand (&sim->seed) % DISK_SIZE, count);
    memcpy (sim->ref + offset, buf, count);
  }
  r = engine_rw_direct (sim->t, write, (char *) buf, count, offset);
  CHECK (r == 0, "%s %zu at %" PRIu64 " (buf +%zu): %s",
         write ? "write" : "read", count, offset, page_off, strerror (-r));
  CHECK (sim->disk.violations == 0, "O_DIRECT rule broken: %s %zu at %"
         PRIu64 " (buf +%zu, align %u, mem %u)", write ? "write" : "read",
         count, offset, page_off, sim->disk.align, sim->disk.mem_align);

  if (write)
    CHECK (memcmp (sim->disk.data, sim->ref, DISK_SIZE) == 0,
           "disk differs after write %zu at %" PRIu64 " (buf +%zu)", count,
           offset, page_off);
  else {
    size_t valid = offset >= eof ? 0 : eof - offset < count ? eof - offset
                                                             : count;

    CHECK (memcmp (buf, sim->ref + offset, valid) == 0, "read %zu at %"
           PRIu64 " (buf +%zu, eof %zu) differs", count, offset, page_off,
           eof);
    for (i = valid; i < count; i++)
      CHECK (buf[i] == 0, "read %zu at %" PRIu64 " (buf +%zu, eof %zu): "
             "byte %zu past end of file is %#x", count, offset, page_off,
             eof, i, buf[i]);
  }
  for (i = 0; i < GUARD + page_off; i++)
    CHECK (sim->user_area[i] == 0x3c, "wrote before the buffer");
  for (i = GUARD + page_off + count; i < 2 * GUARD + page_off + count; i++)
    CHECK (sim->user_area[i] == 0x3c, "wrote after the buffer");
  cases++;
}

static void
run_geometry (const struct geom *g, unsigned short_every,
              unsigned eagain_every, size_t page_step)
{
  const uint64_t a = g->align;
  const uint64_t offsets[] = {
    0, 1, 2, a / 2, a - 1, a, a + 1, 2 * a - 1, 2 * a, 2 * a + 1, 3 * a - 7,
  };
  const size_t lengths[] = {
    1, 2, a - 1, a, a + 1, 2 * a - 1, 2 * a, 2 * a + 1, 3 * a, 4 * a + 3,
    g->cap - 1, g->cap, g->cap + 1, 2 * g->cap + a + 5,
  };
  struct sim sim;
  size_t o, l, p;
  int w;

  sim_init (&sim, g);
  sim.disk.short_every = short_every;
  sim.disk.eagain_every = eagain_every;
  for (o = 0; o < sizeof offsets / sizeof offsets[0]; o++)
    for (l = 0; l < sizeof lengths / sizeof lengths[0]; l++)
      for (p = 0; p < PDIO_PAGE_SIZE; p += p < 64 ? 1 : page_step) {
        const struct plan_limits lim = { g->align, g->mem_align, g->cap };
        uint64_t off = offsets[o];
        size_t len = lengths[l];

        CHECK (off + len <= DISK_SIZE, "test case does not fit");
        for (w = 0; w < 2; w++) {
          const struct plan_request req = {
            .write = w, .offset = off, .count = len,
            .buf = (uintptr_t) sim.user_area + GUARD + p,
          };
          check_plan (&req, &lim);
          sim_run (&sim, w, off, len, p, DISK_SIZE);
        }
        /* A read running into an end of file that is not aligned. */
        sim_run (&sim, false, off, len, p, off + len / 2 + 1);
      }
  sim_free (&sim);
}

/* The sanitizer build checks memory safety, not coverage: it walks fewer
 * buffer offsets to stay quick.
 */
#ifdef PDIO_UNIT_SANITIZED
#define PAGE_STEP 64
#define INJECT_PAGE_STEP 512
#else
#define PAGE_STEP 16
#define INJECT_PAGE_STEP 256
#endif

int
main (void)
{
  const struct geom geoms[] = {
    { 512, 512, 4 * 512 },
    { 512, 4, 4 * 512 },
    { 4096, 512, 4 * 4096 },
    { 4096, 4, 4 * 4096 },
    { 4096, 4096, 2 * 4096 },
  };
  size_t i;

  for (i = 0; i < sizeof geoms / sizeof geoms[0]; i++) {
    run_geometry (&geoms[i], 0, 0, PAGE_STEP);
    run_geometry (&geoms[i], 3, 5, INJECT_PAGE_STEP);  /* short, EAGAIN */
  }
  printf ("%lu cases, %lu direct and %lu bounced chunks: all match the "
          "reference\n", cases, chunks_direct, chunks_bounced);
  CHECK (chunks_direct > 0 && chunks_bounced > 0, "a path went untested");
  return 0;
}
