/* io_run: direct transfers to completion; see io.h. */
#include <config.h>

#include <assert.h>
#include <errno.h>
#include <stdint.h>

#include <string.h>

#include "engine.h"
#include "io.h"

/* What one kernel result means for its op: 1 finished, 0 submit the rest
 * again.
 */
static int
account (struct io_ctx *ctx, struct io_op *op, size_t total, ssize_t res,
         unsigned *retries)
{
  size_t reached, resume;

  if (res == -EINTR || res == -EAGAIN) {
    if (++*retries > IO_MAX_RETRIES) {
      op->err = -EIO;
      return 1;
    }
    return 0;
  }
  if (res < 0) {
    op->err = res;
    return 1;
  }
  if (res == 0) {
    /* A read at end of file; a write that makes no progress would spin. */
    if (op->write)
      op->err = -EIO;
    return 1;
  }
  reached = op->done + res;
  if (reached >= total) {
    op->done = total;
    return 1;
  }
  /* segs[0].offset is aligned, so resuming at an aligned byte count keeps
   * the next transfer aligned.
   */
  resume = reached - reached % op->align;
  if (resume > op->done) {
    op->done = resume;
    atomic_fetch_add_explicit (&ctx->counters->short_io, 1,
                               memory_order_relaxed);
    return 0;
  }
  if (!op->write && op->stalled_at == reached) {
    op->done = reached;         /* end of file inside this block */
    return 1;
  }
  op->stalled_at = reached;
  if (++*retries > IO_MAX_RETRIES) {
    op->err = -EIO;
    return 1;
  }
  return 0;
}

int
io_run (struct io_ctx *ctx, struct io_op *ops, unsigned nops)
{
  struct iovec iov[IO_MAX_OPS][IO_MAX_IOV];
  struct io_sub subs[IO_MAX_OPS];
  unsigned which[IO_MAX_OPS];   /* subs[k] runs ops[which[k]] */
  size_t total[IO_MAX_OPS];
  bool finished[IO_MAX_OPS];
  unsigned i, k, n, retries = 0;
  int r;

  assert (nops <= IO_MAX_OPS);
  for (i = 0; i < nops; i++) {
    assert (ops[i].align && ops[i].segs[0].offset % ops[i].align == 0);
    ops[i].done = 0;
    ops[i].err = 0;
    ops[i].stalled_at = SIZE_MAX;
    total[i] = dio_args_total (ops[i].segs, ops[i].nsegs);
    finished[i] = total[i] == 0;
  }

  for (;;) {
    n = 0;
    for (i = 0; i < nops; i++) {
      int cnt;

      if (finished[i])
        continue;
      cnt = dio_args_to_iovec (ops[i].segs, ops[i].nsegs, ops[i].done,
                               iov[n], IO_MAX_IOV);
      if (cnt <= 0) {
        ops[i].err = -EINVAL;
        finished[i] = true;
        continue;
      }
      subs[n] = (struct io_sub) {
        .write = ops[i].write,
        .rw_flags = ops[i].rw_flags,
        .offset = ops[i].segs[0].offset + ops[i].done,
        .iov = iov[n],
        .iovcnt = cnt,
        .res = -EIO,
      };
      which[n++] = i;
    }
    if (n == 0)
      break;

    r = ctx->backend->submit (ctx, subs, n);
    for (k = 0; k < n; k++) {
      struct io_op *op = &ops[which[k]];

      if (r < 0) {
        op->err = r;
        finished[which[k]] = true;
      }
      else
        finished[which[k]] = account (ctx, op, total[which[k]], subs[k].res,
                                      &retries);
    }
  }

  for (i = 0; i < nops; i++)
    if (ops[i].err)
      return ops[i].err;
  return 0;
}

int
io_bounce_reserve (struct io_ctx *ctx, size_t len)
{
  int r = bounce_reserve (&ctx->bounce, len);

  if (r > 0 && ctx->bounce_canary)
    memset (ctx->bounce.mem, PDIO_CANARY, ctx->bounce.size);
  if (r > 0 && ctx->backend->bounce_changed)
    ctx->backend->bounce_changed (ctx);
  return r < 0 ? r : 0;
}
