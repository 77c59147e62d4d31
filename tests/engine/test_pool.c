/* SPDX-License-Identifier: BSD-3-Clause */
/* The per-thread pool (src/engine/pool.c) on its own, with a hook that
 * plays the ring's registration:
 * - blocks never merge past a chunk: the largest is 2 MiB, each at a
 *   chunk's start, and a region is cut to whole chunks;
 * - live first: memory of a live chunk is handed out before a chunk that
 *   was given back is made live again, and a light load stays in one
 *   chunk;
 * - the reserve: live, registered and locked (VmLck grows by the chunk
 *   and the pages of its bookkeeping, exactly), never given back, and
 *   allocations in it, after other chunks went back, take no page fault
 *   (getrusage); the bookkeeping of chunks given back goes back too
 *   (mincore);
 * - bounce memory prefers resident memory: its own region if live, else
 *   a live chunk of the buffer region, else its own region, else the
 *   buffer region's;
 * - random gets, puts and releases, the free lists checked after each
 *   step: every block smaller than a chunk lies in a live chunk, live
 *   chunks' whole blocks come first, no page is handed out twice, and
 *   the free count adds up.
 */
#include <config.h>

#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include "pagesize.h"
#include "pool.h"
#include "unit.h"

#define MiB ((size_t) 1 << 20)
#define MAX_CHUNKS 64
#define CHUNK_PAGES (POOL_CHUNK / PDIO_PAGE_SIZE)

static unsigned registered[MAX_CHUNKS], unregistered[MAX_CHUNKS];
static uint64_t seed;

/* The ring's part: count what would be registered and unregistered. */
static bool
hook (void *opaque, unsigned idx, void *mem, size_t len)
{
  (void) opaque;
  (void) len;
  CHECK (idx < MAX_CHUNKS, "chunk %u", idx);
  if (mem)
    registered[idx]++;
  else
    unregistered[idx]++;
  return mem != NULL;
}

static void
new_pool (struct pool *p, size_t buf_bytes)
{
  memset (registered, 0, sizeof registered);
  memset (unregistered, 0, sizeof unregistered);
  CHECK (pool_init (p, POOL_CHUNK, buf_bytes) == 0, "pool_init");
  CHECK (p->nchunks <= MAX_CHUNKS, "%u chunks", p->nchunks);
  p->hook = hook;
}

static unsigned
chunk_of (const struct pool *p, const void *m)
{
  return ((const char *) m - p->mem) / POOL_CHUNK;
}

static unsigned
live_chunks (const struct pool *p)
{
  unsigned n = 0;

  for (unsigned i = 0; i < p->nchunks; i++)
    n += p->chunk[i].live;
  return n;
}

/* The free lists of b: well linked, every block of an order below top
 * in a live chunk, the live chunks' whole blocks before the others, and
 * as many free pages as counted.
 */
static void
check_lists (const struct pool *p, const struct buddy *b)
{
  size_t free_pages = 0;

  for (unsigned o = 0; b->npages && o <= b->top; o++) {
    uint32_t pg = b->free_list[o], prev = UINT32_MAX;
    bool given_back_seen = false;

    while (pg != UINT32_MAX) {
      const struct buddy_node *n = o == b->top ? &b->top_node[pg >> b->top]
                                               : &b->node[pg];
      unsigned c = chunk_of (p, b->base + (size_t) pg * PDIO_PAGE_SIZE);

      CHECK (n->head == o + 1, "page %" PRIu32 " on list %u: head %u", pg, o,
             n->head);
      CHECK (n->prev == prev, "page %" PRIu32 ": prev %" PRIu32 ", want %"
             PRIu32, pg, n->prev, prev);
      CHECK (pg % (1u << o) == 0, "block %" PRIu32 " of order %u misaligned",
             pg, o);
      if (o < b->top)
        CHECK (p->chunk[c].live, "a free block of order %u in chunk %u, "
               "which is not live", o, c);
      else if (!p->chunk[c].live)
        given_back_seen = true;
      else
        CHECK (!given_back_seen, "live chunk %u behind one given back", c);
      free_pages += (size_t) 1 << o;
      prev = pg;
      pg = n->next;
    }
    if (o == b->top)
      CHECK (b->top_tail == prev, "top_tail %" PRIu32 ", last %" PRIu32,
             b->top_tail, prev);
  }
  CHECK (free_pages == b->free_pages, "%zu pages on the lists, %zu counted",
         free_pages, b->free_pages);
}

