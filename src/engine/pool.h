/* SPDX-License-Identifier: BSD-3-Clause */
/* The per-thread buffer pool: one mapping, registered with the thread's
 * ring chunk by chunk as it is used (below), split in two buddy
 * allocators of 4 KiB pages:
 *
 *   bounce  the engine's own memory for unaligned requests (one chunk's
 *           bounce, at most the bounce cap, per request at a time);
 *   bufs    what pdio_buf_get hands to a front end (payloads).
 *
 * Two regions so that buffers a front end holds (payloads of requests that
 * wait for a range lock, say) can never take the memory a locked request
 * needs to finish: every bounce holder only waits for its own I/O, so
 * bounce memory always comes back.  Bounce allocations borrow from bufs
 * when that is resident and their own region is not, or when their own
 * region is full.
 *
 * A buddy allocator because it is O(log n), bounded and cannot fragment
 * worse than 2x; sizes are rounded up to a power of two pages.
 *
 * The mapping is address space only until used.  Memory follows load in
 * chunks of POOL_CHUNK: a chunk becomes live when a block in it is first
 * handed out (the owner's hook registers it with the ring, which pins and
 * so faults in all of it), and pool_release gives back the live chunks
 * nothing was handed out from for a while (the hook unregisters them,
 * then madvise(MADV_DONTNEED) returns their pages; they come back zeroed).
 * Both regions start at a chunk boundary and blocks never merge past a
 * chunk, so every block lies in one chunk (one registered buffer,
 * fixed-buffer I/O) and a chunk with nothing handed out is one free
 * block.  Live first: every free block smaller than a chunk is in a live
 * chunk, and the whole free chunks of the live ones come before the
 * others, so an allocation takes resident memory before it makes a chunk
 * live, and a light load stays in one chunk.
 *
 * pool_reserve keeps chunks live for good: resident, registered and
 * locked, with their bookkeeping, so that a request that fits them
 * allocates nothing and faults nothing in, however long the pool was
 * idle.
 */
#ifndef PDIO_POOL_H
#define PDIO_POOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pagesize.h"
/* The unit of residency and registration, and the largest block: every
 * block is one registered buffer, fixed-buffer I/O.
 */
#define POOL_CHUNK_ORDER 9u
#define POOL_CHUNK ((size_t) PDIO_PAGE_SIZE << POOL_CHUNK_ORDER)

struct buddy_node {
  uint32_t next, prev;          /* free lists, by page index */
  uint8_t head;                 /* order+1 at a free block's first page */
};

struct buddy {
  char *base;
  size_t npages;
  size_t free_pages;
  unsigned top;                 /* the largest order: a chunk's, or less
                                   in a region smaller than a chunk */
  struct buddy_node *node;      /* one a page, for blocks below top */
  struct buddy_node *top_node;  /* one a block of order top */
  uint32_t free_list[POOL_CHUNK_ORDER + 1];
  uint32_t top_tail;            /* free_list[top]'s last block */
};

struct pool_chunk {
  uint32_t held;                /* pages handed out in it */
  uint32_t idle_since;          /* pool's clock when held last fell to 0 */
  bool live;                    /* used since it was last given back */
  bool registered;              /* the hook put it in the ring's table */
  bool reserved;                /* pool_reserve: live for good */
};

struct pool {
  char *mem;
  size_t size;                  /* the mapping: bounce, gap to a chunk
                                   boundary, bufs */
  struct buddy bounce, bufs;
  struct pool_chunk *chunk;
  unsigned nchunks;
  size_t live_bytes;            /* of the live chunks */
  size_t reserved_bytes;        /* of the reserved ones */
  uint32_t now;                 /* seconds, as pool_release was told */
  bool clock_set;               /* pool_release was called */
  /* A chunk becomes live (mem, len) or is given back (NULL, 0); for a
   * live one, true if it is now registered buffer idx.  NULL: none.
   */
  bool (*hook) (void *opaque, unsigned idx, void *mem, size_t len);
  void *hook_opaque;
};

/* Maps bounce_bytes + buf_bytes (both multiples of PDIO_PAGE_SIZE;
 * bounce_bytes a power of two), address space only.  buf_bytes of a chunk
 * or more is rounded down to whole chunks (live first holds for whole
 * chunks only).  0 or -errno.
 */
extern int pool_init (struct pool *p, size_t bounce_bytes, size_t buf_bytes);
extern void pool_destroy (struct pool *p);
/* Makes the first n chunks of bufs (as many as there are) live for good:
 * their pages and the bookkeeping that allocations in them touch are
 * faulted in, registered (the hook, set before) and locked in memory;
 * pool_release never gives them back.  Call it once, before any
 * allocation.  0, or the -errno of mlock(2) (EPERM, ENOMEM: the memlock
 * limit): the reserve is made all the same, resident and registered,
 * only not locked.
 */
extern int pool_reserve (struct pool *p, unsigned n);
/* Gives back every live chunk, but the reserved ones, that has held
 * nothing for idle seconds or more by the clock now (seconds, never
 * decreasing), with the bookkeeping pages only they used; the bytes
 * given back.
 */
extern size_t pool_release (struct pool *p, uint32_t now, unsigned idle);
/* The registered buffer [mem, mem + len) lies in, or -1. */
extern int pool_buf_index (const struct pool *p, const void *mem,
                           size_t len);

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
