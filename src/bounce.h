/* Bounce pages: engine-owned, page-aligned memory for the parts of a
 * request that cannot use the caller's memory.  One arena per thread,
 * grown on demand up to a fixed cap, so the engine's memory is bounded by
 * (threads x cap) whatever the clients send.  Fresh pages come zeroed from
 * mmap, and every byte a request copies out of the arena was first filled
 * by a read or by the caller, so no stale data can reach a client.
 */
#ifndef PDIO_BOUNCE_H
#define PDIO_BOUNCE_H

#include <stddef.h>

/* Enough for a 1 MiB request at any offset with 4 KiB blocks in one chunk,
 * and for larger requests in a few.
 */
#define BOUNCE_CAP ((size_t) 2 << 20)
#define BOUNCE_MIN ((size_t) 64 << 10)

struct bounce {
  void *mem;
  size_t size;                  /* bytes mapped */
};

/* Makes the arena at least len bytes (len <= BOUNCE_CAP).  Returns 1 if it
 * moved (the old contents are gone), 0 if it was big enough, -errno.
 */
extern int bounce_reserve (struct bounce *b, size_t len);
extern void bounce_free (struct bounce *b);

#endif /* PDIO_BOUNCE_H */
