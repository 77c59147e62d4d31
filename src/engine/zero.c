/* SPDX-License-Identifier: BSD-3-Clause */
/* Write-zeroes and trim: FS-block mapping, as steps of a request (req.h).
 *
 * fallocate only ever sees whole allocation units (fs blocks of a file,
 * logical blocks of a device): on a partial block, filesystems zero through
 * the page cache, which is exactly what pdio must not touch.  The partial
 * edges are written as zeroes with direct I/O instead.  Zeroing tries, in
 * order, punching a hole (when the client allows deallocation), ZERO_RANGE,
 * then punch + allocate, remembering which modes the filesystem refused;
 * when none works, a fast-zero request fails with ENOTSUP before anything
 * is changed and any other writes zeroes from the engine's zero pages.
 * Every fallocate is an io_uring op (IORING_OP_FALLOCATE) on the ring.
 */
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <linux/falloc.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include "container_of.h"
#include "req.h"
#include "rounding.h"

static bool
unsupported (int err)
{
  return err == EOPNOTSUPP || err == ENOTSUP || err == ENOSYS;
}

void
engine_whole_units (const struct pdio_image *img, uint64_t size,
                    uint64_t offset, uint64_t end, uint64_t *u0,
                    uint64_t *u1)
{
  uint64_t grain = img->geo.blockdev ? img->geo.offset_align
                                     : img->geo.fs_block;
  uint64_t limit = ROUND_DOWN (size, grain);

  *u0 = ROUND_UP (offset, grain);
  *u1 = ROUND_DOWN (end, grain);
  if (*u1 > limit)
    *u1 = limit;
  if (*u0 > *u1)
    *u0 = *u1;
}

/* ---- writing zeroes --------------------------------------------------------- */

static void wz_piece (struct req_state *rs);

static void
wz_piece_done (struct req_state *rs)
{
  COUNT (rs->img, zero_written, rs->wz.piece_end - rs->wz.pos);
  rs->wz.pos = rs->wz.piece_end;
  wz_piece (rs);
}

static void
wz_piece (struct req_state *rs)
{
  const struct pdio_image *img = rs->img;
  const uint32_t mask = img->geo.mem_align - 1;
  uint64_t pos = rs->wz.pos, end;

  if (pos >= rs->wz.end) {
    rs->wz.then (rs);
    return;
  }
  end = ROUND_DOWN (pos + ZERO_LEN, img->geo.offset_align);
  if (end <= pos)
    end = pos + ZERO_LEN;
  if (end > rs->wz.end)
    end = rs->wz.end;
  rs->wz.piece_end = end;
  /* Zero pages read the same from any address: pick the one that lines up
   * with the offset, so the aligned middle goes direct.
   */
  req_write_range (rs, img->zero_mem + (pos & mask), pos, end - pos, false,
                   wz_piece_done);
}

/* Writes zeroes over [from, to) under the request's lock, then `then`. */
static void
write_zeroes (struct req_state *rs, uint64_t from, uint64_t to,
              req_step *then)
{
  rs->wz.pos = from;
  rs->wz.end = to;
  rs->wz.then = then;
  wz_piece (rs);
}

/* ---- zero ----------------------------------------------------------------- */

static void
zero_finished (struct req_state *rs)
{
  if (rs->r->flags & PDIO_FUA)
    req_sync_then (rs, req_done_ok);
  else
    req_finish (rs, 0);
}

static void
zero_tail_edge (struct req_state *rs)
{
  write_zeroes (rs, rs->u1, rs->r->offset + rs->r->count, zero_finished);
}

static void
zero_edges (struct req_state *rs)
{
  write_zeroes (rs, rs->r->offset, rs->u0, zero_tail_edge);
}

static void zero_fallocate_next (struct req_state *rs);

static void
zero_allocated (struct req_state *rs, int res)
{
  /* If allocating again failed the hole still reads as zeroes, which is
   * what was asked.
   */
  (void) res;
  COUNT (rs->img, zero_fallocate, 1);
  zero_edges (rs);
}

static void
zero_fallocated (struct req_state *rs, int res)
{
  struct pdio_image *img = rs->img;
  const int keep = FALLOC_FL_KEEP_SIZE;

  if (res == 0) {
    /* Punch + allocate: allocate again so later writes do not hit ENOSPC
     * unexpectedly.
     */
    if (!img->geo.blockdev && rs->zstep == 3 &&
        !(rs->r->flags & PDIO_MAY_TRIM)) {
      req_issue (rs, SYSOP_FALLOCATE, keep, rs->u0, rs->u1 - rs->u0,
                 zero_allocated);
      return;
    }
    COUNT (img, zero_fallocate, 1);
    zero_edges (rs);
    return;
  }
  if (unsupported (-res)) {
    if (!img->geo.blockdev)
      atomic_store (rs->zmode & FALLOC_FL_PUNCH_HOLE ? &img->no_punch
                                                     : &img->no_zero_range,
                    true);
    zero_fallocate_next (rs);
    return;
  }
  req_finish (rs, res);
}

/* The next fallocate mode worth trying on the whole units, or, when none
 * is left, the fallback.
 */