static void
check_pool (const struct pool *p)
{
  check_lists (p, &p->bounce);
  check_lists (p, &p->bufs);
}

static long
status_kib (const char *key)
{
  char line[256];
  size_t n = strlen (key);
  long v = -1;
  FILE *f = fopen ("/proc/self/status", "r");

  CHECK (f, "/proc/self/status");
  while (fgets (line, sizeof line, f))
    if (strncmp (line, key, n) == 0 && line[n] == ':')
      v = atol (line + n + 1);
  fclose (f);
  CHECK (v >= 0, "no %s in /proc/self/status", key);
  return v;
}

/* Resident pages of [mem, mem + len), page-aligned. */
static size_t
resident_pages (const void *mem, size_t len)
{
  unsigned char vec[1024];
  size_t n = len / PDIO_PAGE_SIZE, r = 0;

  CHECK (n <= sizeof vec, "%zu pages", n);
  CHECK (mincore ((void *) mem, len, vec) == 0, "mincore: %m");
  for (size_t i = 0; i < n; i++)
    r += vec[i] & 1;
  return r;
}

static void
faults (long *minflt, long *majflt)
{
  struct rusage ru;

  CHECK (getrusage (RUSAGE_THREAD, &ru) == 0, "getrusage: %m");
  *minflt = ru.ru_minflt;
  *majflt = ru.ru_majflt;
}

/* ---- blocks never merge past a chunk ------------------------------------- */

static void
test_cap (void)
{
  struct pool p;
  void *b[5];

  new_pool (&p, 8 * MiB);
  CHECK (pool_buf_max (&p) == POOL_CHUNK, "buf max %zu", pool_buf_max (&p));
  CHECK (pool_get_buf (&p, POOL_CHUNK + 1) == NULL, "a block over a chunk");
  CHECK (pool_get_buf (&p, 4 * MiB) == NULL, "a 4 MiB block");
  for (int i = 0; i < 4; i++) {
    b[i] = pool_get_buf (&p, POOL_CHUNK);
    CHECK (b[i] && ((char *) b[i] - p.mem) % POOL_CHUNK == 0,
           "2 MiB block %d not a whole chunk", i);
    CHECK (pool_buf_index (&p, b[i], POOL_CHUNK) == (int) chunk_of (&p, b[i]),
           "block %d is not registered buffer %u", i, chunk_of (&p, b[i]));
  }
  b[4] = pool_get_buf (&p, 4096);
  CHECK (b[4] == NULL, "a page beyond 8 MiB");
  check_pool (&p);
  for (int i = 0; i < 4; i++)
    pool_put (&p, b[i], POOL_CHUNK);
  check_pool (&p);
  /* 1,000 pages then given back: each chunk one block again. */
  {
    static void *pg[1000];

    for (int i = 0; i < 1000; i++)
      CHECK ((pg[i] = pool_get_buf (&p, 4096)) != NULL, "page %d", i);
    for (int i = 0; i < 1000; i++)
      pool_put (&p, pg[i], 4096);
    for (int i = 0; i < 4; i++)
      CHECK ((b[i] = pool_get_buf (&p, POOL_CHUNK)) != NULL,
             "chunk %d did not merge back", i);
    for (int i = 0; i < 4; i++)
      pool_put (&p, b[i], POOL_CHUNK);
  }
  pool_destroy (&p);

  /* The buffer region is whole chunks, or one smaller region. */
  new_pool (&p, 9 * MiB);
  CHECK (p.bufs.npages * PDIO_PAGE_SIZE == 8 * MiB,
         "9 MiB of buffers kept %zu pages", p.bufs.npages);
  pool_destroy (&p);
  new_pool (&p, 1 * MiB + 3 * PDIO_PAGE_SIZE);
  CHECK (pool_buf_max (&p) == 1 * MiB, "buf max %zu", pool_buf_max (&p));
  CHECK (p.bufs.free_pages == 256 + 3, "%zu pages", p.bufs.free_pages);
  pool_destroy (&p);
  printf ("  cap: blocks at most one chunk, 1,000 pages merged back into "
          "chunks\n");
}

