/* SPDX-License-Identifier: BSD-3-Clause */
/* Direct transfers to completion, one completion at a time; see io.h. */
#include <config.h>

#include <assert.h>
#include <errno.h>
#include <stddef.h>
#include <stdint.h>

#include "container_of.h"
#include "io.h"
#include "rounding.h"
#include "vg.h"

/* What one kernel result means for x: true finished, false submit the rest
 * again.
 */
static bool
account (struct xfer *x, ssize_t res)
{
  size_t reached, resume;

  if (res == -EINTR || res == -EAGAIN) {
    if (++x->retries > IO_MAX_RETRIES) {
      x->err = -EIO;
      return true;
    }
    return false;
  }
  if (res < 0) {
    x->err = res;
    return true;
  }
  if (res == 0) {
    /* A read at end of file; a write that makes no progress would spin. */
    if (x->write)
      x->err = -EIO;
    return true;
  }
  reached = x->done + res;
  if (reached >= x->total) {
    x->done = x->total;
    return true;
  }
  /* segs[0].offset is aligned, so resuming at an aligned byte count keeps
   * the next transfer aligned.
   */
  resume = reached - reached % x->align;
  if (resume > x->done) {
    x->done = resume;
    atomic_fetch_add_explicit (&x->counters->short_io, 1,
                               memory_order_relaxed);
    return false;
  }
  if (!x->write && x->stalled_at == reached) {
    x->done = reached;          /* end of file inside this block */
    return true;
  }
  x->stalled_at = reached;
  if (++x->retries > IO_MAX_RETRIES) {
    x->err = -EIO;
    return true;
  }
  return false;
}

static void xfer_issue (struct xfer *x);

static void
xfer_completed (struct pdio_completion *c, int res, uint32_t cqe_flags)
{
  struct xfer *x = container_of (c, struct xfer, op.comp);

  (void) cqe_flags;
  /* On the ring, valgrind cannot see what the read wrote (vg.h). */
  if (!x->write)
    vg_kernel_wrote_iov (x->op.iov, x->op.iovcnt, res);
  if (account (x, res))
    x->finished (x);
  else
    xfer_issue (x);
}

static void
xfer_issue (struct xfer *x)
{
  int cnt = dio_args_to_iovec (x->segs, x->nsegs, x->done, x->iov,
                               IO_MAX_IOV);

  if (cnt <= 0) {               /* a planner bug: more iovecs than IO_MAX_IOV */
    x->err = -EINVAL;
    x->finished (x);
    return;
  }
  x->op = (struct sysop) {
    .comp.fn = xfer_completed,
    .kind = x->write ? SYSOP_WRITEV : SYSOP_READV,
    .flags = x->rw_flags,
    .offset = x->segs[0].offset + x->done,
    .iov = x->iov,
    .iovcnt = cnt,
  };
  thread_issue (x->t, &x->op);
}

void
xfer_start (struct xfer *x)
{
  assert (x->align && IS_ALIGNED (x->segs[0].offset, x->align));
  x->done = 0;
  x->err = 0;
  x->stalled_at = SIZE_MAX;
  x->retries = 0;
  x->total = dio_args_total (x->segs, x->nsegs);
  xfer_issue (x);
}