static void
zero_fallocate_next (struct req_state *rs)
{
  struct pdio_image *img = rs->img;
  const unsigned flags = rs->r->flags;
  const int keep = FALLOC_FL_KEEP_SIZE;

  for (;;) {
    unsigned step = rs->zstep++;
    int mode = 0;

    if (img->geo.blockdev) {
      /* On a block device PUNCH_HOLE never falls back to writing zeroes
       * (BLKDEV_ZERO_NOFALLBACK) while ZERO_RANGE may: the first is the
       * fast one.
       */
      if (step == 0)
        mode = FALLOC_FL_PUNCH_HOLE;
      else if (step == 1 && !(flags & PDIO_FAST_ZERO))
        mode = FALLOC_FL_ZERO_RANGE;
      else if (step > 1)
        break;
    }
    else if (step == 0) {
      if ((flags & PDIO_MAY_TRIM) && !atomic_load (&img->no_punch))
        mode = FALLOC_FL_PUNCH_HOLE;
    }
    else if (step == 1) {
      if (!atomic_load (&img->no_zero_range))
        mode = FALLOC_FL_ZERO_RANGE;
    }
    else if (step == 2) {
      if (!atomic_load (&img->no_punch))
        mode = FALLOC_FL_PUNCH_HOLE;
    }
    else
      break;
    if (mode) {
      rs->zmode = mode;
      req_issue (rs, SYSOP_FALLOCATE, mode | keep, rs->u0, rs->u1 - rs->u0,
                 zero_fallocated);
      return;
    }
  }
  if (flags & PDIO_FAST_ZERO) {
    req_finish (rs, -ENOTSUP);  /* before anything was changed */
    return;
  }
  write_zeroes (rs, rs->u0, rs->u1, zero_edges);
}

void
zero_locked (struct req_state *rs)
{
  const uint64_t end = rs->r->offset + rs->r->count;

  engine_whole_units (rs->img, rs->size, rs->r->offset, end, &rs->u0,
                      &rs->u1);
  if (rs->u0 < rs->u1) {
    rs->zstep = 0;
    zero_fallocate_next (rs);
  }
  else {
    rs->u0 = rs->u1 = end;
    zero_edges (rs);
  }
}

/* ---- trim ------------------------------------------------------------------ */

/* Trim is advisory: only whole units are deallocated, partial edges are
 * left alone, and a filesystem that cannot punch holes ignores it.
 */
static void
trim_done (struct req_state *rs, int res)
{
  if (res < 0)
    req_finish (rs, res);
  else if (rs->r->flags & PDIO_FUA)
    req_sync_then (rs, req_done_ok);
  else
    req_finish (rs, 0);
}

static void
trim_punched (struct req_state *rs, int res)
{
  if (unsupported (-res)) {
    atomic_store (&rs->img->no_punch, true);
    res = 0;
  }
  else if (res == 0)
    COUNT (rs->img, zero_fallocate, 1);
  trim_done (rs, res);
}

/* The most one BLKDISCARD asks of the device.  A trim may be 4 GiB, and
 * the image has one helper thread: every BLOCK_STATUS of the image would
 * wait behind one ioctl for all of it.  In pieces, the other jobs queued
 * meanwhile run between two of them (the helper is FIFO).
 */
#define DISCARD_PIECE ((uint64_t) 64 << 20)

/* On the helper thread. */
static void
discard_run (struct helper_job *j)
{
  struct req_state *rs = container_of (j, struct req_state, job);

  rs->discard.res = 0;
  if (ioctl (rs->img->fd, BLKDISCARD, rs->discard.range) == -1 &&
      !unsupported (errno))
    rs->discard.res = -errno;
}

static void
discard_next (struct req_state *rs)
{
  uint64_t len = rs->discard.end - rs->discard.pos;

  rs->discard.range[0] = rs->discard.pos;
  rs->discard.range[1] = len < DISCARD_PIECE ? len : DISCARD_PIECE;
  rs->discard.pos += rs->discard.range[1];
  rs->helper_waiting = true;
  helper_queue (rs->img, &rs->job);
}

/* Back on the request's thread, from poll. */
static void
discard_done (struct thread_work *w)
{
  struct req_state *rs = container_of (w, struct req_state, job.done);

  rs->helper_waiting = false;
  if (rs->discard.res == 0 && rs->discard.pos < rs->discard.end)
    discard_next (rs);
  else
    trim_done (rs, rs->discard.res);
}

void
trim_locked (struct req_state *rs)
{
  struct pdio_image *img = rs->img;
  uint64_t u0, u1;

  engine_whole_units (img, rs->size, rs->r->offset,
                      rs->r->offset + rs->r->count, &u0, &u1);
  if (u0 < u1 && img->geo.blockdev) {
    /* No io_uring opcode for a discard on the kernels we support, and the
     * ioctl waits for the device: on the helper thread.
     */
    rs->discard.pos = u0;
    rs->discard.end = u1;
    rs->job.run = discard_run;
    rs->job.t = rs->t;
    rs->job.done.fn = discard_done;
    discard_next (rs);
  }
  else if (u0 < u1 && !atomic_load (&img->no_punch))
    req_issue (rs, SYSOP_FALLOCATE,
               FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, u0, u1 - u0,
               trim_punched);
  else
    trim_done (rs, 0);
}
