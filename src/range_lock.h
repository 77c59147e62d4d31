/* range_lock: serialises writes whose block-rounded ranges overlap, so that
 * a read-modify-write of a partial block can never lose a concurrent write
 * to the same block.  Writes to disjoint ranges go on in parallel.
 *
 * The set of held ranges is small (one per in-flight write), so a list
 * under one mutex is enough; a waiter sleeps until any range is released.
 */
#ifndef PDIO_RANGE_LOCK_H
#define PDIO_RANGE_LOCK_H

#include <pthread.h>
#include <stdint.h>

struct range_lock_entry {
  uint64_t start, end;          /* [start, end) */
  struct range_lock_entry *next;
};

struct range_lock {
  pthread_mutex_t mutex;
  pthread_cond_t released;
  struct range_lock_entry *held;
};

extern void range_lock_init (struct range_lock *rl);
extern void range_lock_destroy (struct range_lock *rl);

/* Blocks until [start, end) overlaps no held range, then holds it using
 * the caller's entry (usually on the caller's stack).
 */
extern void range_lock_acquire (struct range_lock *rl,
                                struct range_lock_entry *e,
                                uint64_t start, uint64_t end);
extern void range_lock_release (struct range_lock *rl,
                                struct range_lock_entry *e);

#endif /* PDIO_RANGE_LOCK_H */
