/* The per-thread buffer pool: one mapping, registered with the thread's
 * ring as fixed buffer 0, split in two buddy allocators of 4 KiB pages:
 *
 *   bounce  the engine's own memory for unaligned requests (one chunk's
 *           bounce, at most the bounce cap, per request at a time);
 *   bufs    what pdio_buf_get hands to a front end (payloads).
 *
 * Two regions so that buffers a front end holds (payloads of requests that
 * wait for a range lock, say) can never take the memory a locked request
 * needs to finish: every bounce holder only waits for its own I/O, so
 * bounce memory always comes back.  Bounce allocations borrow from bufs
 * when their own region is full.
 *
 * A buddy allocator because it is O(log n), bounded and cannot fragment
 * worse than 2x; sizes are rounded up to a power of two pages.
 */
#ifndef PDIO_POOL_H
#define PDIO_POOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define POOL_PAGE 4096u
#define POOL_MAX_ORDER 20       /* 4 GiB blocks: more than any pool */

struct buddy {
  char *base;
  size_t npages;
  size_t free_pages;
  uint32_t *next, *prev;        /* free lists, by page index */
  uint8_t *head;                /* order+1 at a free block's first page */
  uint32_t free_list[POOL_MAX_ORDER + 1];
};

struct pool {
  char *mem;
  size_t size;                  /* bounce.npages + bufs.npages pages */
  struct buddy bounce, bufs;
};

/* Maps bounce_bytes + buf_bytes (both multiples of POOL_PAGE; bounce_bytes
 * a power of two).  0 or -errno.
 */
extern int pool_init (struct pool *p, size_t bounce_bytes, size_t buf_bytes);
extern void pool_destroy (struct pool *p);

/* NULL when there is no room now. */
extern void *pool_get_bounce (struct pool *p, size_t len);
extern void *pool_get_buf (struct pool *p, size_t len);
/* Either kind; len as it was got. */
extern void pool_put (struct pool *p, void *mem, size_t len);

extern bool pool_contains (const struct pool *p, const void *mem, size_t len);
/* Could a bounce of len ever be given, with the whole pool free? */
extern bool pool_could_ever_bounce (const struct pool *p, size_t len);
/* The largest pool_get_buf that can ever succeed. */
extern size_t pool_buf_max (const struct pool *p);
/* Bytes an allocation of len really takes. */
extern size_t pool_rounded (size_t len);

#endif /* PDIO_POOL_H */