/* ---- live first ------------------------------------------------------------ */

static void
test_live_first (void)
{
  struct pool p;
  void *b[3], *s, *m;
  size_t live;
  unsigned regs = 0;

  new_pool (&p, 8 * MiB);
  pool_release (&p, 100, 5);
  for (int i = 0; i < 3; i++)
    b[i] = pool_get_buf (&p, POOL_CHUNK);
  s = pool_get_buf (&p, 4096);
  CHECK (s && chunk_of (&p, s) == 4, "4 KiB in chunk %u", chunk_of (&p, s));
  for (int i = 0; i < 3; i++)
    pool_put (&p, b[i], POOL_CHUNK);
  CHECK (pool_release (&p, 103, 5) == 0, "gave back too soon");
  pool_put (&p, s, 4096);
  /* Chunks 1-3 idle for 6 s, chunk 4 for 3 s: only it stays. */
  CHECK (pool_release (&p, 106, 5) == 3 * POOL_CHUNK, "did not give back "
         "three chunks");
  CHECK (live_chunks (&p) == 1 && p.chunk[4].live, "chunk 4 is not the live "
         "one");
  check_pool (&p);
  live = p.live_bytes;
  for (unsigned i = 0; i < p.nchunks; i++)
    regs += registered[i];

  /* A whole chunk, then a page: both from chunk 4, nothing made live. */
  m = pool_get_buf (&p, POOL_CHUNK);
  CHECK (m && chunk_of (&p, m) == 4, "2 MiB from chunk %u, not the live 4",
         chunk_of (&p, m));
  pool_put (&p, m, POOL_CHUNK);
  m = pool_get_buf (&p, 4096);
  CHECK (m && chunk_of (&p, m) == 4, "4 KiB from chunk %u, not the live 4",
         chunk_of (&p, m));
  pool_put (&p, m, 4096);
  for (unsigned i = 0; i < p.nchunks; i++)
    regs -= registered[i];
  CHECK (regs == 0 && p.live_bytes == live, "a chunk was made live");
  check_pool (&p);

  /* The chunks given back come after it, in the order they went. */
  {
    const unsigned want[4] = { 4, 1, 2, 3 };
    void *whole[4];

    for (int i = 0; i < 4; i++) {
      whole[i] = pool_get_buf (&p, POOL_CHUNK);
      CHECK (whole[i] && chunk_of (&p, whole[i]) == want[i], "block %d from "
             "chunk %u, want %u", i, chunk_of (&p, whole[i]), want[i]);
    }
    for (int i = 0; i < 4; i++)
      pool_put (&p, whole[i], POOL_CHUNK);
  }
  pool_destroy (&p);

  /* A light load stays in one chunk. */
  new_pool (&p, 8 * MiB);
  {
    static void *held[64];
    static size_t len[64];

    for (int round = 0; round < 2000; round++) {
      int i = unit_rand (&seed) % 64;

      if (held[i])
        pool_put (&p, held[i], len[i]);
      len[i] = 1 + unit_rand (&seed) % (24 * 1024);
      held[i] = pool_get_buf (&p, len[i]);
      CHECK (held[i], "no room for %zu bytes", len[i]);
    }
    CHECK (live_chunks (&p) == 1, "64 buffers of up to 24 KiB made %u chunks "
           "live", live_chunks (&p));
    check_pool (&p);
    for (int i = 0; i < 64; i++)
      pool_put (&p, held[i], len[i]);
  }
  pool_destroy (&p);
  printf ("  live first: the live chunk before three given back, a light "
          "load in one chunk\n");
}

