/* SPDX-License-Identifier: BSD-3-Clause */
/* The per-thread buffer pool; see pool.h. */
#include <config.h>

#include <assert.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "pagesize.h"
#include "pool.h"
#include "rounding.h"
#include "vg.h"

#define NONE UINT32_MAX

static unsigned
order_of (size_t len)
{
  size_t pages = DIV_ROUND_UP (len, PDIO_PAGE_SIZE);
  unsigned o = 0;

  while (((size_t) 1 << o) < pages)
    o++;
  return o;
}

size_t
pool_rounded (size_t len)
{
  return (size_t) PDIO_PAGE_SIZE << order_of (len ? len : 1);
}

/* A free block's entry: the page's own below top; for a block of order
 * top, one of a small array of its own, so that the free lists of whole
 * chunks, which every chunk's block is on while nothing is handed out
 * of it, touch none of the per-page bookkeeping.
 */
static struct buddy_node *
nd (const struct buddy *b, uint32_t pg, unsigned o)
{
  return o == b->top ? &b->top_node[pg >> b->top] : &b->node[pg];
}

/* At the head of free_list[o]; or, for order top only, at its tail. */
static void
list_push (struct buddy *b, uint32_t pg, unsigned o, bool tail)
{
  struct buddy_node *n = nd (b, pg, o);

  n->head = o + 1;
  if (tail) {
    n->next = NONE;
    n->prev = b->top_tail;
    if (b->top_tail != NONE)
      nd (b, b->top_tail, o)->next = pg;
    else
      b->free_list[o] = pg;
    b->top_tail = pg;
    return;
  }
  n->prev = NONE;
  n->next = b->free_list[o];
  if (n->next != NONE)
    nd (b, n->next, o)->prev = pg;
  else if (o == b->top)
    b->top_tail = pg;
  b->free_list[o] = pg;
}

static void
list_remove (struct buddy *b, uint32_t pg, unsigned o)
{
  struct buddy_node *n = nd (b, pg, o);

  if (n->prev != NONE)
    nd (b, n->prev, o)->next = n->next;
  else
    b->free_list[o] = n->next;
  if (n->next != NONE)
    nd (b, n->next, o)->prev = n->prev;
  else if (o == b->top)
    b->top_tail = n->prev;
  n->head = 0;
}

/* Every page free: the largest naturally aligned blocks that fit, whole
 * chunks in address order.  Touches no page entry where the region is
 * whole chunks.
 */
static void
buddy_fill (struct buddy *b)
{
  size_t pg = 0;
  unsigned o;

  for (o = 0; o <= POOL_CHUNK_ORDER; o++)
    b->free_list[o] = NONE;
  b->top_tail = NONE;
  while (pg < b->npages) {
    o = b->top;
    while (!IS_ALIGNED (pg, (size_t) 1 << o) ||
           pg + ((size_t) 1 << o) > b->npages)
      o--;
    list_push (b, pg, o, o == b->top);
    pg += (size_t) 1 << o;
  }
  b->free_pages = b->npages;
}

/* The page entries take 12 bytes a page (186 KiB for 62 MiB), in a
 * mapping of their own, so that the pages of the chunks given back can
 * go back too (pool_release), and all of them once nothing is live
 * (buddy_reset); one entry a page rather than one array a field, so that
 * a chunk's entries are 6 KiB in a row and a live chunk touches two or
 * three pages of them.
 */
static size_t
meta_bytes (size_t npages)
{
  size_t len = npages * sizeof (struct buddy_node);

  return ROUND_UP (len, PDIO_PAGE_SIZE);
}

