/* The per-thread buffer pool; see pool.h. */
#include <config.h>

#include <assert.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "pool.h"
#include "vg.h"

#define NONE UINT32_MAX

static unsigned
order_of (size_t len)
{
  size_t pages = (len + POOL_PAGE - 1) / POOL_PAGE;
  unsigned o = 0;

  while (((size_t) 1 << o) < pages)
    o++;
  return o;
}

size_t
pool_rounded (size_t len)
{
  return (size_t) POOL_PAGE << order_of (len ? len : 1);
}

static void
list_push (struct buddy *b, uint32_t pg, unsigned o)
{
  b->node[pg].head = o + 1;
  b->node[pg].prev = NONE;
  b->node[pg].next = b->free_list[o];
  if (b->free_list[o] != NONE)
    b->node[b->free_list[o]].prev = pg;
  b->free_list[o] = pg;
}

static void
list_remove (struct buddy *b, uint32_t pg, unsigned o)
{
  if (b->node[pg].prev != NONE)
    b->node[b->node[pg].prev].next = b->node[pg].next;
  else
    b->free_list[o] = b->node[pg].next;
  if (b->node[pg].next != NONE)
    b->node[b->node[pg].next].prev = b->node[pg].prev;
  b->node[pg].head = 0;
}

/* Every page free: the largest naturally aligned blocks that fit, in
 * order.  Touches only those blocks' entries.
 */
static void
buddy_fill (struct buddy *b)
{
  size_t pg = 0;
  unsigned o;

  for (o = 0; o <= POOL_MAX_ORDER; o++)
    b->free_list[o] = NONE;
  while (pg < b->npages) {
    o = POOL_MAX_ORDER;
    while ((pg & (((size_t) 1 << o) - 1)) ||
           pg + ((size_t) 1 << o) > b->npages)
      o--;
    list_push (b, pg, o);
    pg += (size_t) 1 << o;
  }
  b->free_pages = b->npages;
}

/* The free lists and block heads take 12 bytes a page (186 KiB for 62
 * MiB), in a mapping of their own so that an idle pool can give their
 * pages back too (buddy_reset); one entry a page rather than one array a
 * field, so that an idle pool's few free blocks touch a page each.
 */
static size_t
meta_bytes (size_t npages)
{
  size_t len = npages * sizeof (struct buddy_node);

  return (len + POOL_PAGE - 1) / POOL_PAGE * POOL_PAGE;
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
}

static void *
buddy_get (struct buddy *b, unsigned want)
{
  unsigned o;
  uint32_t pg;

  for (o = want; o <= POOL_MAX_ORDER && b->free_list[o] == NONE; o++)
    ;
  if (o > POOL_MAX_ORDER)
    return NULL;
  pg = b->free_list[o];
  list_remove (b, pg, o);
  /* Split, keeping the lower half, freeing the upper ones. */
  while (o > want) {
    o--;
    list_push (b, pg + ((uint32_t) 1 << o), o);
  }
  b->free_pages -= (size_t) 1 << want;
  return b->base + (size_t) pg * POOL_PAGE;
}

static void
buddy_put (struct buddy *b, void *mem, unsigned o)
{
  uint32_t pg = ((char *) mem - b->base) / POOL_PAGE;

  assert (pg < b->npages && b->node[pg].head == 0);
  b->free_pages += (size_t) 1 << o;
  while (o < POOL_MAX_ORDER) {
    uint32_t buddy = pg ^ ((uint32_t) 1 << o);

    if (buddy >= b->npages || b->node[buddy].head != o + 1)
      break;
    list_remove (b, buddy, o);
    if (buddy < pg)
      pg = buddy;
    o++;
  }
  list_push (b, pg, o);
}

int
pool_init (struct pool *p, size_t bounce_bytes, size_t buf_bytes)
{
  size_t bufs_off = buf_bytes
    ? (bounce_bytes + POOL_CHUNK - 1) / POOL_CHUNK * POOL_CHUNK
    : bounce_bytes;
  int r;

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
  p->nchunks = (p->size + POOL_CHUNK - 1) / POOL_CHUNK;
  p->chunk = calloc (p->nchunks, sizeof *p->chunk);
  r = p->chunk ? 0 : -ENOMEM;
  if (r == 0)
    r = buddy_init (&p->bounce, p->mem, bounce_bytes / POOL_PAGE);
  if (r == 0)
    r = buddy_init (&p->bufs, p->mem + bufs_off, buf_bytes / POOL_PAGE);
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

/* Counts a block handed out (held > 0) or given back (held < 0) in the
 * chunks it lies in; the first block in a chunk makes it live.
 */
static void
count_held (struct pool *p, char *mem, unsigned o, int sign)
{
  size_t off = mem - p->mem, end = off + ((size_t) POOL_PAGE << o);

  while (off < end) {
    unsigned i = off / POOL_CHUNK;
    size_t stop = (size_t) (i + 1) * POOL_CHUNK;
    uint32_t pages = ((end < stop ? end : stop) - off) / POOL_PAGE;
    struct pool_chunk *c = &p->chunk[i];

    if (sign > 0) {
      c->held += pages;
      if (!c->live) {
        c->live = true;
        p->live_bytes += chunk_len (p, i);
        if (p->hook)
          c->registered = p->hook (p->hook_opaque, i,
                                   p->mem + (size_t) i * POOL_CHUNK,
                                   chunk_len (p, i));
      }
    }
    else {
      assert (c->held >= pages);
      c->held -= pages;
      if (c->held == 0)
        c->idle_since = p->now;
    }
    off += (size_t) pages * POOL_PAGE;
  }
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

    if (!c->live || c->held || now - c->idle_since < idle)
      continue;
    /* Unregister first: the ring's pin would keep the pages alive. */
    if (c->registered)
      p->hook (p->hook_opaque, i, NULL, 0);
    /* Cannot fail: the range is a whole chunk of our own mapping. */
    madvise (mem, chunk_len (p, i), MADV_DONTNEED);
    c->live = c->registered = false;
    p->live_bytes -= chunk_len (p, i);
    given += chunk_len (p, i);
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
    vg_fresh (m, (size_t) POOL_PAGE << o);
  }
  return m;
}

void *
pool_get_bounce (struct pool *p, size_t len)
{
  unsigned o = order_of (len);
  void *m = buddy_get (&p->bounce, o);

  return handed_out (p, m ? m : buddy_get (&p->bufs, o), o);
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
  vg_gone (mem, (size_t) POOL_PAGE << order_of (len));
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

/* The largest block a buddy region can ever hold. */
static size_t
largest (const struct buddy *b)
{
  size_t pages = 1;

  if (b->npages == 0)
    return 0;
  while (pages * 2 <= b->npages)
    pages *= 2;
  return pages * POOL_PAGE;
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
