/* SPDX-License-Identifier: BSD-3-Clause */
/* Extents: which parts of a file are data and which are holes, from
 * SEEK_DATA/SEEK_HOLE.  The fd's file position is never used for I/O, so
 * concurrent lseeks need no lock.  Anything past the current end of file
 * (the file may have shrunk) is reported as a hole.
 *
 * lseek has no io_uring opcode and may block (a round trip on FUSE or
 * NFS; up to 509 pairs for one BLOCK_STATUS), so an EXTENTS request runs
 * its lseeks on the helper thread (helper.c), EXT_BATCH extents per trip,
 * and reports them from the submitting thread's poll.  pdio_extents is
 * the same walk, blocking, for callers whose threads may block.
 */
#include <config.h>

#include <errno.h>
#include <unistd.h>

#include "container_of.h"
#include "req.h"

/* The extent that starts at pos (< end): its end and kind.  0 or -errno. */
static int
extent_at (int fd, uint64_t pos, uint64_t end, uint64_t *nextp, bool *hole)
{
  off_t next = lseek (fd, pos, SEEK_DATA);

  if (next == -1 && errno != ENXIO)
    return -errno;
  if (next == -1 || (uint64_t) next > pos) {
    *hole = true;                       /* a hole up to the next data */
    if (next == -1 || (uint64_t) next > end)
      next = end;
  }
  else {
    *hole = false;                      /* data up to the next hole */
    next = lseek (fd, pos, SEEK_HOLE);
    if (next == -1 && errno != ENXIO)
      return -errno;
    /* Data is always a safe answer, also if a hole just appeared. */
    if (next == -1 || (uint64_t) next > end || (uint64_t) next <= pos)
      next = end;
  }
  *nextp = next;
  return 0;
}

int
pdio_extents (struct pdio_image *img, size_t count, uint64_t offset,
              bool req_one, pdio_extent_fn add, void *opaque)
{
  const uint64_t end = offset + count;
  uint64_t pos = offset;
  int r = pdio_check_range (img, PDIO_OP_EXTENTS, offset, count);

  if (r < 0)
    return r;

  while (pos < end) {
    uint64_t next;
    bool hole;

    r = extent_at (img->fd, pos, end, &next, &hole);
    if (r < 0)
      return r;
    r = add (opaque, pos, next - pos, hole);
    if (r != 0)
      return r < 0 ? r : 0;
    pos = next;
    if (req_one)
      break;
  }
  return 0;
}

/* ---- PDIO_OP_EXTENTS ------------------------------------------------------ */

/* On the helper thread: the next batch. */
static void
ext_run (struct helper_job *j)
{
  struct req_state *rs = container_of (j, struct req_state, job);
  const unsigned max = (rs->r->flags & PDIO_REQ_ONE) ? 1 : EXT_BATCH;

  rs->ext.n = 0;
  rs->ext.err = 0;
  while (rs->ext.pos < rs->ext.end && rs->ext.n < max) {
    uint64_t next;
    bool hole;
    int r = extent_at (rs->img->fd, rs->ext.pos, rs->ext.end, &next, &hole);

    if (r < 0) {
      rs->ext.err = r;
      break;
    }
    rs->ext.len[rs->ext.n] = next - rs->ext.pos;
    rs->ext.hole[rs->ext.n++] = hole;
    rs->ext.pos = next;
  }
}

/* Back on the request's thread, from poll: report, then the next batch. */
static void
ext_batch_done (struct thread_work *w)
{
  struct req_state *rs = container_of (w, struct req_state, job.done);
  struct pdio_req *r = rs->r;
  uint64_t off = rs->ext.reported;
  unsigned i;

  rs->helper_waiting = false;
  for (i = 0; i < rs->ext.n; i++) {
    int res = r->extent (r->opaque, off, rs->ext.len[i], rs->ext.hole[i]);

    if (res != 0) {
      req_finish (rs, res < 0 ? res : 0);
      return;
    }
    off += rs->ext.len[i];
  }
  rs->ext.reported = off;
  if (rs->ext.err || rs->ext.pos >= rs->ext.end ||
      (r->flags & PDIO_REQ_ONE)) {
    req_finish (rs, rs->ext.err);
    return;
  }
  extents_start (rs);
}

void
extents_start (struct req_state *rs)
{
  rs->job.run = ext_run;
  rs->job.t = rs->t;
  rs->job.done.fn = ext_batch_done;
  rs->helper_waiting = true;
  helper_queue (rs->img, &rs->job);
}
