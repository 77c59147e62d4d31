/* SPDX-License-Identifier: BSD-3-Clause */
/* A worker: one thread, its engine context (pdio_thread: one io_uring
 * that carries the sockets of its connections and their file I/O, and
 * the pool their buffers come from) and its connections.  The ring is
 * created on the worker's own thread (IORING_SETUP_SINGLE_ISSUER: only
 * that thread submits) and nothing else ever touches it; the accept
 * thread reaches a worker only through the hand-over queue, under lock,
 * and an eventfd read that the worker keeps queued on its ring.
 *
 * The loop: wait for completions (at most a second, for the watchdog),
 * dispatch them (pdio_thread_poll calls each completion's function),
 * retry connections stalled for memory, send the replies that round
 * queued (one sendmsg per connection), and once a second drop the
 * connections that stopped making progress and give back the pool memory
 * that has not been used for WORKER_IDLE_SECS.
 */
#include <config.h>

#include <errno.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "cmd.h"
#include "container_of.h"
#include "internal.h"

void
worker_log (const struct worker *w, enum pdio_log_level level,
            const char *fmt, ...)
{
  va_list args;

  va_start (args, fmt);
  pdio_vlog (&w->ctx->log, level, fmt, args);
  va_end (args);
}

static time_t
monotonic_seconds (void)
{
  struct timespec ts;

  clock_gettime (CLOCK_MONOTONIC, &ts);
  return ts.tv_sec;
}

static void on_event (struct pdio_completion *pc, int res, uint32_t flags);

static bool
arm_event (struct worker *w)
{
  struct io_uring_sqe *sqe = pdio_thread_sqe (w->t);

  if (sqe == NULL)
    return false;
  io_uring_prep_read (sqe, w->event_fd, &w->event_value,
                      sizeof w->event_value, 0);
  io_uring_sqe_set_data (sqe, &w->event_c);
  return true;
}

static void
begin_stop (struct worker *w, bool hand_over)
{
  w->stopping = true;
  worker_log (w, PDIO_LOG_DEBUG, "worker %u: %s, %u connections to finish",
              w->id, hand_over ? "handing over" : "stopping", w->conns.n);
  if (hand_over)
    conn_list_hand_over_all (w);
  else
    conn_list_stop_all (w);
}

bool
worker_handed (struct worker *w, const struct handover_conn *c)
{
  return handover_add (&w->handed, c);
}

/* New connections, or the stop request, from the accept thread. */
static void
on_event (struct pdio_completion *pc, int res, uint32_t flags)
{
  struct worker *w = container_of (pc, struct worker, event_c);
  struct handover adopt;
  int *fds;
  size_t n;
  bool stop, hand_over;

  (void) flags;
  if (res < 0 && res != -EINTR && res != -EAGAIN)
    worker_log (w, PDIO_LOG_ERROR, "worker %u: eventfd read: %s", w->id,
                strerror (-res));
  pthread_mutex_lock (&w->lock);
  fds = w->incoming;
  n = w->n_incoming;
  w->incoming = NULL;
  w->n_incoming = w->cap_incoming = 0;
  adopt = w->adopt;
  handover_init (&w->adopt);
  stop = w->stop_requested;
  hand_over = w->hand_over_requested;
  pthread_mutex_unlock (&w->lock);

  for (size_t i = 0; i < adopt.n; i++)
    conn_adopt (w, &adopt.conns[i]);
  adopt.n = 0;                  /* the connections own them now */
  handover_free (&adopt);
  for (size_t i = 0; i < n; i++)
    conn_new (w, fds[i]);
  free (fds);
  if (stop)
    begin_stop (w, hand_over);  /* the event read stays unarmed */
  else if (!arm_event (w)) {
    worker_log (w, PDIO_LOG_ERROR, "worker %u: cannot queue its event read: "
                "stopping", w->id);
    begin_stop (w, false);
  }
}

static void
loop (struct worker *w)
{
  time_t last = w->now;

  while (!(w->stopping && w->conns.n == 0)) {
    struct __kernel_timespec tick = { .tv_sec = 1 };
    int r = pdio_thread_poll (w->t, 1, &tick);

    if (r < 0 && r != -EINTR) {
      /* The ring is unusable: nothing can complete any more. */
      worker_log (w, PDIO_LOG_ERROR, "worker %u: io_uring: %s; abandoning its "
                  "%u connections", w->id, strerror (-r), w->conns.n);
      return;
    }
    w->now = monotonic_seconds ();
    conn_list_resume_stalled (w);
    /* After resuming: a resumed request may have been refused at once. */
    conn_list_send_all (w);
    if (w->now != last) {
      size_t given;

      last = w->now;
      conn_list_watchdog (w);
      given = w->ctx->keep_memory ? 0
              : pdio_thread_trim (w->t, w->now, WORKER_IDLE_SECS);
      if (given) {
        size_t resident = pdio_thread_pool_resident (w->t);
        size_t reserved = pdio_thread_pool_reserved (w->t);

        worker_log (w, PDIO_LOG_DEBUG, "worker %u: gave back %zu KiB of pool, "
                    "%zu KiB resident (%zu KiB of it the reserve)", w->id,
                    given >> 10, resident >> 10, reserved >> 10);
        /* The connections' and requests' state went back to this
         * thread's malloc arena, which keeps the pages: once the worker
         * is idle, hand the free ones back too.  Once per idle period.
         */
        if (resident == reserved)
          malloc_trim (0);
      }
    }
  }
}

