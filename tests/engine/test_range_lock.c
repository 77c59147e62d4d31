/* SPDX-License-Identifier: BSD-3-Clause */
/* range_lock: overlapping ranges exclude each other, disjoint ones do not;
 * the non-blocking acquire queues waiters and grants them in FIFO order
 * (never past an earlier overlapping waiter), calling granted() once.
 * Threads do a non-atomic read-modify-write of shared per-block counters
 * under the lock for random ranges; any lost update shows in the totals.
 */
#include <config.h>

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <unistd.h>

#include "range_lock.h"
#include "unit.h"

#define BLOCKS 64
#define THREADS 8
#define ROUNDS 20000

static struct range_lock rl;
static volatile unsigned long counter[BLOCKS];
static unsigned long expected[THREADS][BLOCKS];

static unsigned grant_order[8], ngranted;

static void
note_granted (struct range_lock_entry *e)
{
  CHECK (e->held, "granted() on an entry that is not held");
  grant_order[ngranted++] = e->start;
}

/* One thread, no blocking: the asynchronous engine's use. */
static void
test_fifo (void)
{
  struct range_lock_entry a, b, c, d, e, f;

  ngranted = 0;
  CHECK (range_lock_try_acquire (&rl, &a, 0, 100, note_granted), "a");
  /* b overlaps a: queued.  c overlaps only b (a waiter): queued behind it,
   * although nothing held overlaps it.  d is disjoint from all: held now.
   */
  CHECK (!range_lock_try_acquire (&rl, &b, 50, 150, note_granted), "b");
  CHECK (!range_lock_try_acquire (&rl, &c, 140, 200, note_granted), "c");
  CHECK (range_lock_try_acquire (&rl, &d, 300, 400, note_granted), "d");
  /* e overlaps d; f overlaps e (a waiter) only. */
  CHECK (!range_lock_try_acquire (&rl, &e, 350, 360, note_granted), "e");
  CHECK (!range_lock_try_acquire (&rl, &f, 355, 356, note_granted), "f");
  CHECK (ngranted == 0, "granted too early");

  /* Releasing a grants b; c still waits for b. */
  range_lock_release (&rl, &a);
  CHECK (ngranted == 1 && grant_order[0] == 50, "b first");
  range_lock_release (&rl, &d);
  CHECK (ngranted == 2 && grant_order[1] == 350, "then e (f waits for it)");
  range_lock_release (&rl, &b);
  CHECK (ngranted == 3 && grant_order[2] == 140, "then c");
  range_lock_release (&rl, &e);
  CHECK (ngranted == 4 && grant_order[3] == 355, "then f");
  range_lock_release (&rl, &c);
  range_lock_release (&rl, &f);
  CHECK (rl.held == NULL && rl.waiters == NULL, "lock not empty");

  /* A release that frees two waiters at once grants both, in order. */
  ngranted = 0;
  CHECK (range_lock_try_acquire (&rl, &a, 0, 100, note_granted), "a2");
  CHECK (!range_lock_try_acquire (&rl, &b, 0, 10, note_granted), "b2");
  CHECK (!range_lock_try_acquire (&rl, &c, 90, 100, note_granted), "c2");
  range_lock_release (&rl, &a);
  CHECK (ngranted == 2 && grant_order[0] == 0 && grant_order[1] == 90,
         "both granted in FIFO order");
  range_lock_release (&rl, &c);
  range_lock_release (&rl, &b);
  CHECK (rl.held == NULL && rl.waiters == NULL, "lock not empty");
}

static void *
worker (void *arg)
{
  unsigned id = (uintptr_t) arg;
  uint64_t seed = 0x1234567ULL * (id + 1);
  int i;

  for (i = 0; i < ROUNDS; i++) {
    struct range_lock_entry e;
    unsigned start = unit_rand (&seed) % BLOCKS;
    unsigned len = 1 + unit_rand (&seed) % 4;
    unsigned b;

    if (start + len > BLOCKS)
      len = BLOCKS - start;
    range_lock_acquire (&rl, &e, start, start + len);
    for (b = start; b < start + len; b++) {
      unsigned long v = counter[b];
      if ((i & 63) == 0)
        sched_yield ();         /* widen the window for a lost update */
      counter[b] = v + 1;
      expected[id][b]++;
    }
    range_lock_release (&rl, &e);
  }
  return NULL;
}

int
main (void)
{
  pthread_t t[THREADS];
  struct range_lock_entry a, b;
  unsigned long i, j, want;

  range_lock_init (&rl);

  /* Disjoint ranges are held together (this would deadlock otherwise). */
  range_lock_acquire (&rl, &a, 0, 512);
  range_lock_acquire (&rl, &b, 512, 1024);
  range_lock_release (&rl, &a);
  range_lock_release (&rl, &b);
  test_fifo ();

  for (i = 0; i < THREADS; i++)
    CHECK (pthread_create (&t[i], NULL, worker, (void *) (uintptr_t) i) == 0,
           "pthread_create");
  for (i = 0; i < THREADS; i++)
    pthread_join (t[i], NULL);
  for (j = 0; j < BLOCKS; j++) {
    for (want = 0, i = 0; i < THREADS; i++)
      want += expected[i][j];
    CHECK (counter[j] == want, "block %lu: %lu updates, want %lu", j,
           counter[j], want);
  }
  CHECK (rl.held == NULL, "a range is still held");
  range_lock_destroy (&rl);
  printf ("%d threads x %d locked updates, none lost\n", THREADS, ROUNDS);
  return 0;
}
