/* SPDX-License-Identifier: BSD-3-Clause */
/* pdio_submit and the steps of reads and writes; see req.h. */
#include <config.h>

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/uio.h>

#include "container_of.h"
#include "pagesize.h"
#include "req.h"
#include "rounding.h"

_Static_assert (sizeof (struct req_state) <= sizeof (struct pdio_req_private),
                "PDIO_REQ_PRIVATE_SIZE is too small for struct req_state");

static struct req_state *
state_of (struct pdio_req *r)
{
  return (struct req_state *) r->priv.u.bytes;
}

/* ---- resuming, finishing ------------------------------------------------ */

static void
run_resume (struct thread_work *w)
{
  struct req_state *rs = container_of (w, struct req_state, work);

  rs->resume (rs);
}

/* `step` from this thread's poll. */
static void
defer_step (struct req_state *rs, req_step *step)
{
  rs->resume = step;
  rs->work.fn = run_resume;
  thread_defer (rs->t, &rs->work);
}

static void
call_done (struct req_state *rs)
{
  struct pdio_req *r = rs->r;

  rs->t->requests--;
  r->done (r, rs->err);
}

void
req_finish (struct req_state *rs, int err)
{
  if (rs->bounce) {
    thread_put_bounce (rs->t, rs->bounce, rs->bounce_len);
    rs->bounce = NULL;
  }
  if (rs->locked) {
    rs->locked = false;
    range_lock_release (&rs->img->lock, &rs->lock);
  }
  rs->err = err;
  /* Never from inside pdio_submit, and after the step that called us has
   * returned.
   */
  defer_step (rs, call_done);
}

void
req_done_ok (struct req_state *rs)
{
  req_finish (rs, 0);
}

/* ---- single system calls ---------------------------------------------------- */

static void
op_completed (struct pdio_completion *c, int res, uint32_t cqe_flags)
{
  struct req_state *rs = container_of (c, struct req_state, op.comp);

  (void) cqe_flags;
  rs->after_op (rs, res);
}

static void
issue_iov (struct req_state *rs, enum sysop_kind kind, int flags,
           uint64_t offset, uint64_t len, const struct iovec *iov,
           req_op_step *after)
{
  rs->after_op = after;
  rs->op = (struct sysop) {
    .comp.fn = op_completed, .kind = kind, .flags = flags,
    .offset = offset, .len = len, .iov = iov, .iovcnt = iov ? 1 : 0,
  };
  thread_issue (rs->t, &rs->op);
}

void
req_issue (struct req_state *rs, enum sysop_kind kind, int flags,
           uint64_t offset, uint64_t len, req_op_step *after)
{
  issue_iov (rs, kind, flags, offset, len, NULL, after);
}

static void
synced (struct req_state *rs, int res)
{
  if (res < 0)
    req_finish (rs, res);
  else
    rs->after_sync (rs);
}

void
req_sync_then (struct req_state *rs, req_step *then)
{
  rs->after_sync = then;
  req_issue (rs, SYSOP_FDATASYNC, 0, 0, 0, synced);
}

/* ---- the range lock --------------------------------------------------------- */

static void
locked_go (struct req_state *rs)
{
  rs->lock_waiting = false;
  rs->locked = true;
  rs->after_lock (rs);
}

/* From whichever thread released the range. */
static void
lock_granted (struct range_lock_entry *e)
{
  struct req_state *rs = container_of (e, struct req_state, lock);

  rs->resume = locked_go;
  rs->work.fn = run_resume;
  thread_defer_any (rs->t, &rs->work);
}

static void
lock_then (struct req_state *rs, uint64_t offset, uint64_t count,
           req_step *then)
{
  uint64_t start, end;

  engine_write_span (rs->img, rs->size, offset, count, &start, &end);
  rs->after_lock = then;
  /* Set before the entry is visible to other threads' releases. */
  rs->lock_waiting = true;
  if (range_lock_try_acquire (&rs->img->lock, &rs->lock, start, end,
                              lock_granted))
    locked_go (rs);
}

bool
req_waits_remote (struct pdio_req *r)
{
  return state_of (r)->lock_waiting || state_of (r)->helper_waiting;
}

/* ---- direct I/O, chunk by chunk ----------------------------------------------- */

