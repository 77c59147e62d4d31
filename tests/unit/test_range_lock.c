/* range_lock: overlapping ranges exclude each other, disjoint ones do not.
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
