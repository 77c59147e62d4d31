/* SPDX-License-Identifier: BSD-3-Clause */
/* The engine's helper thread: the few system calls that have no io_uring
 * opcode on the kernels we support and may block (SEEK_DATA/SEEK_HOLE
 * for extents, BLKDISCARD for a trim of a block device) run here, not on
 * a worker.  A job's completion goes back to the thread that queued it
 * through thread_defer_any: the remote list and the eventfd that thread's
 * ring always has a read pending on, as a range lock grant does.
 *
 * One thread per image, started on the first job (so after any fork) and
 * joined by pdio_close; jobs run in FIFO order, each bounded (extents go
 * in batches), so one connection's long map cannot hold up the others
 * for long.
 */
#include <config.h>

#include <errno.h>
#include <string.h>

#include "engine_internal.h"

static void *
helper_main (void *arg)
{
  struct helper *h = arg;

  pthread_mutex_lock (&h->lock);
  for (;;) {
    struct helper_job *j;

    while (STAILQ_EMPTY (&h->jobs) && !h->stop)
      pthread_cond_wait (&h->cond, &h->lock);
    j = STAILQ_FIRST (&h->jobs);
    if (j == NULL)
      break;                    /* stopping, and nothing left */
    STAILQ_REMOVE_HEAD (&h->jobs, link);
    pthread_mutex_unlock (&h->lock);
    j->run (j);
    thread_defer_any (j->t, &j->done);
    pthread_mutex_lock (&h->lock);
  }
  pthread_mutex_unlock (&h->lock);
  return NULL;
}

void
helper_init (struct helper *h)
{
  pthread_mutex_init (&h->lock, NULL);
  pthread_cond_init (&h->cond, NULL);
  STAILQ_INIT (&h->jobs);
}

void
helper_queue (struct pdio_image *img, struct helper_job *j)
{
  struct helper *h = &img->helper;

  COUNT (img, helper_calls, 1);
  pthread_mutex_lock (&h->lock);
  if (!h->started) {
    int r = pthread_create (&h->tid, NULL, helper_main, h);

    if (r != 0) {
      pthread_mutex_unlock (&h->lock);
      /* No thread to be had: the call on this one, still completed from
       * poll.  Correct, only not asynchronous.
       */
      engine_warning (img, "cannot start the engine's helper thread (%s): "
                      "running a blocking call on the worker", strerror (r));
      j->run (j);
      thread_defer (j->t, &j->done);
      return;
    }
    h->started = true;
  }
  STAILQ_INSERT_TAIL (&h->jobs, j, link);
  pthread_cond_signal (&h->cond);
  pthread_mutex_unlock (&h->lock);
}

void
helper_destroy (struct helper *h)
{
  pthread_mutex_lock (&h->lock);
  h->stop = true;
  pthread_cond_signal (&h->cond);
  pthread_mutex_unlock (&h->lock);
  if (h->started)
    pthread_join (h->tid, NULL);
  pthread_mutex_destroy (&h->lock);
  pthread_cond_destroy (&h->cond);
}