static char *
seg_mem (const struct plan_seg *s, char *user, char *bounce)
{
  return (s->mem == PLAN_MEM_USER ? user : bounce) + s->mem_off;
}

/* A read stopped at end of file: what the file does not hold reads as
 * zeroes, wherever in the chunk's memory those bytes were to land.
 */
static void
zero_fill_after (const struct plan_chunk *c, size_t done, char *user,
                 char *bounce)
{
  size_t pos = 0;
  unsigned s;

  for (s = 0; s < c->nseg; s++) {
    const struct plan_seg *seg = &c->seg[s];
    size_t from = done > pos ? done - pos : 0;

    if (from < seg->len)
      memset (seg_mem (seg, user, bounce) + from, 0, seg->len - from);
    pos += seg->len;
  }
}

static void rw_chunk (struct req_state *rs);
static void rw_have_bounce (struct req_state *rs);

static void
xfer_finished (struct xfer *x)
{
  struct req_state *rs = x->owner;

  if (--rs->xf_pending == 0)
    rs->after_xfer (rs);
}

static struct xfer *
xfer_setup (struct req_state *rs, unsigned i, bool write, int rw_flags,
            uint32_t align)
{
  struct xfer *x = &rs->xf[i];

  x->t = rs->t;
  x->counters = &rs->img->stats.io;
  x->write = write;
  x->rw_flags = rw_flags;
  x->align = align;
  x->finished = xfer_finished;
  x->owner = rs;
  return x;
}

static uint32_t
rw_align (const struct req_state *rs)
{
  return rs->rw.write ? rs->img->geo.offset_align : rs->img->geo.read_align;
}

static void
rw_give_back_bounce (struct req_state *rs)
{
  if (rs->bounce) {
    thread_put_bounce (rs->t, rs->bounce, rs->bounce_len);
    rs->bounce = NULL;
  }
}

static void
rw_transfer_done (struct req_state *rs)
{
  const struct plan_chunk *c = &rs->chunk;
  struct xfer *x = &rs->xf[0];
  unsigned i;

  if (x->err) {
    req_finish (rs, x->err);
    return;
  }
  if (!rs->rw.write) {
    /* End of file may come inside the last block of an image whose size
     * is not aligned; before the image's size, the file has shrunk.
     */
    uint64_t want = rs->rw.off + c->next;

    if (want > rs->size)
      want = rs->size;
    if (c->file_off + x->done < want) {
      engine_tell_changed (rs->img, "the image shrank");
      req_finish (rs, -EIO);
      return;
    }
    if (x->done < c->file_len)
      zero_fill_after (c, x->done, rs->rw.buf, rs->bounce);
    for (i = 0; i < c->ncopy; i++)
      memcpy (rs->rw.buf + c->copy[i].user_off,
              rs->bounce + c->copy[i].bounce_off, c->copy[i].len);
  }
  rw_give_back_bounce (rs);
  rs->rw.done = c->next;
  rw_chunk (rs);
}

/* Copy in (writes), then the chunk's whole span as ONE transfer. */
static void
rw_transfer (struct req_state *rs)
{
  const struct plan_chunk *c = &rs->chunk;
  struct xfer *x = xfer_setup (rs, 0, rs->rw.write, rs->rw.rw_flags,
                               rw_align (rs));
  uint64_t file_off = c->file_off;
  size_t copied = 0;
  unsigned i;

  for (i = 0; i < c->ncopy; i++) {
    if (rs->rw.write)
      memcpy (rs->bounce + c->copy[i].bounce_off,
              rs->rw.buf + c->copy[i].user_off, c->copy[i].len);
    copied += c->copy[i].len;
  }
  if (copied)
    COUNT (rs->img, bounced_bytes, copied);

  for (i = 0; i < c->nseg; i++) {
    dio_args_map_contig (&x->segs[i],
                         seg_mem (&c->seg[i], rs->rw.buf, rs->bounce),
                         c->seg[i].len, file_off);
    file_off += c->seg[i].len;
  }
  x->nsegs = c->nseg;
  rs->xf_pending = 1;
  rs->after_xfer = rw_transfer_done;
  xfer_start (x);
}

