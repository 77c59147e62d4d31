/* SPDX-License-Identifier: BSD-3-Clause */
/* One request as a state machine (req.c; zero and trim in zero.c).
 *
 * Every step either queues I/O and returns, or goes straight on to the
 * next step; nothing sleeps.  A step that waits names the step that comes
 * next (a continuation), and the completion, the range lock grant or the
 * pool calls it from pdio_thread_poll.  The steps of a write:
 *
 *   range lock -> per chunk: [bounce memory] -> [RMW reads] -> copy in ->
 *   transfer -> [tail write: write, sync_file_range, (fdatasync), fadvise]
 *   -> [fdatasync: FUA on FUSE] -> unlock -> done()
 *
 * Reads take no lock and copy out after the transfer; zeroes run a
 * fallocate chain and write zeroes for the partial edges; every error goes
 * to req_finish, which gives back what is held.
 */
#ifndef PDIO_REQ_H
#define PDIO_REQ_H

#include "engine_internal.h"
#include "plan.h"

/* Extents one helper-thread trip finds at most. */
#define EXT_BATCH 32

struct req_state;
typedef void req_step (struct req_state *rs);
typedef void req_op_step (struct req_state *rs, int res);

struct req_state {
  struct pdio_req *r;
  struct pdio_thread *t;
  struct pdio_image *img;
  uint64_t size;                /* the image's size as the request started */
  struct thread_work work;      /* resumes `resume` from poll */
  req_step *resume;
  int err;
  uint64_t arrived;             /* the round the file check may reuse */

  struct range_lock_entry lock;
  bool locked;
  bool lock_waiting;            /* queued behind another range */
  bool helper_waiting;          /* a call of it runs on the helper thread */
  struct helper_job job;
  req_step *after_lock;

  /* write_range: a write of any range, direct part then image tail. */
  struct {
    const char *buf;
    uint64_t off;
    size_t count, direct;
    bool fua;
    req_step *then;
  } wr;

  /* rw: the direct part, chunk by chunk as the planner says. */
  struct {
    bool write;
    char *buf;
    uint64_t off;
    size_t count, done;
    int rw_flags;
    req_step *then;
  } rw;
  struct plan_chunk chunk;
  char *bounce;                 /* this chunk's, from the pool */
  size_t bounce_len;
  struct bounce_wait bwait;
  /* A request's transfers, or (extents, discard) its helper-thread call:
   * never both.
   */
  union {
    struct xfer xf[IO_MAX_OPS];
    /* Extents: [pos, end) is left to map, reported is where the next
     * extent reported starts; a batch found by the helper thread.
     */
    struct {
      uint64_t pos, end, reported;
      uint64_t len[EXT_BATCH];
      bool hole[EXT_BATCH];
      unsigned n;
      int err;
    } ext;
    /* Trim of a block device: [pos, end) left to discard, BLKDISCARD's
     * range for the piece on the helper thread, and its result.
     */
    struct {
      uint64_t pos, end;
      uint64_t range[2];
      int res;
    } discard;
  };
  unsigned xf_pending;
  req_step *after_xfer;

  /* The sub-alignment tail of the image, through the buffered fd. */
  struct {
    const char *buf;
    uint64_t off, page, page_end;
    size_t count, done;
    bool fua;
    struct iovec iov;
    req_step *then;
  } tw;

  /* The request's one other system call in flight. */
  struct sysop op;
  req_op_step *after_op;
  req_step *after_sync;

  /* Zero: whole allocation units [u0, u1), the fallocate chain's step and
   * mode, and the write-zeroes cursor.
   */
  uint64_t u0, u1;
  unsigned zstep;
  int zmode;
  struct {
    uint64_t pos, end, piece_end;
    req_step *then;
  } wz;
};

/* Gives back the bounce memory and range held, then done(err) from poll. */
extern void req_finish (struct req_state *rs, int err);
extern req_step req_done_ok;
/* Queues one system call; after(rs, res) from poll. */
extern void req_issue (struct req_state *rs, enum sysop_kind kind, int flags,
                       uint64_t offset, uint64_t len, req_op_step *after);
/* fdatasync, then `then` (or req_finish with its error). */
extern void req_sync_then (struct req_state *rs, req_step *then);
/* Writes [off, off+count) from buf under the request's lock. */
extern void req_write_range (struct req_state *rs, const char *buf,
                             uint64_t off, size_t count, bool fua,
                             req_step *then);

/* zero.c */
extern req_step zero_locked, trim_locked;
/* extents.c: the next batch of rs->ext on the helper thread. */
extern req_step extents_start;

#endif /* PDIO_REQ_H */
