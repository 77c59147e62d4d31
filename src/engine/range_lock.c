/* SPDX-License-Identifier: BSD-3-Clause */
/* range_lock; see range_lock.h. */
#include <config.h>

#include <assert.h>
#include <stddef.h>

#include "range_lock.h"

void
range_lock_init (struct range_lock *rl)
{
  pthread_mutex_init (&rl->mutex, NULL);
  pthread_cond_init (&rl->released, NULL);
  rl->held = NULL;
  rl->waiters = NULL;
  rl->waiters_tail = &rl->waiters;
}

void
range_lock_destroy (struct range_lock *rl)
{
  assert (rl->held == NULL && rl->waiters == NULL);
  pthread_cond_destroy (&rl->released);
  pthread_mutex_destroy (&rl->mutex);
}

static bool
overlaps (const struct range_lock_entry *list,
          const struct range_lock_entry *stop, uint64_t start, uint64_t end)
{
  const struct range_lock_entry *e;

  for (e = list; e && e != stop; e = e->next)
    if (start < e->end && e->start < end)
      return true;
  return false;
}

static void
hold (struct range_lock *rl, struct range_lock_entry *e)
{
  e->held = true;
  e->next = rl->held;
  rl->held = e;
}

bool
range_lock_try_acquire (struct range_lock *rl, struct range_lock_entry *e,
                        uint64_t start, uint64_t end,
                        void (*granted) (struct range_lock_entry *))
{
  bool now;

  assert (start < end);
  e->start = start;
  e->end = end;
  e->granted = granted;
  e->held = false;
  pthread_mutex_lock (&rl->mutex);
  /* An overlapping earlier waiter goes first, whatever is held. */
  now = !overlaps (rl->held, NULL, start, end) &&
    !overlaps (rl->waiters, NULL, start, end);
  if (now)
    hold (rl, e);
  else {
    e->next = NULL;
    *rl->waiters_tail = e;
    rl->waiters_tail = &e->next;
  }
  pthread_mutex_unlock (&rl->mutex);
  return now;
}

void
range_lock_acquire (struct range_lock *rl, struct range_lock_entry *e,
                    uint64_t start, uint64_t end)
{
  if (range_lock_try_acquire (rl, e, start, end, NULL))
    return;
  pthread_mutex_lock (&rl->mutex);
  while (!e->held)
    pthread_cond_wait (&rl->released, &rl->mutex);
  pthread_mutex_unlock (&rl->mutex);
}

void
range_lock_release (struct range_lock *rl, struct range_lock_entry *e)
{
  struct range_lock_entry **p, *w, *granted = NULL, **granted_tail = &granted;
  bool wake_blocking = false;

  pthread_mutex_lock (&rl->mutex);
  for (p = &rl->held; *p != e; p = &(*p)->next)
    assert (*p != NULL);
  *p = e->next;
  e->held = false;

  /* FIFO: a waiter is granted if it overlaps nothing held and no waiter
   * still queued before it.
   */
  for (p = &rl->waiters; (w = *p) != NULL; ) {
    if (overlaps (rl->held, NULL, w->start, w->end) ||
        overlaps (rl->waiters, w, w->start, w->end)) {
      p = &w->next;
      continue;
    }
    *p = w->next;
    if (rl->waiters_tail == &w->next)
      rl->waiters_tail = p;
    hold (rl, w);
    if (w->granted == NULL)
      wake_blocking = true;
    else {
      w->grant_next = NULL;
      *granted_tail = w;
      granted_tail = &w->grant_next;
    }
  }
  if (wake_blocking)
    pthread_cond_broadcast (&rl->released);
  pthread_mutex_unlock (&rl->mutex);

  /* Outside the mutex: a callback may take or release ranges itself. */
  while ((w = granted) != NULL) {
    granted = w->grant_next;
    w->granted (w);
  }
}
