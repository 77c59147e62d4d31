/* SPDX-License-Identifier: BSD-3-Clause */
/* One worker thread's engine context: its io_uring, its pool and its
 * queues of deferred work, and pdio_thread_poll, the one place where
 * completions are dispatched and the engine's work runs.
 *
 * Every SQE carries a struct pdio_completion * as user_data, whoever queued
 * it, so dispatch is uniform (fio's engines/io_uring.c: queue, commit,
 * getevents, event).  Work that completes without a CQE -- a synchronous
 * backend's system call, a request resumed by a range unlock or by freed
 * pool memory, a done() callback -- goes on the deferred FIFO, which poll
 * runs too, so a request's callbacks always come from poll.
 *
 * Another thread can only ever hand this thread work (a range lock grant,
 * a helper thread's call done):
 * it goes on the remote list under a mutex, and an eventfd that the ring
 * always has a read pending on wakes the owner.
 */
#include <config.h>

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "container_of.h"
#include "engine_internal.h"
#include "pagesize.h"
#include "rounding.h"
#include "vg.h"

/* ---- deferred work --------------------------------------------------------- */

void
thread_defer (struct pdio_thread *t, struct thread_work *w)
{
  STAILQ_INSERT_TAIL (&t->work, w, link);
}

void
thread_defer_any (struct pdio_thread *t, struct thread_work *w)
{
  bool was_empty;

  if (pthread_equal (pthread_self (), t->owner)) {
    thread_defer (t, w);
    return;
  }
  pthread_mutex_lock (&t->remote_lock);
  was_empty = STAILQ_EMPTY (&t->remote);
  STAILQ_INSERT_TAIL (&t->remote, w, link);
  atomic_store (&t->remote_pending, true);
  pthread_cond_signal (&t->remote_cond);
  /* Still under the lock: once the owner has taken the work it may
   * finish and free t, and pdio_thread_free takes the lock first.
   */
  if (was_empty) {
    uint64_t one = 1;
    /* Cannot fail but for overflow, which still leaves it readable. */
    if (write (t->efd, &one, sizeof one) < 0) { /* nothing to do */ }
  }
  pthread_mutex_unlock (&t->remote_lock);
}

void
thread_wait_remote (struct pdio_thread *t)
{
  pthread_mutex_lock (&t->remote_lock);
  while (STAILQ_EMPTY (&t->remote))
    pthread_cond_wait (&t->remote_cond, &t->remote_lock);
  pthread_mutex_unlock (&t->remote_lock);
}

/* Moves work other threads queued onto the local FIFO. */
static void
take_remote (struct pdio_thread *t)
{
  if (!atomic_load (&t->remote_pending))
    return;
  pthread_mutex_lock (&t->remote_lock);
  STAILQ_CONCAT (&t->work, &t->remote);
  atomic_store (&t->remote_pending, false);
  pthread_mutex_unlock (&t->remote_lock);
}

/* Runs deferred work until there is none (work may queue more). */
static unsigned
run_deferred (struct pdio_thread *t)
{
  unsigned n = 0;

  for (;;) {
    struct thread_work *w;

    take_remote (t);
    w = STAILQ_FIRST (&t->work);
    if (w == NULL)
      break;
    STAILQ_REMOVE_HEAD (&t->work, link);
    w->fn (w);
    n++;
  }
  if (t->buf_freed) {
    t->buf_freed = false;
    if (t->on_buf_free)
      t->on_buf_free (t->on_buf_free_opaque);
  }
  return n;
}

/* ---- system calls -------------------------------------------------------- */

static void
sync_op_run (struct thread_work *w)
{
  struct sysop *op = container_of (w, struct sysop, work);
  struct pdio_thread *t = op->t;

  op->res = t->backend->run (t->backend_state, op);
  op->comp.fn (&op->comp, op->res, 0);
}