static int
buddy_init (struct buddy *b, char *base, size_t npages)
{
  char *meta;

  memset (b, 0, sizeof *b);
  b->base = base;
  b->npages = npages;
  if (npages == 0) {
    buddy_fill (b);
    return 0;
  }
  while (b->top < POOL_CHUNK_ORDER && ((size_t) 2 << b->top) <= npages)
    b->top++;
  b->top_node = calloc (npages >> b->top, sizeof *b->top_node);
  if (b->top_node == NULL)
    return -ENOMEM;
  meta = mmap (NULL, meta_bytes (npages), PROT_READ | PROT_WRITE,
               MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (meta == MAP_FAILED)
    return -errno;
  b->node = (struct buddy_node *) meta;
  buddy_fill (b);
  return 0;
}

/* Back to every page free, with the bookkeeping's pages given back. */
static void
buddy_reset (struct buddy *b)
{
  if (b->npages == 0)
    return;
  madvise (b->node, meta_bytes (b->npages), MADV_DONTNEED);
  buddy_fill (b);
}

static void
buddy_destroy (struct buddy *b)
{
  if (b->node)
    munmap (b->node, meta_bytes (b->npages));
  free (b->top_node);
}

/* The first page of the block buddy_get (b, want) would split, and its
 * order in *o; NONE if there is none.
 */
static uint32_t
buddy_peek (const struct buddy *b, unsigned want, unsigned *o)
{
  if (b->npages == 0 || want > b->top)
    return NONE;
  for (*o = want; *o <= b->top; (*o)++)
    if (b->free_list[*o] != NONE)
      return b->free_list[*o];
  return NONE;
}

static void *
buddy_get (struct buddy *b, unsigned want)
{
  unsigned o;
  uint32_t pg = buddy_peek (b, want, &o);

  if (pg == NONE)
    return NULL;
  list_remove (b, pg, o);
  /* Split, keeping the lower half, freeing the upper ones. */
  while (o > want) {
    o--;
    list_push (b, pg + ((uint32_t) 1 << o), o, false);
  }
  b->free_pages -= (size_t) 1 << want;
  return b->base + (size_t) pg * PDIO_PAGE_SIZE;
}

/* Merges up to a whole chunk, never past: a block given back is in a live
 * chunk, so a whole chunk free again goes to the head of its list.
 */
static void
buddy_put (struct buddy *b, void *mem, unsigned o)
{
  uint32_t pg = ((char *) mem - b->base) / PDIO_PAGE_SIZE;

  assert (pg < b->npages && o <= b->top && nd (b, pg, o)->head == 0);
  b->free_pages += (size_t) 1 << o;
  while (o < b->top) {
    uint32_t buddy = pg ^ ((uint32_t) 1 << o);

    if (buddy >= b->npages || b->node[buddy].head != o + 1)
      break;
    list_remove (b, buddy, o);
    if (buddy < pg)
      pg = buddy;
    o++;
  }
  list_push (b, pg, o, false);
}

/* The free block of order top at mem goes to the tail of its list (its
 * chunk is no longer live) or to the head (it is now).
 */
static void
buddy_move (struct buddy *b, char *mem, bool tail)
{
  uint32_t pg = (mem - b->base) / PDIO_PAGE_SIZE;

  assert (nd (b, pg, b->top)->head == b->top + 1);
  list_remove (b, pg, b->top);
  list_push (b, pg, b->top, tail);
}

int
pool_init (struct pool *p, size_t bounce_bytes, size_t buf_bytes)
{
  size_t bufs_off = buf_bytes
    ? ROUND_UP (bounce_bytes, POOL_CHUNK)
    : bounce_bytes;
  int r;

  /* A partial chunk at the end would keep blocks smaller than a chunk
   * on the free lists while it is not live, and those are taken first.
   */
  if (buf_bytes >= POOL_CHUNK)
    buf_bytes -= buf_bytes % POOL_CHUNK;
  memset (p, 0, sizeof *p);
  p->size = bufs_off + buf_bytes;
  /* Nothing is touched here: pages become resident only in the chunks
   * that are used (and registered).
   */
  p->mem = mmap (NULL, p->size, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p->mem == MAP_FAILED) {
    p->mem = NULL;
    return -errno;
  }
  p->nchunks = DIV_ROUND_UP (p->size, POOL_CHUNK);
  p->chunk = calloc (p->nchunks, sizeof *p->chunk);
  r = p->chunk ? 0 : -ENOMEM;
  if (r == 0)
    r = buddy_init (&p->bounce, p->mem, bounce_bytes / PDIO_PAGE_SIZE);
  if (r == 0)
    r = buddy_init (&p->bufs, p->mem + bufs_off, buf_bytes / PDIO_PAGE_SIZE);
  if (r < 0)
    pool_destroy (p);
  return r;
}

void
pool_destroy (struct pool *p)
{
  buddy_destroy (&p->bounce);
  buddy_destroy (&p->bufs);
  free (p->chunk);
  if (p->mem)
    munmap (p->mem, p->size);
  memset (p, 0, sizeof *p);
}

static size_t
chunk_len (const struct pool *p, unsigned i)
{
  size_t off = (size_t) i * POOL_CHUNK;

  return p->size - off < POOL_CHUNK ? p->size - off : POOL_CHUNK;
}

/* The region chunk i is in (the gap after a small bounce region is
 * counted with it: nothing is ever handed out there).
 */
static struct buddy *
chunk_buddy (struct pool *p, unsigned i)
{
  return (size_t) i * POOL_CHUNK < (size_t) (p->bufs.base - p->mem)
    ? &p->bounce : &p->bufs;
}

/* Is chunk i one block of order top of its region when all free?  Then
 * its block has a place in the order of the free list of whole chunks,
 * and its page entries are its own business.
 */
static bool
chunk_whole (struct pool *p, unsigned i)
{
  struct buddy *b = chunk_buddy (p, i);
  size_t off = (size_t) i * POOL_CHUNK - (size_t) (b->base - p->mem);

  return b->top == POOL_CHUNK_ORDER &&
         off + POOL_CHUNK <= b->npages * PDIO_PAGE_SIZE;
}

static void
chunk_live (struct pool *p, unsigned i)
{
  struct pool_chunk *c = &p->chunk[i];

  c->live = true;
  p->live_bytes += chunk_len (p, i);
  if (p->hook)
    c->registered = p->hook (p->hook_opaque, i,
                             p->mem + (size_t) i * POOL_CHUNK,
                             chunk_len (p, i));
}

/* Counts a block handed out (sign > 0) or given back in the chunk it
 * lies in; the first block in a chunk makes it live.
 */
static void
count_held (struct pool *p, char *mem, unsigned o, int sign)
{
  unsigned i = (mem - p->mem) / POOL_CHUNK;
  uint32_t pages = (uint32_t) 1 << o;
  struct pool_chunk *c = &p->chunk[i];

  assert ((size_t) (mem - p->mem) % POOL_CHUNK + ((size_t) PDIO_PAGE_SIZE << o)
          <= POOL_CHUNK);
  if (sign > 0) {
    c->held += pages;
    if (!c->live)
      chunk_live (p, i);
  }
  else {
    assert (c->held >= pages);
    c->held -= pages;
    if (c->held == 0)
      c->idle_since = p->now;
  }
}

/* The page entries of a whole chunk given back (chunk_whole) are all
 * zero heads (it is one free block, whose entry is elsewhere): the pages
 * that hold only entries of chunks not live go back too.  A page shared
 * with a live chunk's entries stays, and so the locked ones of a reserve.
 */
static void
meta_give_back (struct pool *p, struct buddy *b, unsigned i)
{
  const size_t per_chunk = ((size_t) 1 << POOL_CHUNK_ORDER) *
                           sizeof (struct buddy_node);
  unsigned first = (b->base - p->mem) / POOL_CHUNK;
  size_t n = b->npages >> POOL_CHUNK_ORDER;
  size_t lo = (size_t) (i - first) * per_chunk, hi = lo + per_chunk;

  for (size_t pg = lo / PDIO_PAGE_SIZE; pg * PDIO_PAGE_SIZE < hi; pg++) {
    size_t k = pg * PDIO_PAGE_SIZE / per_chunk;
    size_t k_end = ((pg + 1) * PDIO_PAGE_SIZE - 1) / per_chunk;
    bool used = false;

    for (; k <= k_end && k < n; k++)
      used |= p->chunk[first + k].live;
    if (!used)
      madvise ((char *) b->node + pg * PDIO_PAGE_SIZE, PDIO_PAGE_SIZE,
               MADV_DONTNEED);
  }
}

int
pool_reserve (struct pool *p, unsigned n)
{
  struct buddy *b = &p->bufs;
  unsigned first = (b->base - p->mem) / POOL_CHUNK;
  int err = 0;

  for (unsigned k = 0; k < n && b->npages && first + k < p->nchunks; k++) {
    unsigned i = first + k;
    char *mem = p->mem + (size_t) i * POOL_CHUNK;
    size_t len = chunk_len (p, i);
    /* The page entries that allocations in the chunk use, whole pages. */
    size_t e0 = (size_t) k << POOL_CHUNK_ORDER;
    size_t e1 = e0 + len / PDIO_PAGE_SIZE;
    char *m0 = (char *) b->node + ROUND_DOWN (e0 * sizeof *b->node,
                                              PDIO_PAGE_SIZE);
    char *m1 = (char *) b->node + ROUND_UP (e1 * sizeof *b->node,
                                            PDIO_PAGE_SIZE);

    /* Written, so faulted in as the process's own pages now (the ring's
     * pin and mlock would do it too, but either may be refused).
     */
    for (size_t off = 0; off < len; off += PDIO_PAGE_SIZE)
      ((volatile char *) mem)[off] = 0;
    for (char *m = m0; m < m1; m += PDIO_PAGE_SIZE)
      *(volatile char *) m = *(volatile char *) m;
    assert (p->chunk[i].held == 0);
    if (!p->chunk[i].live)
      chunk_live (p, i);
    if (chunk_whole (p, i))
      buddy_move (b, mem, false);
    p->chunk[i].reserved = true;
    p->reserved_bytes += len;
    /* MADV_DONTNEED refuses locked pages: nothing that gives memory back
     * ever touches these.
     */
    if ((mlock (mem, len) < 0 || mlock (m0, m1 - m0) < 0) && err == 0)
      err = -errno;
  }
  return err;
}

size_t
pool_release (struct pool *p, uint32_t now, unsigned idle)
{
  size_t given = 0;

  /* Until the first call, chunks that fell idle were stamped 0, not
   * with the caller's clock: count their age from now.
   */
  if (!p->clock_set) {
    p->clock_set = true;
    for (unsigned i = 0; i < p->nchunks; i++)
      p->chunk[i].idle_since = now;
  }
  p->now = now;
  for (unsigned i = 0; i < p->nchunks; i++) {
    struct pool_chunk *c = &p->chunk[i];
    char *mem = p->mem + (size_t) i * POOL_CHUNK;

    if (!c->live || c->reserved || c->held || now - c->idle_since < idle)
      continue;
    /* Unregister first: the ring's pin would keep the pages alive. */
    if (c->registered)
      p->hook (p->hook_opaque, i, NULL, 0);
    /* Cannot fail: the range is a whole chunk of our own mapping. */
    madvise (mem, chunk_len (p, i), MADV_DONTNEED);
    c->live = c->registered = false;
    p->live_bytes -= chunk_len (p, i);
    given += chunk_len (p, i);
    /* Behind the live chunks' blocks: taken last. */
    if (chunk_whole (p, i)) {
      buddy_move (chunk_buddy (p, i), mem, true);
      meta_give_back (p, chunk_buddy (p, i), i);
    }
  }
  /* Nothing handed out at all: the free lists are back to their first
   * state, which buddy_fill rebuilds without the pages they spread over.
   */
  if (given && p->live_bytes == 0) {
    buddy_reset (&p->bounce);
    buddy_reset (&p->bufs);
  }
  return given;
}

int
pool_buf_index (const struct pool *p, const void *mem, size_t len)
{
  size_t off;

  if (len == 0 || !pool_contains (p, mem, len))
    return -1;
  off = (const char *) mem - p->mem;
  if (off / POOL_CHUNK != (off + len - 1) / POOL_CHUNK ||
      !p->chunk[off / POOL_CHUNK].registered)
    return -1;
  return off / POOL_CHUNK;
}

/* For valgrind (vg.h), what malloc would say: a block handed out holds
 * nothing defined yet (stale data from its last user is not its
 * contents), and one given back is not to be touched until handed out
 * again.
 */
static void *
handed_out (struct pool *p, void *m, unsigned o)
{
  if (m) {
    count_held (p, m, o, 1);
    vg_fresh (m, (size_t) PDIO_PAGE_SIZE << o);
  }
  return m;
}

/* Would buddy_get (b, o) hand out memory of a live chunk? */
static bool
resident (const struct pool *p, const struct buddy *b, unsigned o)
{
  unsigned got;
  uint32_t pg = buddy_peek (b, o, &got);

  return pg != NONE &&
    p->chunk[(b->base + (size_t) pg * PDIO_PAGE_SIZE - p->mem) /
             POOL_CHUNK].live;
}

/* Resident memory first, its own region's or a live chunk's of bufs
 * (where a reserve is), so that a request's bounce faults nothing in
 * while some is at hand; then its own region, made live; then whatever
 * bufs has.  Borrowing from bufs cannot starve the front end for long:
 * every bounce holder waits only for its own I/O.
 */
void *
pool_get_bounce (struct pool *p, size_t len)
{
  unsigned o = order_of (len);
  void *m = NULL;

  if (resident (p, &p->bounce, o))
    m = buddy_get (&p->bounce, o);
  if (m == NULL && resident (p, &p->bufs, o))
    m = buddy_get (&p->bufs, o);
  if (m == NULL)
    m = buddy_get (&p->bounce, o);
  if (m == NULL)
    m = buddy_get (&p->bufs, o);
  return handed_out (p, m, o);
}

void *
pool_get_buf (struct pool *p, size_t len)
{
  unsigned o = order_of (len);

  return handed_out (p, buddy_get (&p->bufs, o), o);
}

void
pool_put (struct pool *p, void *mem, size_t len)
{
  struct buddy *b = (char *) mem < p->bufs.base ? &p->bounce : &p->bufs;

  assert (pool_contains (p, mem, len));
  vg_gone (mem, (size_t) PDIO_PAGE_SIZE << order_of (len));
  count_held (p, mem, order_of (len), -1);
  buddy_put (b, mem, order_of (len));
}

bool
pool_contains (const struct pool *p, const void *mem, size_t len)
{
  const char *m = mem;

  return p->mem && m >= p->mem && len <= p->size &&
    (size_t) (m - p->mem) <= p->size - len;
}

/* The largest block a buddy region can ever hold: a chunk, or less in a
 * region smaller than one.
 */
static size_t
largest (const struct buddy *b)
{
  return b->npages ? (size_t) PDIO_PAGE_SIZE << b->top : 0;
}

bool
pool_could_ever_bounce (const struct pool *p, size_t len)
{
  size_t want = pool_rounded (len);

  return want <= largest (&p->bounce) || want <= largest (&p->bufs);
}

size_t
pool_buf_max (const struct pool *p)
{
  return largest (&p->bufs);
}
