/* range_lock; see range_lock.h. */
#include <config.h>

#include <assert.h>

#include "range_lock.h"

void
range_lock_init (struct range_lock *rl)
{
  pthread_mutex_init (&rl->mutex, NULL);
  pthread_cond_init (&rl->released, NULL);
  rl->held = NULL;
}

void
range_lock_destroy (struct range_lock *rl)
{
  assert (rl->held == NULL);
  pthread_cond_destroy (&rl->released);
  pthread_mutex_destroy (&rl->mutex);
}

static int
overlaps_held (const struct range_lock *rl, uint64_t start, uint64_t end)
{
  const struct range_lock_entry *e;

  for (e = rl->held; e; e = e->next)
    if (start < e->end && e->start < end)
      return 1;
  return 0;
}

void
range_lock_acquire (struct range_lock *rl, struct range_lock_entry *e,
                    uint64_t start, uint64_t end)
{
  assert (start < end);
  e->start = start;
  e->end = end;
  pthread_mutex_lock (&rl->mutex);
  while (overlaps_held (rl, start, end))
    pthread_cond_wait (&rl->released, &rl->mutex);
  e->next = rl->held;
  rl->held = e;
  pthread_mutex_unlock (&rl->mutex);
}

void
range_lock_release (struct range_lock *rl, struct range_lock_entry *e)
{
  struct range_lock_entry **p;

  pthread_mutex_lock (&rl->mutex);
  for (p = &rl->held; *p != e; p = &(*p)->next)
    assert (*p != NULL);
  *p = e->next;
  pthread_cond_broadcast (&rl->released);
  pthread_mutex_unlock (&rl->mutex);
}