/* Startup result, reported to worker_start. */
struct start {
  pthread_mutex_t lock;
  pthread_cond_t cond;
  bool done;
  int err;
};

struct worker_arg {
  struct worker *w;
  struct start *start;
};

/* The worker's engine context: its ring and its pool.  0 or -errno,
 * with the reason logged.
 */
static int
make_thread (struct worker *w)
{
  const struct pdio_thread_config cfg = {
    .pool_bytes = w->ctx->pool_bytes,
    .reserve_chunks = w->ctx->reserve_chunks,
  };
  int err = pdio_thread_new (w->ctx->img, &cfg, &w->t);

  if (err) {
    worker_log (w, PDIO_LOG_ERROR, "worker %u: %s", w->id, strerror (-err));
    w->t = NULL;
    return err;
  }
  /* The sockets need the ring: without io_uring there is no server. */
  if (pdio_thread_ring (w->t) == NULL) {
    worker_log (w, PDIO_LOG_ERROR, "io_uring is not available: pdio's own "
                "server needs it (pdio serve --nbdkit does not)");
    err = -ENOSYS;
  }
  /* The largest command's memory must always be available, or a
   * connection that sends one would wait for it forever; the reserve
   * holds it, so that none waits for the kernel's memory either.
   */
  else if (pdio_buf_max (w->t) < NBD_CMD_BUF_MAX) {
    worker_log (w, PDIO_LOG_ERROR, "a pool of %zu bytes cannot hold a request's "
                "%zu bytes", w->ctx->pool_bytes, NBD_CMD_BUF_MAX);
    err = -EINVAL;
  }
  if (err) {
    pdio_thread_free (w->t);
    w->t = NULL;
  }
  return err;
}

/* Before the worker has a ring: blocks on the eventfd until a connection
 * is handed over (true) or the server stops with none (false).
 */
static bool
wait_first (struct worker *w)
{
  for (;;) {
    uint64_t v;
    bool conns, stop;

    pthread_mutex_lock (&w->lock);
    conns = w->n_incoming > 0 || w->adopt.n > 0;
    stop = w->stop_requested;
    pthread_mutex_unlock (&w->lock);
    if (conns || stop)
      return conns;
    if (read (w->event_fd, &v, sizeof v) == -1 && errno != EINTR)
      return false;
  }
}

/* A worker whose context could not be made closes what it is handed. */
static void
refuse_all (struct worker *w)
{
  for (;;) {
    bool stop;

    pthread_mutex_lock (&w->lock);
    for (size_t i = 0; i < w->n_incoming; i++) {
      close (w->incoming[i]);
      server_conn_closed (w->ctx);
    }
    w->n_incoming = 0;
    handover_free (&w->adopt);
    stop = w->stop_requested;
    pthread_mutex_unlock (&w->lock);
    if (stop || !wait_first (w))
      return;
  }
}

static void
report_start (struct start *st, int err)
{
  pthread_mutex_lock (&st->lock);
  st->err = err;
  st->done = true;
  pthread_cond_signal (&st->cond);
  pthread_mutex_unlock (&st->lock);
}

/* No request of this worker runs any more. */
static void
report_ended (struct worker *w)
{
  pthread_mutex_lock (&w->lock);
  w->ended = true;
  pthread_cond_broadcast (&w->ended_cond);
  pthread_mutex_unlock (&w->lock);
}

void
worker_wait_ended (struct worker *w)
{
  pthread_mutex_lock (&w->lock);
  while (!w->ended)
    pthread_cond_wait (&w->ended_cond, &w->lock);
  pthread_mutex_unlock (&w->lock);
}

/* Worker 0 makes its ring and pool at once, so that what would fail for
 * every worker fails the start; the others make theirs when their first
 * connection comes (a pool is address space until used, but a ring is
 * kernel memory: a 16-CPU server with two clients holds two, not
 * sixteen) -- unless the server takes connections over, which then wait
 * for no ring.
 */