/* ---- the reserve ---------------------------------------------------------- */

static void
test_reserve (void)
{
  struct pool p;
  long lck0, lck1, min0, maj0, min1, maj1;
  size_t node_pages;
  /* The reserve's page entries (6 KiB from the start) span two pages. */
  const size_t meta_locked = 2 * PDIO_PAGE_SIZE;
  static void *pg[CHUNK_PAGES];
  void *b[3];
  char *r;
  unsigned n = 0, bounces = 0;

  new_pool (&p, 8 * MiB);
  lck0 = status_kib ("VmLck");
  CHECK (pool_reserve (&p, 1) == 0, "mlock refused (as root?)");
  lck1 = status_kib ("VmLck");
  r = p.bufs.base;
  CHECK (p.chunk[1].live && p.chunk[1].reserved && registered[1] == 1,
         "the reserve is not live and registered");
  CHECK (p.reserved_bytes == POOL_CHUNK && p.live_bytes == POOL_CHUNK,
         "reserved %zu, live %zu", p.reserved_bytes, p.live_bytes);
#ifndef PDIO_UNIT_SANITIZED
  /* (ASan's mlock does nothing.) */
  CHECK (lck1 - lck0 == (long) ((POOL_CHUNK + meta_locked) >> 10),
         "VmLck grew by %ld KiB, want %zu", lck1 - lck0,
         (POOL_CHUNK + meta_locked) >> 10);
#endif
  CHECK (resident_pages (r, POOL_CHUNK) == CHUNK_PAGES, "the reserve is not "
         "all resident");
  check_pool (&p);

  /* A load over three chunks, then idle: all but the reserve go back,
   * with their bookkeeping.
   */
  pool_release (&p, 100, 5);
  for (int i = 0; i < 3; i++) {
    b[i] = pool_get_buf (&p, POOL_CHUNK);
    CHECK (b[i] && chunk_of (&p, b[i]) == 1u + i, "2 MiB block %d from chunk "
           "%u", i, chunk_of (&p, b[i]));
  }
  for (int i = 0; i < 3; i++)
    pool_put (&p, b[i], POOL_CHUNK);
  for (int i = 0; i < 300; i++)
    CHECK ((pg[i] = pool_get_buf (&p, 4096)) != NULL, "page %d", i);
  for (int i = 0; i < 300; i++)
    pool_put (&p, pg[i], 4096);
  CHECK (pool_release (&p, 110, 5) == 2 * POOL_CHUNK, "did not give back two "
         "chunks");
  CHECK (p.chunk[1].live && unregistered[1] == 0, "the reserve was given "
         "back");
  CHECK (pool_release (&p, 200, 5) == 0, "gave back more");
  CHECK (resident_pages (r, POOL_CHUNK) == CHUNK_PAGES, "the reserve is not "
         "all resident after the release");
  node_pages = resident_pages (p.bufs.node, p.bufs.npages *
                               sizeof *p.bufs.node);
  CHECK (node_pages == meta_locked / PDIO_PAGE_SIZE, "%zu bookkeeping pages "
         "resident, want the reserve's %zu", node_pages,
         meta_locked / PDIO_PAGE_SIZE);
  CHECK (status_kib ("VmLck") == lck1, "VmLck changed");
  check_pool (&p);

  /* After the give-back: pages one by one up to the whole chunk, every
   * byte written, a whole chunk, bounces (their region is not live), and
   * a release: all in the reserve, none faulting.  Counted from the
   * second round: the first maps this code's own pages.
   */
  for (int round = 0; round < 4; round++) {
    size_t k;

    if (round == 1)
      faults (&min0, &maj0);
    for (k = 0; k < CHUNK_PAGES; k++) {
      pg[k] = pool_get_buf (&p, 4096);
      if (pg[k] == NULL)
        break;
      n += chunk_of (&p, pg[k]) == 1;
      memset (pg[k], round, 4096);
    }
    while (k > 0)
      pool_put (&p, pg[--k], 4096);
    b[0] = pool_get_buf (&p, POOL_CHUNK);
    n += b[0] && chunk_of (&p, b[0]) == 1;
    memset (b[0], 0xa5, POOL_CHUNK);
    pool_put (&p, b[0], POOL_CHUNK);
    b[1] = pool_get_bounce (&p, 64 * 1024);
    b[2] = pool_get_bounce (&p, 1 * MiB);
    bounces += (chunk_of (&p, b[1]) == 1) + (chunk_of (&p, b[2]) == 1);
    pool_put (&p, b[1], 64 * 1024);
    pool_put (&p, b[2], 1 * MiB);
    pool_release (&p, 300 + 10 * round, 5);
  }
  faults (&min1, &maj1);
  CHECK (n == 4 * (CHUNK_PAGES + 1) && bounces == 8, "%u blocks and %u "
         "bounces from the reserve, want %zu and 8", n, bounces,
         4 * (CHUNK_PAGES + 1));
#ifdef PDIO_UNIT_SANITIZED
  /* ASan's shadow memory faults in as the pool is written: no count. */
  (void) min0; (void) maj0; (void) min1; (void) maj1;
#else
  CHECK (min1 == min0 && maj1 == maj0, "%ld minor, %ld major page faults "
         "using the reserve", min1 - min0, maj1 - maj0);
#endif
  CHECK (!p.chunk[0].live, "the bounce region was made live");
  check_pool (&p);
  pool_destroy (&p);
  printf ("  reserve: VmLck +%ld KiB, kept through releases, %u blocks and "
          "%u bounces from it with %ld page faults\n", lck1 - lck0, n,
          bounces, min1 - min0 + maj1 - maj0);
}