void
thread_issue (struct pdio_thread *t, struct sysop *op)
{
  if (t->file_on_ring) {
    struct io_uring_sqe *sqe = pdio_thread_sqe (t);
    int buf_index = t->fixed_buf && op->iovcnt == 1 &&
      (op->kind == SYSOP_READV || op->kind == SYSOP_WRITEV)
      ? pool_buf_index (&t->pool, op->iov[0].iov_base, op->iov[0].iov_len)
      : -1;

    if (sqe) {
      /* What valgrind would do for the system call (vg.h); a read's
       * completion marks what it read (io.c).
       */
      if (op->kind == SYSOP_READV)
        vg_kernel_owns_iov (op->iov, op->iovcnt);
      else if (op->kind == SYSOP_WRITEV || op->kind == SYSOP_TAIL_WRITE)
        vg_check_iov (op->iov, op->iovcnt);
      uring_prep (sqe, op, t->img->fd, t->img->tail_fd, t->fixed_file,
                  buf_index);
      io_uring_sqe_set_data (sqe, &op->comp);
      return;
    }
    /* The ring is broken: the syscall, synchronously, is still right. */
  }
  /* Synchronous backends run the call from poll, not from inside
   * pdio_submit: a front end's submit loop stays quick and fair.
   */
  op->t = t;
  op->work.fn = sync_op_run;
  thread_defer (t, &op->work);
}

/* ---- the ring ------------------------------------------------------------ */

static void efd_arm (struct pdio_thread *t);

static void
efd_read_done (struct pdio_completion *c, int res, uint32_t cqe_flags)
{
  struct pdio_thread *t = container_of (c, struct pdio_thread, efd_comp);

  (void) res;
  (void) cqe_flags;
  take_remote (t);
  efd_arm (t);
}

/* A read always pending on the eventfd, so remote work wakes poll. */
static void
efd_arm (struct pdio_thread *t)
{
  struct io_uring_sqe *sqe = pdio_thread_sqe (t);

  if (sqe == NULL)
    return;
  io_uring_prep_read (sqe, t->efd, &t->efd_value, sizeof t->efd_value, 0);
  t->efd_comp.fn = efd_read_done;
  io_uring_sqe_set_data (sqe, &t->efd_comp);
}

static void watch_arm (struct pdio_thread *t);

static void
watch_fired (struct pdio_completion *c, int res, uint32_t cqe_flags)
{
  struct pdio_thread *t = container_of (c, struct pdio_thread, watch_comp);

  if (res < 0) {
    /* No multishot poll (before Linux 5.13), or the ring is going: back
     * to one answer per round.
     */
    t->watching = false;
    return;
  }
  if (res & POLLIN)
    engine_file_event (t->img);
  if (!(cqe_flags & IORING_CQE_F_MORE)) {
    /* Between this poll and the next, events may come and be drained by
     * another thread: they bump watch_gen, which the check reads.
     */
    watch_arm (t);
  }
}

/* The image's watch, polled for as long as the ring lives (engine.c's
 * file check).
 */
static void
watch_arm (struct pdio_thread *t)
{
  struct io_uring_sqe *sqe;

  t->watching = false;
  if (t->img->watch_fd < 0 || (sqe = pdio_thread_sqe (t)) == NULL)
    return;
  io_uring_prep_poll_multishot (sqe, t->img->watch_fd, POLLIN);
  t->watch_comp.fn = watch_fired;
  io_uring_sqe_set_data (sqe, &t->watch_comp);
  t->watching = true;
}

/* A ring only this thread submits to, running completion work when it
 * waits (Linux 6.1+), falling back to a plain ring.
 */
static int
ring_init (struct io_uring *ring, unsigned entries)
{
  int r;

  r = io_uring_queue_init (entries, ring, IORING_SETUP_SINGLE_ISSUER |
                           IORING_SETUP_DEFER_TASKRUN);
  if (r == -EINVAL)
    r = io_uring_queue_init (entries, ring, 0);
  return r;
}