/* RMW: the partial blocks a write only covers in part are in the bounce. */
static void
rw_rmw_done (struct req_state *rs)
{
  const struct plan_chunk *c = &rs->chunk;

  for (unsigned i = 0; i < c->nrmw; i++)
    if (rs->xf[i].err) {
      req_finish (rs, rs->xf[i].err);
      return;
    }
  /* The file shrank under us: past its end, the block reads as zeros. */
  for (unsigned i = 0; i < c->nrmw; i++) {
    const struct xfer *x = &rs->xf[i];

    if (x->done < rw_align (rs))
      memset (rs->bounce + c->rmw[i].bounce_off + x->done, 0,
              rw_align (rs) - x->done);
  }
  COUNT (rs->img, rmw_blocks, c->nrmw);
  rw_transfer (rs);
}

static void
rw_have_bounce (struct req_state *rs)
{
  const struct plan_chunk *c = &rs->chunk;
  uint32_t align = rw_align (rs);
  unsigned i;

  if (!rs->rw.write || c->nrmw == 0) {
    rw_transfer (rs);
    return;
  }
  /* Both partial blocks are read together. */
  rs->xf_pending = c->nrmw;
  rs->after_xfer = rw_rmw_done;
  for (i = 0; i < c->nrmw; i++) {
    struct xfer *x = xfer_setup (rs, i, false, 0, align);

    dio_args_map_contig (&x->segs[0], rs->bounce + c->rmw[i].bounce_off,
                         align, c->rmw[i].file_off);
    x->nsegs = 1;
  }
  for (i = 0; i < c->nrmw; i++)
    xfer_start (&rs->xf[i]);
}

static void
rw_bounce_granted (struct bounce_wait *w, void *mem)
{
  struct req_state *rs = container_of (w, struct req_state, bwait);

  rs->bounce = mem;
  rs->bounce_len = w->len;
  defer_step (rs, rw_have_bounce);
}

static void
rw_chunk (struct req_state *rs)
{
  const struct plan_request req = {
    .write = rs->rw.write, .offset = rs->rw.off, .count = rs->rw.count,
    .buf = (uintptr_t) rs->rw.buf,
  };
  const struct plan_limits lim = {
    .align = rw_align (rs),
    .mem_align = rs->img->geo.mem_align,
    .bounce_cap = rs->img->bounce_cap,
  };
  struct plan_chunk *c = &rs->chunk;

  if (rs->rw.done == rs->rw.count) {
    rs->rw.then (rs);
    return;
  }
  plan_chunk (&req, &lim, rs->rw.done, c);
  if (c->direct)
    COUNT (rs->img, direct, 1);
  else
    COUNT (rs->img, bounced, 1);
  if (c->bounce_len) {
    /* Only if the image's bounce cap changed after the pool was made (the
     * planner's tests do that): waiting would be forever.
     */
    if (!pool_could_ever_bounce (&rs->t->pool, c->bounce_len)) {
      req_finish (rs, -ENOMEM);
      return;
    }
    rs->bounce = thread_get_bounce (rs->t, c->bounce_len);
    rs->bounce_len = c->bounce_len;
    if (rs->bounce == NULL) {
      /* Backpressure: wait, in order, for memory to come back. */
      rs->bwait.len = c->bounce_len;
      rs->bwait.granted = rw_bounce_granted;
      thread_wait_bounce (rs->t, &rs->bwait);
      return;
    }
  }
  rw_have_bounce (rs);
}

/* Direct I/O of any offset, length and memory (the executor of
 * plan_chunk); writes need the request's range lock.
 */
static void
rw_run (struct req_state *rs, bool write, char *buf, uint64_t off,
        size_t count, int rw_flags, req_step *then)
{
  rs->rw.write = write;
  rs->rw.buf = buf;
  rs->rw.off = off;
  rs->rw.count = count;
  rs->rw.done = 0;
  rs->rw.rw_flags = rw_flags;
  rs->rw.then = then;
  rw_chunk (rs);
}

/* ---- the image's sub-alignment tail --------------------------------------- */

/* The last (size % alignment) bytes of an image cannot be written with
 * O_DIRECT without growing the file, so they go through the page cache,
 * are written back at once and dropped from it again.  The range lock
 * covers the whole page around them (engine_write_span).
 */
static void tail_write_more (struct req_state *rs);