/* ---- bounce memory prefers resident memory --------------------------------- */

static void
test_bounce (void)
{
  struct pool p;
  void *buf, *m, *all;

  /* Nothing live: its own region. */
  new_pool (&p, 8 * MiB);
  m = pool_get_bounce (&p, 64 * 1024);
  CHECK (m && chunk_of (&p, m) == 0, "first bounce in chunk %u",
         chunk_of (&p, m));
  pool_put (&p, m, 64 * 1024);
  CHECK (pool_release (&p, 10, 5) == 0 && pool_release (&p, 20, 5) ==
         POOL_CHUNK && !p.chunk[0].live, "the bounce chunk stayed live");

  /* A live buffer chunk, the bounce region given back: the live chunk. */
  buf = pool_get_buf (&p, 4096);
  m = pool_get_bounce (&p, 64 * 1024);
  CHECK (m && chunk_of (&p, m) == chunk_of (&p, buf), "bounce from chunk %u, "
         "not the live %u", chunk_of (&p, m), chunk_of (&p, buf));
  CHECK (!p.chunk[0].live && registered[0] == 1, "the bounce chunk was made "
         "live again");
  /* Too big for what the live chunk has left: its own region. */
  all = pool_get_bounce (&p, 2 * MiB);
  CHECK (all && chunk_of (&p, all) == 0, "2 MiB bounce from chunk %u",
         chunk_of (&p, all));
  pool_put (&p, m, 64 * 1024);
  /* Its own region full: borrowed, from the live chunk first. */
  m = pool_get_bounce (&p, 64 * 1024);
  CHECK (m && chunk_of (&p, m) == chunk_of (&p, buf), "borrowed from chunk "
         "%u", chunk_of (&p, m));
  pool_put (&p, all, 2 * MiB);
  pool_put (&p, m, 64 * 1024);
  /* Both live: its own region. */
  m = pool_get_bounce (&p, 64 * 1024);
  CHECK (m && chunk_of (&p, m) == 0, "bounce from chunk %u with its own "
         "region live", chunk_of (&p, m));
  pool_put (&p, m, 64 * 1024);
  pool_put (&p, buf, 4096);
  check_pool (&p);
  pool_destroy (&p);

  /* Only the bounce region: as before. */
  CHECK (pool_init (&p, POOL_CHUNK, 0) == 0, "pool_init");
  CHECK (pool_buf_max (&p) == 0 && pool_get_buf (&p, 4096) == NULL,
         "buffers from a bounce-only pool");
  CHECK (pool_could_ever_bounce (&p, 2 * MiB) &&
         !pool_could_ever_bounce (&p, 2 * MiB + 1), "bounce limits");
  all = pool_get_bounce (&p, 2 * MiB);
  CHECK (all && pool_get_bounce (&p, 4096) == NULL, "bounce-only pool");
  pool_put (&p, all, 2 * MiB);
  pool_destroy (&p);
  printf ("  bounce: own live region, else a live buffer chunk, else its own "
          "region, else borrowed\n");
}