int
backend_uring_available (void)
{
  struct io_uring ring;
  int r = ring_init (&ring, 4);

  if (r == 0)
    io_uring_queue_exit (&ring);
  return r;
}

uint64_t
pdio_thread_round (const struct pdio_thread *t)
{
  return t->round;
}

struct io_uring *
pdio_thread_ring (struct pdio_thread *t)
{
  return t->have_ring ? &t->ring : NULL;
}

#define CQE_BATCH 64

/* Dispatches the stash (CQEs taken off the CQ while an SQE was wanted),
 * then every CQE there is.
 */
static int
reap (struct pdio_thread *t)
{
  struct io_uring_cqe *cqes[CQE_BATCH];
  int n = 0;
  unsigned got;
  size_t i;

  /* By index: a handler may stash more (and move the array). */
  for (i = 0; i < t->stash_n; i++) {
    struct cqe_copy e = t->stash[i];

    if (e.c)
      e.c->fn (e.c, e.res, e.flags);
    n++;
  }
  t->stash_n = 0;
  while ((got = io_uring_peek_batch_cqe (&t->ring, cqes, CQE_BATCH)) > 0) {
    struct cqe_copy batch[CQE_BATCH];

    /* These may have been posted after a file check made earlier in
     * this poll (deferred work, the last batch's handlers): a new round.
     */
    thread_new_round (t);

    /* Copy, then advance the CQ before any handler runs: handlers queue
     * SQEs and may be slow; the kernel can post again meanwhile.
     */
    for (i = 0; i < got; i++)
      batch[i] = (struct cqe_copy) {
        io_uring_cqe_get_data (cqes[i]), cqes[i]->res, cqes[i]->flags,
      };
    io_uring_cq_advance (&t->ring, got);
    for (i = 0; i < got; i++)
      if (batch[i].c)
        batch[i].c->fn (batch[i].c, batch[i].res, batch[i].flags);
    n += got;
  }
  return n;
}

/* The stash holds a CQ's worth from the start (pdio_thread_new), all a
 * ring posts until it overflows; beyond that it doubles, if memory
 * allows.
 */
static void
stash_grow (struct pdio_thread *t, size_t want)
{
  size_t cap = t->stash_cap ? t->stash_cap * 2 : 2 * CQE_BATCH;
  struct cqe_copy *p;

  while (cap < want)
    cap *= 2;
  p = realloc (t->stash, cap * sizeof *p);
  if (p == NULL)
    return;
  t->stash = p;
  t->stash_cap = cap;
}

/* Takes every CQE there is off the CQ into the stash, undispatched: the
 * caller is in the middle of a step (a front end's handler, a request
 * being started), and handlers must not run inside it.  The next reap
 * dispatches the stash first.  What the stash cannot hold stays on the
 * CQ, for the next reap.  Returns how many were taken, or -ENOMEM if
 * none could be.
 */
static int
stash_cqes (struct pdio_thread *t)
{
  struct io_uring_cqe *cqes[CQE_BATCH];
  unsigned got, i;
  int n = 0;

  /* DEFER_TASKRUN posts completions only when asked to. */
  io_uring_get_events (&t->ring);
#ifdef PDIO_TEST_BREAKS
  t->fault_busy_owed = false;
#endif
  while ((got = io_uring_peek_batch_cqe (&t->ring, cqes, CQE_BATCH)) > 0) {
    if (t->stash_n + got > t->stash_cap)
      stash_grow (t, t->stash_n + got);
    if (t->stash_n + got > t->stash_cap)
      got = t->stash_cap - t->stash_n;
    if (got == 0)
      return n ? n : -ENOMEM;
    for (i = 0; i < got; i++)
      t->stash[t->stash_n++] = (struct cqe_copy) {
        io_uring_cqe_get_data (cqes[i]), cqes[i]->res, cqes[i]->flags,
      };
    io_uring_cq_advance (&t->ring, got);
    n += got;
  }
  return n;
}

