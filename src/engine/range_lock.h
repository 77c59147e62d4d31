/* SPDX-License-Identifier: BSD-3-Clause */
/* range_lock: serialises writes whose block-rounded ranges overlap, so that
 * a read-modify-write of a partial block can never lose a concurrent write
 * to the same block.  Writes to disjoint ranges go on in parallel.
 *
 * Acquiring never has to block: range_lock_try_acquire either holds the
 * range at once or queues the entry, and the release that makes it free
 * calls the entry's granted() (from the releasing thread, with no lock
 * held), so an asynchronous request simply resumes later.  Waiters are
 * granted in FIFO order: a range is never granted past an earlier waiter
 * it overlaps, so a stream of small writes cannot starve a large one.
 *
 * The set of held and waiting ranges is small (one per in-flight write),
 * so lists under one mutex are enough.
 */
#ifndef PDIO_RANGE_LOCK_H
#define PDIO_RANGE_LOCK_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

struct range_lock_entry {
  uint64_t start, end;          /* [start, end) */
  struct range_lock_entry *next;
  /* Called once when a queued entry becomes held; NULL for a blocking
   * waiter (range_lock_acquire), which is woken through the condvar.
   */
  void (*granted) (struct range_lock_entry *e);
  bool held;                    /* under the lock's mutex */
  struct range_lock_entry *grant_next;  /* release's list of callbacks */
};

struct range_lock {
  pthread_mutex_t mutex;
  pthread_cond_t released;      /* blocking waiters sleep on this */
  struct range_lock_entry *held;
  struct range_lock_entry *waiters, **waiters_tail;   /* FIFO */
};

extern void range_lock_init (struct range_lock *rl);
extern void range_lock_destroy (struct range_lock *rl);

/* Holds [start, end) with the caller's entry and returns true if no held
 * range and no earlier waiter overlaps it; otherwise queues the entry and
 * returns false, and granted(e) runs once it is held.  The entry must stay
 * valid until released.
 */
extern bool range_lock_try_acquire (struct range_lock *rl,
                                    struct range_lock_entry *e,
                                    uint64_t start, uint64_t end,
                                    void (*granted) (struct range_lock_entry *));

/* The same, sleeping until the range is held (tests, simple callers). */
extern void range_lock_acquire (struct range_lock *rl,
                                struct range_lock_entry *e,
                                uint64_t start, uint64_t end);

/* Releases e, then grants every waiter that is now free, in FIFO order,
 * calling their granted() after the mutex is dropped.
 */
extern void range_lock_release (struct range_lock *rl,
                                struct range_lock_entry *e);

#endif /* PDIO_RANGE_LOCK_H */