/* ---- random use, the lists checked ----------------------------------------- */

static void
test_random (void)
{
  enum { SLOTS = 48, STEPS = 20000 };
  struct pool p;
  static void *held[SLOTS];
  static size_t len[SLOTS];
  static uint8_t owner[(8 * MiB + POOL_CHUNK) / PDIO_PAGE_SIZE];
  uint32_t now = 1000;
  size_t given = 0;

  new_pool (&p, 8 * MiB);
  if (unit_rand (&seed) % 2)
    pool_reserve (&p, 1);
  for (int step = 0; step < STEPS; step++) {
    int i = unit_rand (&seed) % SLOTS;
    size_t first, n;

    if (held[i]) {
      first = ((char *) held[i] - p.mem) / PDIO_PAGE_SIZE;
      n = pool_rounded (len[i]) / PDIO_PAGE_SIZE;
      for (size_t k = 0; k < n; k++)
        owner[first + k] = 0;
      pool_put (&p, held[i], len[i]);
      held[i] = NULL;
    }
    else {
      len[i] = 1 + unit_rand (&seed) % (unit_rand (&seed) % 4 ? 64 * 1024
                                                               : POOL_CHUNK);
      held[i] = unit_rand (&seed) % 3 ? pool_get_buf (&p, len[i])
                                      : pool_get_bounce (&p, len[i]);
      if (held[i]) {
        first = ((char *) held[i] - p.mem) / PDIO_PAGE_SIZE;
        n = pool_rounded (len[i]) / PDIO_PAGE_SIZE;
        CHECK (first % n == 0, "block of %zu pages at page %zu", n, first);
        for (size_t k = 0; k < n; k++) {
          CHECK (owner[first + k] == 0, "page %zu handed out twice",
                 first + k);
          owner[first + k] = i + 1;
        }
      }
    }
    if (step % 97 == 0)
      given += pool_release (&p, now += unit_rand (&seed) % 4, 2);
    check_pool (&p);
  }
  for (int i = 0; i < SLOTS; i++)
    if (held[i])
      pool_put (&p, held[i], len[i]);
  check_pool (&p);
  CHECK (p.bufs.free_pages == p.bufs.npages &&
         p.bounce.free_pages == p.bounce.npages, "pages lost");
  given += pool_release (&p, now + 10, 2);
  CHECK (p.live_bytes == p.reserved_bytes, "%zu bytes live after a release, "
         "%zu reserved", p.live_bytes, p.reserved_bytes);
  check_pool (&p);
  pool_destroy (&p);
  printf ("  random: %d steps, lists checked after each, %zu MiB given back "
          "on the way\n", STEPS, given >> 20);
}

int
main (void)
{
  const char *s = getenv ("PDIO_TEST_SEED");

  seed = s ? strtoull (s, NULL, 10) : (uint64_t) getpid () * 2654435761u + 1;
  printf ("seed %" PRIu64 " (PDIO_TEST_SEED)\n", seed);
  test_cap ();
  test_live_first ();
  test_reserve ();
  test_bounce ();
  test_random ();
  return 0;
}