static int
ring_submit (struct pdio_thread *t)
{
#ifdef PDIO_TEST_BREAKS
  /* The test build's fault (thread_fault_busy): the kernel refusing
   * submissions until the CQ has room, as it does while completions
   * overflow.
   */
  if (t->fault_busy_owed)
    return -EBUSY;
  if (t->fault_busy) {
    t->fault_busy--;
    t->fault_busy_owed = true;
    return -EBUSY;
  }
#endif
  return io_uring_submit (&t->ring);
}

struct io_uring_sqe *
pdio_thread_sqe (struct pdio_thread *t)
{
  struct io_uring_sqe *sqe;
  unsigned idle = 0;

  if (!t->have_ring)
    return NULL;
  sqe = io_uring_get_sqe (&t->ring);
  while (sqe == NULL) {
    int r = ring_submit (t);

    if (r < 0 && r != -EINTR && r != -EAGAIN && r != -EBUSY)
      return NULL;
    if (r <= 0) {
      /* Nothing went in: the kernel wants CQ room first.  Reap into the
       * stash; with nothing to reap, retrying cannot help for long.
       */
      int got = stash_cqes (t);

      if (got < 0 || (got == 0 && ++idle > 3))
        return NULL;
    }
    sqe = io_uring_get_sqe (&t->ring);
  }
  return sqe;
}

#ifdef PDIO_TEST_BREAKS
void
thread_fault_busy (struct pdio_thread *t, unsigned n)
{
  t->fault_busy = n;
}
#endif

/* valgrind (3.19, Debian 12's) does not know that io_uring_enter can
 * block: it keeps its big lock, which lets one thread of the process run
 * at a time, across the call.  A thread asleep on its ring would stop
 * every other thread for as long, the ones that would wake it included
 * (the server's accept thread handing over a connection, another worker
 * granting a range).  Under valgrind a wait therefore never sleeps in
 * the ring: it submits and reaps without waiting, and sleeps in
 * nanosleep, which valgrind knows blocks, 1 ms at a time until a
 * completion is there or the timeout passed.  Natively this is never
 * called.
 */
static int
wait_under_valgrind (struct pdio_thread *t, unsigned wait_nr,
                     const struct __kernel_timespec *timeout)
{
  const struct timespec nap = { .tv_nsec = 1000000 };
  struct timespec end = { 0 }, now;

  if (timeout) {
    clock_gettime (CLOCK_MONOTONIC, &end);
    end.tv_sec += timeout->tv_sec;
    end.tv_nsec += timeout->tv_nsec;
    if (end.tv_nsec >= 1000000000) {
      end.tv_sec++;
      end.tv_nsec -= 1000000000;
    }
  }
  for (;;) {
    int r = io_uring_submit_and_get_events (&t->ring);

    if (r < 0 && r != -EINTR && r != -EAGAIN && r != -EBUSY)
      return r;
    if (io_uring_cq_ready (&t->ring) >= wait_nr)
      return 0;
    if (timeout) {
      clock_gettime (CLOCK_MONOTONIC, &now);
      if (now.tv_sec > end.tv_sec ||
          (now.tv_sec == end.tv_sec && now.tv_nsec >= end.tv_nsec))
        return -ETIME;
    }
    nanosleep (&nap, NULL);
  }
}