static void
tail_dropped (struct req_state *rs, int res)
{
  (void) res;                   /* advice: nothing to do if refused */
  COUNT (rs->img, tail_writes, 1);
  rs->tw.then (rs);
}

static void
tail_synced (struct req_state *rs, int res)
{
  if (res < 0) {
    req_finish (rs, res);
    return;
  }
  /* Whole pages: DONTNEED keeps a partial page unless it ends the file. */
  req_issue (rs, SYSOP_TAIL_FADVISE, POSIX_FADV_DONTNEED, rs->tw.page,
             rs->tw.page_end - rs->tw.page, tail_dropped);
}

static void
tail_written_back (struct req_state *rs, int res)
{
  if (res < 0)
    req_finish (rs, res);
  else if (rs->tw.fua)
    req_issue (rs, SYSOP_FDATASYNC, 0, 0, 0, tail_synced);
  else
    tail_synced (rs, 0);
}

static void
tail_written (struct req_state *rs, int res)
{
  if (res == -EINTR || res == -EAGAIN) {
    tail_write_more (rs);
    return;
  }
  if (res <= 0) {
    req_finish (rs, res < 0 ? res : -EIO);
    return;
  }
  rs->tw.done += res;
  if (rs->tw.done < rs->tw.count) {
    tail_write_more (rs);
    return;
  }
  req_issue (rs, SYSOP_TAIL_SYNC_RANGE,
             SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE |
             SYNC_FILE_RANGE_WAIT_AFTER,
             rs->tw.page, rs->tw.page_end - rs->tw.page, tail_written_back);
}

static void
tail_write_more (struct req_state *rs)
{
  rs->tw.iov.iov_base = (char *) rs->tw.buf + rs->tw.done;
  rs->tw.iov.iov_len = rs->tw.count - rs->tw.done;
  issue_iov (rs, SYSOP_TAIL_WRITE, 0, rs->tw.off + rs->tw.done,
             rs->tw.iov.iov_len, &rs->tw.iov, tail_written);
}

static void
tail_write (struct req_state *rs, const char *buf, uint64_t off,
            size_t count, bool fua, req_step *then)
{
  rs->tw.buf = buf;
  rs->tw.off = off;
  rs->tw.count = count;
  rs->tw.done = 0;
  rs->tw.fua = fua;
  rs->tw.page = ROUND_DOWN (off, PDIO_PAGE_SIZE);
  rs->tw.page_end = ROUND_UP (off + count, PDIO_PAGE_SIZE);
  rs->tw.then = then;
  tail_write_more (rs);
}

/* ---- writes ------------------------------------------------------------------ */

static void
write_range_tail (struct req_state *rs)
{
  if (rs->wr.direct < rs->wr.count)
    tail_write (rs, rs->wr.buf + rs->wr.direct, rs->wr.off + rs->wr.direct,
                rs->wr.count - rs->wr.direct, rs->wr.fua, rs->wr.then);
  else
    rs->wr.then (rs);
}

void
req_write_range (struct req_state *rs, const char *buf, uint64_t off,
                 size_t count, bool fua, req_step *then)
{
  const struct pdio_image *img = rs->img;
  /* On FUSE, io_uring drops the sync error of an RWF_DSYNC write: FUA
   * there is the write then fdatasync (write_written).
   */
  int rw_flags = fua && !img->on_fuse ? RWF_DSYNC : 0;
  uint64_t direct_end = engine_direct_end (img, rs->size);

  rs->wr.buf = buf;
  rs->wr.off = off;
  rs->wr.count = count;
  rs->wr.fua = fua;
  rs->wr.then = then;
  rs->wr.direct = 0;
  if (off < direct_end)
    rs->wr.direct = count < direct_end - off ? count : direct_end - off;
  if (rs->wr.direct)
    rw_run (rs, true, (char *) buf, off, rs->wr.direct, rw_flags,
            write_range_tail);
  else
    write_range_tail (rs);
}

static void
write_written (struct req_state *rs)
{
  if ((rs->r->flags & PDIO_FUA) && rs->img->on_fuse)
    req_sync_then (rs, req_done_ok);
  else
    req_finish (rs, 0);
}

