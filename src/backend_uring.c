/* The io_uring backend: one small ring per thread, created by that thread
 * the first time it does I/O (so always after nbdkit forks), with the image
 * registered as a fixed file and the thread's bounce arena as fixed buffer
 * 0.  A request's transfers are submitted together and waited for with one
 * io_uring_enter; every CQE is checked and reaped before returning, because
 * the memory they use belongs to the caller only until then.
 */
#include <config.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <liburing.h>

#include "io.h"

#define RING_ENTRIES 8

struct uring_state {
  struct io_uring ring;
  bool fixed_file;              /* the image is registered file 0 */
  bool fixed_buf;               /* the bounce arena is registered buffer 0 */
  char *buf_base;
  size_t buf_len;
};

/* A ring that only this thread submits to, running completion work when
 * it waits (Linux 6.1+), falling back to a plain ring.
 */
static int
ring_init (struct io_uring *ring)
{
  int r;

  r = io_uring_queue_init (RING_ENTRIES, ring,
                           IORING_SETUP_SINGLE_ISSUER |
                           IORING_SETUP_DEFER_TASKRUN);
  if (r == -EINVAL)
    r = io_uring_queue_init (RING_ENTRIES, ring, 0);
  return r;
}

int
backend_uring_available (void)
{
  struct io_uring ring;
  int r = ring_init (&ring);

  if (r == 0)
    io_uring_queue_exit (&ring);
  return r;
}

static bool
in_fixed_buf (const struct uring_state *st, const struct iovec *iov)
{
  const char *p = iov->iov_base;

  return st->fixed_buf && p >= st->buf_base &&
    p + iov->iov_len <= st->buf_base + st->buf_len;
}

static void
prep (struct uring_state *st, int fd, struct io_uring_sqe *sqe,
      const struct io_sub *s)
{
  int target = st->fixed_file ? 0 : fd;

  if (s->iovcnt == 1 && in_fixed_buf (st, &s->iov[0])) {
    if (s->write)
      io_uring_prep_write_fixed (sqe, target, s->iov[0].iov_base,
                                 s->iov[0].iov_len, s->offset, 0);
    else
      io_uring_prep_read_fixed (sqe, target, s->iov[0].iov_base,
                                s->iov[0].iov_len, s->offset, 0);
    sqe->rw_flags = s->rw_flags;
  }
  else if (s->write)
    io_uring_prep_writev2 (sqe, target, s->iov, s->iovcnt, s->offset,
                           s->rw_flags);
  else
    io_uring_prep_readv2 (sqe, target, s->iov, s->iovcnt, s->offset,
                          s->rw_flags);
  if (st->fixed_file)
    sqe->flags |= IOSQE_FIXED_FILE;
}

static int
uring_submit (struct io_ctx *ctx, struct io_sub *subs, unsigned n)
{
  struct uring_state *st = ctx->backend_state;
  struct io_uring *ring = &st->ring;
  struct io_uring_cqe *cqe;
  unsigned i, reaped = 0;
  int r;

  for (i = 0; i < n; i++) {
    struct io_uring_sqe *sqe = io_uring_get_sqe (ring);

    if (sqe == NULL)            /* cannot happen: n <= RING_ENTRIES */
      return -EBUSY;
    prep (st, ctx->fd, sqe, &subs[i]);
    io_uring_sqe_set_data64 (sqe, i);
  }

  /* Submit and wait in one syscall; go on until the kernel took them all. */
  while (io_uring_sq_ready (ring) > 0) {
    r = io_uring_submit_and_wait (ring, n);
    if (r < 0 && r != -EINTR && r != -EAGAIN && r != -EBUSY) {
      /* Nothing was consumed: drop the SQEs so the ring stays usable. */
      if (io_uring_sq_ready (ring) == n) {
        io_uring_queue_exit (ring);
        memset (ring, 0, sizeof *ring);
        r = ring_init (ring);
        if (r == 0 && st->fixed_file)
          st->fixed_file = io_uring_register_files (ring, &ctx->fd, 1) == 0;
        st->fixed_buf = false;
        if (r == 0 && ctx->backend->bounce_changed)
          ctx->backend->bounce_changed (ctx);
        return -EIO;
      }
    }
  }

  while (reaped < n) {
    r = io_uring_wait_cqe (ring, &cqe);
    if (r == -EINTR || r == -EAGAIN)
      continue;
    if (r < 0) {
      /* The transfers use the caller's memory: returning with any of them
       * still in flight would corrupt it.  This cannot happen with a
       * healthy ring; there is no safe way on.
       */
      fprintf (stderr, "pdio: io_uring_wait_cqe: %s\n", strerror (-r));
      abort ();
    }
    i = io_uring_cqe_get_data64 (cqe);
    if (i < n)
      subs[i].res = cqe->res;
    io_uring_cqe_seen (ring, cqe);
    reaped++;
  }
  return 0;
}

static void
uring_bounce_changed (struct io_ctx *ctx)
{
  struct uring_state *st = ctx->backend_state;
  struct iovec iov = { ctx->bounce.mem, ctx->bounce.size };

  if (st->fixed_buf)
    io_uring_unregister_buffers (&st->ring);
  /* Registering pins the arena once instead of per transfer; where the
   * memlock limit refuses it, plain vectored I/O still works.
   */
  st->fixed_buf = io_uring_register_buffers (&st->ring, &iov, 1) == 0;
  st->buf_base = ctx->bounce.mem;
  st->buf_len = ctx->bounce.size;
}

static void
uring_destroy (struct io_ctx *ctx)
{
  struct uring_state *st = ctx->backend_state;

  if (st) {
    /* Drop the ring's reference to the image now; the kernel finishes
     * tearing a ring down asynchronously, and until then the file stays
     * open (its filesystem busy) after we close it.
     */
    if (st->fixed_file)
      io_uring_unregister_files (&st->ring);
    io_uring_queue_exit (&st->ring);
    free (st);
  }
  ctx->backend_state = NULL;
}

const struct io_backend backend_uring = {
  .name = "io_uring",
  .submit = uring_submit,
  .bounce_changed = uring_bounce_changed,
  .destroy = uring_destroy,
};

int
backend_uring_init (struct io_ctx *ctx)
{
  struct uring_state *st = calloc (1, sizeof *st);
  int r;

  if (st == NULL)
    return -errno;
  r = ring_init (&st->ring);
  if (r < 0) {
    free (st);
    return r;
  }
  st->fixed_file = io_uring_register_files (&st->ring, &ctx->fd, 1) == 0;
  ctx->backend = &backend_uring;
  ctx->backend_state = st;
  if (ctx->bounce.mem)
    uring_bounce_changed (ctx);
  return 0;
}