int
pdio_thread_poll (struct pdio_thread *t, unsigned wait_nr,
                  const struct __kernel_timespec *timeout)
{
  int r, n = 0;
  bool engine_busy;

  /* The checks of deferred work below must not reuse one made for
   * whatever the caller submitted since the last poll.
   */
  thread_new_round (t);
  /* Never sleep when the engine's own work did something (it may have
   * finished the request the caller waits for) or has more to do.
   */
  engine_busy = run_deferred (t) || !STAILQ_EMPTY (&t->work) || t->stash_n ||
    atomic_load (&t->remote_pending);

  if (engine_busy)
    wait_nr = 0;

  if (!t->have_ring) {
    if (wait_nr) {
      struct pollfd pfd = { .fd = t->efd, .events = POLLIN };
      int ms = timeout ? (int) (timeout->tv_sec * 1000 +
                                timeout->tv_nsec / 1000000) : -1;
      uint64_t v;

      r = poll (&pfd, 1, ms);
      if (r < 0 && errno != EINTR)
        return -errno;
      if (read (t->efd, &v, sizeof v) < 0) { /* EAGAIN: nothing there */ }
    }
    run_deferred (t);
    thread_new_round (t);
    return 0;
  }

  if (wait_nr && t->on_valgrind)
    r = wait_under_valgrind (t, wait_nr, timeout);
  else if (wait_nr) {
    struct io_uring_cqe *cqe;

    r = io_uring_submit_and_wait_timeout (&t->ring, &cqe, wait_nr,
                                          (struct __kernel_timespec *) timeout,
                                          NULL);
  }
  else if (engine_busy && io_uring_sq_ready (&t->ring) == 0 &&
           t->stash_n == 0)
    /* Only our own work ran (psync: the whole request): no system call;
     * CQEs already posted are reaped below, the rest by the next poll.
     */
    r = 0;
  else
    r = io_uring_submit_and_get_events (&t->ring);
  if (r < 0 && r != -ETIME && r != -EINTR && r != -EAGAIN && r != -EBUSY)
    return r;
  n = reap (t);
  run_deferred (t);
  /* What the caller submits next arrives after this poll's checks. */
  thread_new_round (t);
  return n;
}

/* ---- buffers ------------------------------------------------------------- */

void *
pdio_buf_get (struct pdio_thread *t, size_t len)
{
  return pool_get_buf (&t->pool, len);
}

/* Memory came back: the oldest waiting requests first, as far as it goes;
 * a front end stalled on pdio_buf_get hears of it at the end of poll.
 */
static void
pool_returned (struct pdio_thread *t)
{
  struct bounce_wait *w;

  while ((w = STAILQ_FIRST (&t->mem_waiters)) != NULL) {
    void *mem = pool_get_bounce (&t->pool, w->len);

    if (mem == NULL)
      break;
    STAILQ_REMOVE_HEAD (&t->mem_waiters, link);
    w->granted (w, mem);
  }
  t->buf_freed = true;
}

void
pdio_buf_put (struct pdio_thread *t, void *buf, size_t len)
{
  pool_put (&t->pool, buf, len);
  pool_returned (t);
}

size_t
pdio_buf_cost (size_t len)
{
  return pool_rounded (len);
}

size_t
pdio_buf_max (const struct pdio_thread *t)
{
  return pool_buf_max (&t->pool);
}

void
pdio_thread_on_buf_free (struct pdio_thread *t, void (*fn) (void *opaque),
                         void *opaque)
{
  t->on_buf_free = fn;
  t->on_buf_free_opaque = opaque;
}

size_t
pdio_thread_trim (struct pdio_thread *t, uint64_t now, unsigned idle_secs)
{
  return pool_release (&t->pool, (uint32_t) now, idle_secs);
}

size_t
pdio_thread_pool_resident (const struct pdio_thread *t)
{
  return t->pool.live_bytes;
}

size_t
pdio_thread_pool_reserved (const struct pdio_thread *t)
{
  return t->pool.reserved_bytes;
}

void *
thread_get_bounce (struct pdio_thread *t, size_t len)
{
  /* Never past a waiter: FIFO. */
  if (!STAILQ_EMPTY (&t->mem_waiters))
    return NULL;
  return pool_get_bounce (&t->pool, len);
}

void
thread_put_bounce (struct pdio_thread *t, void *mem, size_t len)
{
  if (t->img->bounce_canary)
    memset (mem, PDIO_CANARY, pool_rounded (len));
  pool_put (&t->pool, mem, len);
  pool_returned (t);
}