static void *
worker_main (void *arg_)
{
  struct worker_arg *arg = arg_;
  struct worker *w = arg->w;
  struct start *st = arg->start;      /* gone once reported */
  int err;

  w->now = monotonic_seconds ();
  if (w->id == 0 || w->ctx->rings_at_start) {
    err = make_thread (w);
    report_start (st, err);
    if (err)
      return NULL;
  }
  else {
    report_start (st, 0);
    if (!wait_first (w))
      goto done;
    if (make_thread (w) != 0) {
      refuse_all (w);
      goto done;
    }
  }
  w->now = monotonic_seconds ();
  /* Takes what was handed over so far and queues the eventfd read. */
  on_event (&w->event_c, 0, 0);
  loop (w);
  report_ended (w);
  /* Connections the loop abandoned (ring failure) are leaked with their
   * fds closed by process exit; in the normal stop there are none.
   */
  pdio_thread_free (w->t);
  w->t = NULL;
 done:
  report_ended (w);
  worker_log (w, PDIO_LOG_DEBUG, "worker %u: done", w->id);
  return NULL;
}

int
worker_start (struct worker *w, const struct server_ctx *ctx, unsigned id)
{
  struct start st = { .done = false };
  struct worker_arg *arg;
  int err;

  memset (w, 0, sizeof *w);
  conn_list_init (w);
  handover_init (&w->adopt);
  handover_init (&w->handed);
  w->ctx = ctx;
  w->id = id;
  w->event_c.fn = on_event;
  w->event_fd = eventfd (0, EFD_CLOEXEC);
  w->discard = malloc (WORKER_DISCARD_BYTES);
  arg = malloc (sizeof *arg);
  if (w->event_fd == -1 || w->discard == NULL || arg == NULL) {
    err = w->event_fd == -1 ? -errno : -ENOMEM;
    goto fail;
  }
  pthread_mutex_init (&w->lock, NULL);
  pthread_cond_init (&w->ended_cond, NULL);
  pthread_mutex_init (&st.lock, NULL);
  pthread_cond_init (&st.cond, NULL);
  *arg = (struct worker_arg) { .w = w, .start = &st };
  err = -pthread_create (&w->thread, NULL, worker_main, arg);
  if (err)
    goto fail;
  pthread_mutex_lock (&st.lock);
  while (!st.done)
    pthread_cond_wait (&st.cond, &st.lock);
  pthread_mutex_unlock (&st.lock);
  free (arg);                   /* the thread is done with it */
  arg = NULL;
  err = st.err;
  if (err) {
    pthread_join (w->thread, NULL);
    goto fail;
  }
  return 0;

 fail:
  free (arg);
  free (w->discard);
  if (w->event_fd >= 0)
    close (w->event_fd);
  w->discard = NULL;
  w->event_fd = -1;
  return err;
}

static void
wake (struct worker *w)
{
  uint64_t one = 1;

  /* Can only fail if the counter would overflow: it is read long before. */
  if (write (w->event_fd, &one, sizeof one) != sizeof one)
    worker_log (w, PDIO_LOG_WARNING, "worker %u: eventfd write failed", w->id);
}

void
worker_hand_over (struct worker *w, int fd)
{
  pthread_mutex_lock (&w->lock);
  if (w->n_incoming == w->cap_incoming) {
    size_t cap = w->cap_incoming ? 2 * w->cap_incoming : 16;
    int *p = realloc (w->incoming, cap * sizeof *p);

    if (p == NULL) {
      pthread_mutex_unlock (&w->lock);
      close (fd);
      server_conn_closed (w->ctx);
      return;
    }
    w->incoming = p;
    w->cap_incoming = cap;
  }
  w->incoming[w->n_incoming++] = fd;
  pthread_mutex_unlock (&w->lock);
  wake (w);
}

void
worker_adopt (struct worker *w, const struct handover_conn *c)
{
  pthread_mutex_lock (&w->lock);
  if (!handover_add (&w->adopt, c)) {
    pthread_mutex_unlock (&w->lock);
    close (c->fd);
    free (c->payload);
    return;
  }
  pthread_mutex_unlock (&w->lock);
  wake (w);
}

void
worker_request_stop (struct worker *w)
{
  pthread_mutex_lock (&w->lock);
  w->stop_requested = true;
  pthread_mutex_unlock (&w->lock);
  wake (w);
}

void
worker_request_hand_over (struct worker *w)
{
  pthread_mutex_lock (&w->lock);
  w->stop_requested = w->hand_over_requested = true;
  pthread_mutex_unlock (&w->lock);
  wake (w);
}

void
worker_join (struct worker *w)
{
  pthread_join (w->thread, NULL);
  for (size_t i = 0; i < w->n_incoming; i++) {
    close (w->incoming[i]);
    server_conn_closed (w->ctx);
  }
  free (w->incoming);
  handover_free (&w->adopt);
  free (w->discard);
  close (w->event_fd);
  pthread_cond_destroy (&w->ended_cond);
  pthread_mutex_destroy (&w->lock);
}
