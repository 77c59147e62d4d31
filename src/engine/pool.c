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
  b->head[pg] = o + 1;
  b->prev[pg] = NONE;
  b->next[pg] = b->free_list[o];
  if (b->free_list[o] != NONE)
    b->prev[b->free_list[o]] = pg;
  b->free_list[o] = pg;
}

static void
list_remove (struct buddy *b, uint32_t pg, unsigned o)
{
  if (b->prev[pg] != NONE)
    b->next[b->prev[pg]] = b->next[pg];
  else
    b->free_list[o] = b->next[pg];
  if (b->next[pg] != NONE)
    b->prev[b->next[pg]] = b->prev[pg];
  b->head[pg] = 0;
}

static int
buddy_init (struct buddy *b, char *base, size_t npages)
{
  size_t pg = 0;
  unsigned o;

  memset (b, 0, sizeof *b);
  for (o = 0; o <= POOL_MAX_ORDER; o++)
    b->free_list[o] = NONE;
  b->base = base;
  b->npages = npages;
  if (npages == 0)
    return 0;
  b->next = calloc (npages, sizeof *b->next);
  b->prev = calloc (npages, sizeof *b->prev);
  b->head = calloc (npages, 1);
  if (!b->next || !b->prev || !b->head)
    return -ENOMEM;
  /* The largest naturally aligned blocks that fit, in order. */
  while (pg < npages) {
    o = POOL_MAX_ORDER;
    while ((pg & (((size_t) 1 << o) - 1)) || pg + ((size_t) 1 << o) > npages)
      o--;
    list_push (b, pg, o);
    pg += (size_t) 1 << o;
  }
  b->free_pages = npages;
  return 0;
}

static void
buddy_destroy (struct buddy *b)
{
  free (b->next);
  free (b->prev);
  free (b->head);
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

  assert (pg < b->npages && b->head[pg] == 0);
  b->free_pages += (size_t) 1 << o;
  while (o < POOL_MAX_ORDER) {
    uint32_t buddy = pg ^ ((uint32_t) 1 << o);

    if (buddy >= b->npages || b->head[buddy] != o + 1)
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
  int r;

  memset (p, 0, sizeof *p);
  p->size = bounce_bytes + buf_bytes;
  p->mem = mmap (NULL, p->size, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p->mem == MAP_FAILED) {
    p->mem = NULL;
    return -errno;
  }
  r = buddy_init (&p->bounce, p->mem, bounce_bytes / POOL_PAGE);
  if (r == 0)
    r = buddy_init (&p->bufs, p->mem + bounce_bytes, buf_bytes / POOL_PAGE);
  if (r < 0)
    pool_destroy (p);
  return r;
}

void
pool_destroy (struct pool *p)
{
  buddy_destroy (&p->bounce);
  buddy_destroy (&p->bufs);
  if (p->mem)
    munmap (p->mem, p->size);
  memset (p, 0, sizeof *p);
}

/* For valgrind (vg.h), what malloc would say: a block handed out holds
 * nothing defined yet (stale data from its last user is not its
 * contents), and one given back is not to be touched until handed out
 * again.
 */
static void *
handed_out (void *m, unsigned o)
{
  if (m)
    vg_fresh (m, (size_t) POOL_PAGE << o);
  return m;
}

void *
pool_get_bounce (struct pool *p, size_t len)
{
  unsigned o = order_of (len);
  void *m = buddy_get (&p->bounce, o);

  return handed_out (m ? m : buddy_get (&p->bufs, o), o);
}

void *
pool_get_buf (struct pool *p, size_t len)
{
  unsigned o = order_of (len);

  return handed_out (buddy_get (&p->bufs, o), o);
}

void
pool_put (struct pool *p, void *mem, size_t len)
{
  struct buddy *b = (char *) mem < p->bufs.base ? &p->bounce : &p->bufs;

  assert (pool_contains (p, mem, len));
  vg_gone (mem, (size_t) POOL_PAGE << order_of (len));
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