void
thread_wait_bounce (struct pdio_thread *t, struct bounce_wait *w)
{
  STAILQ_INSERT_TAIL (&t->mem_waiters, w, link);
}

/* ---- life cycle ------------------------------------------------------------- */

/* The pool's hook (pool.h): a chunk came into use or is being given back.
 * Registering a chunk on its first use, not the whole pool at start, is
 * what keeps an idle thread's memory unpinned and not resident: the ring
 * pins every page it registers.  Registration is one system call per
 * chunk per period of use, never per transfer.
 */
static bool
chunk_hook (void *opaque, unsigned idx, void *mem, size_t len)
{
  struct pdio_thread *t = opaque;
  struct iovec iov = { mem, len };

  if (mem && t->img->bounce_canary) {
    /* Pages come back zeroed: stale bounce data must look stale again. */
    char *b0 = t->pool.bounce.base;
    char *b1 = b0 + t->pool.bounce.npages * PDIO_PAGE_SIZE;
    char *lo = (char *) mem > b0 ? (char *) mem : b0;
    char *hi = (char *) mem + len < b1 ? (char *) mem + len : b1;

    if (lo < hi) {
      vg_fresh (lo, hi - lo);
      memset (lo, PDIO_CANARY, hi - lo);
      vg_gone (lo, hi - lo);
    }
  }
  if (!t->fixed_buf)
    return false;
  /* Where the memlock limit refuses a chunk, its transfers are plain
   * O_DIRECT ones: the kernel pins their pages per transfer instead.
   */
  return io_uring_register_buffers_update_tag (&t->ring, idx, &iov, NULL,
                                               1) == 1 && mem != NULL;
}

size_t
pdio_thread_bounce_bytes (const struct pdio_image *img)
{
  return pool_rounded (img->bounce_cap);
}

struct pdio_image *
pdio_thread_image (const struct pdio_thread *t)
{
  return t->img;
}

void
thread_set_backend (struct pdio_thread *t, const struct io_backend *b,
                    void *state)
{
  t->file_on_ring = false;
  t->backend = b;
  t->backend_state = state;
}

/* The pool's reserve: resident whatever happens, registered and locked
 * unless the memlock limit says no (it counts both), which is said once
 * per image.
 */
static void
reserve (struct pdio_thread *t, unsigned chunks)
{
  int r = pool_reserve (&t->pool, chunks);
  struct rlimit lim;

  if (r == 0 || atomic_exchange (&t->img->told_unlocked, true))
    return;
  if (getrlimit (RLIMIT_MEMLOCK, &lim) < 0)
    lim.rlim_cur = RLIM_INFINITY;
  if (lim.rlim_cur == RLIM_INFINITY)
    engine_warning (t->img, "cannot lock the pool's reserve in memory (%s): "
                    "it is kept resident, but not locked", strerror (-r));
  else
    engine_warning (t->img, "cannot lock the pool's reserve in memory (%s; "
                    "the memlock limit is %llu KiB): it is kept resident, "
                    "but not locked", strerror (-r),
                    (unsigned long long) lim.rlim_cur >> 10);
}

int
pdio_thread_new (struct pdio_image *img, const struct pdio_thread_config *cfg,
                 struct pdio_thread **tp)
{
  size_t bounce = pdio_thread_bounce_bytes (img);
  size_t pool_bytes = cfg && cfg->pool_bytes ? cfg->pool_bytes
                                             : PDIO_POOL_DEFAULT;
  unsigned entries = cfg && cfg->ring_entries ? cfg->ring_entries
                                              : PDIO_RING_DEFAULT;
  struct pdio_thread *t;
  int r;