static void
write_locked (struct req_state *rs)
{
  req_write_range (rs, rs->r->buf, rs->r->offset, rs->r->count,
                   rs->r->flags & PDIO_FUA, write_written);
}

/* ---- a lock for a write that comes in pieces --------------------------------- */

/* done(0) with the range still held: pdio_unlock releases it. */
static void
lock_held (struct req_state *rs)
{
  rs->err = 0;
  defer_step (rs, call_done);
}

void
pdio_unlock (struct pdio_thread *t, struct pdio_req *r)
{
  struct req_state *rs = state_of (r);

  (void) t;
  assert (r->op == PDIO_OP_LOCK);
  if (rs->locked) {
    rs->locked = false;
    range_lock_release (&rs->img->lock, &rs->lock);
  }
}

/* ---- flush -------------------------------------------------------------------- */

static void
flush_synced (struct req_state *rs, int res)
{
  int r;

  if (res < 0) {
    req_finish (rs, res);
    return;
  }
  /* Durable in a file nobody can reach is not durable. */
  r = engine_check_file (rs->t, rs->arrived, rs->r->arrived != 0, rs->size,
                         0);
  req_finish (rs, r == -ENOSPC ? 0 : r);
}

/* ---- pdio_submit ---------------------------------------------------------------- */

void
pdio_submit (struct pdio_thread *t, struct pdio_req *r)
{
  req_start (t, r, false);
}

void
req_start (struct pdio_thread *t, struct pdio_req *r, bool raw)
{
  struct req_state *rs = state_of (r);
  struct pdio_image *img = t->img;
  int err;

  rs->r = r;
  rs->t = t;
  rs->img = img;
  rs->size = r->flags & PDIO_SIZED ? r->size : pdio_size (img);
  rs->locked = false;
  rs->lock_waiting = false;
  rs->helper_waiting = false;
  rs->bounce = NULL;
  rs->err = 0;
  rs->arrived = r->arrived ? r->arrived : t->round;
  t->requests++;

  if (raw) {
    rw_run (rs, r->op == PDIO_OP_WRITE, r->buf, r->offset, r->count, 0,
            req_done_ok);
    return;
  }
  err = engine_check_range (img, rs->size, r->op, r->offset, r->count);
  if (err) {
    req_finish (rs, err);
    return;
  }

  switch (r->op) {
  case PDIO_OP_READ:
    if (r->count == 0)
      break;
    COUNT (img, reads, 1);
    rw_run (rs, false, r->buf, r->offset, r->count, 0, req_done_ok);
    return;

  /* What changes the image, or holds a span for a front end that will,
   * is checked against a file that may have shrunk under it.
   */
  case PDIO_OP_WRITE:
  case PDIO_OP_ZERO:
  case PDIO_OP_LOCK:
    if (r->count == 0)
      break;
    err = engine_check_file (t, rs->arrived, r->arrived != 0, rs->size,
                             r->offset + r->count);
    if (err)
      break;
    if (r->op == PDIO_OP_WRITE) {
      COUNT (img, writes, 1);
      if (r->flags & PDIO_HELD) {
        write_locked (rs);
        return;
      }
    }
    lock_then (rs, r->offset, r->count,
               r->op == PDIO_OP_WRITE ? write_locked
               : r->op == PDIO_OP_ZERO ? zero_locked : lock_held);
    return;

  case PDIO_OP_TRIM: {
    uint64_t u0, u1;

    engine_whole_units (img, rs->size, r->offset, r->offset + r->count,
                        &u0, &u1);
    if (u0 >= u1 && !(r->flags & PDIO_FUA))
      break;
    lock_then (rs, r->offset, r->count ? r->count : 1, trim_locked);
    return;
  }

  case PDIO_OP_FLUSH:
    COUNT (img, flushes, 1);
    req_issue (rs, SYSOP_FDATASYNC, 0, 0, 0, flush_synced);
    return;

  case PDIO_OP_EXTENTS:
    if (r->count == 0)
      break;
    if (r->extent == NULL || img->geo.blockdev) {
      err = -EINVAL;
      break;
    }
    rs->ext.pos = rs->ext.reported = r->offset;
    rs->ext.end = r->offset + r->count;
    extents_start (rs);
    return;

  default:
    err = -EINVAL;
    break;
  }
  req_finish (rs, err);
}