  *tp = NULL;
  t = calloc (1, sizeof *t);
  if (t == NULL)
    return -errno;
  t->img = img;
  t->efd = -1;
  t->round = 1;                 /* checked_round 0: nothing checked yet */
  t->owner = pthread_self ();
  STAILQ_INIT (&t->work);
  STAILQ_INIT (&t->remote);
  STAILQ_INIT (&t->mem_waiters);
  pthread_mutex_init (&t->remote_lock, NULL);
  pthread_cond_init (&t->remote_cond, NULL);
  t->on_valgrind = vg_running ();
  t->files = (struct psync_files) { img->fd, img->tail_fd };
  t->backend = &backend_psync;
  t->backend_state = &t->files;
  t->efd = eventfd (0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (t->efd == -1) {
    r = -errno;
    goto fail;
  }

  pool_bytes = pool_bytes > bounce
    ? bounce + ROUND_DOWN (pool_bytes - bounce, PDIO_PAGE_SIZE) : bounce;
  r = pool_init (&t->pool, bounce, pool_bytes - bounce);
  if (r < 0)
    goto fail;
  t->pool.hook = chunk_hook;
  t->pool.hook_opaque = t;

  r = ring_init (&t->ring, entries);
  if (r == 0) {
    t->have_ring = true;
    t->file_on_ring = img->backend == PDIO_BACKEND_URING;
    if (t->file_on_ring)
      t->fixed_file = io_uring_register_files (&t->ring, &img->fd, 1) == 0;
    /* An empty table of one buffer per pool chunk: chunks are registered
     * as they come into use and taken out when given back (chunk_hook),
     * so the ring pins only what the load needs, once per chunk rather
     * than per transfer.  A bounce-only pool (the nbdkit plugin: one per
     * nbdkit worker thread, 16 per connection) stays unregistered: its
     * requests are copied anyway; so is a pool whose file I/O is not on
     * the ring (psync): nothing would use it.  Without sparse tables
     * (before Linux 5.19), plain O_DIRECT I/O.
     */
    if (t->file_on_ring && t->pool.size > bounce)
      t->fixed_buf =
        io_uring_register_buffers_sparse (&t->ring, t->pool.nchunks) == 0;
    /* Reaping into the stash is what frees the CQ when the kernel
     * refuses submissions: it must not wait for memory then.  Touched,
     * so resident.
     */
    t->stash_cap = t->ring.cq.ring_entries;
    t->stash = malloc (t->stash_cap * sizeof *t->stash);
    if (t->stash == NULL) {
      r = -ENOMEM;
      goto fail;
    }
    memset (t->stash, 0, t->stash_cap * sizeof *t->stash);
    efd_arm (t);
    watch_arm (t);
  }
  else if (img->backend == PDIO_BACKEND_URING)
    engine_debug (img, "io_uring setup failed in this thread (%s): it uses "
                  "psync", strerror (-r));
  /* After the sparse table: the reserve is registered as it is made. */
  if (cfg && cfg->reserve_chunks)
    reserve (t, cfg->reserve_chunks);
  atomic_fetch_add (&img->threads, 1);
  t->counted = true;
  *tp = t;
  return 0;

 fail:
  pdio_thread_free (t);
  return r;
}

void
pdio_thread_free (struct pdio_thread *t)
{
  if (t == NULL)
    return;
  if (t->have_ring) {
    /* Drop the ring's reference to the image now; the kernel finishes
     * tearing a ring down asynchronously, and until then the file stays
     * open (its filesystem busy) after we close it.
     */
    if (t->fixed_file)
      io_uring_unregister_files (&t->ring);
    io_uring_queue_exit (&t->ring);
  }
  if (t->counted)
    atomic_fetch_sub (&t->img->threads, 1);
  pool_destroy (&t->pool);
  free (t->stash);
  /* Another thread that granted us a range may still be inside
   * thread_defer_any (its work already taken): wait until it has left.
   */
  pthread_mutex_lock (&t->remote_lock);
  pthread_mutex_unlock (&t->remote_lock);
  if (t->efd >= 0)
    close (t->efd);
  pthread_mutex_destroy (&t->remote_lock);
  pthread_cond_destroy (&t->remote_cond);
  free (t);
}
