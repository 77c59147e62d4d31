/* SPDX-License-Identifier: BSD-3-Clause */
/* The I/O layer: the system calls a request is made of (sysop), how they
 * reach the kernel (on the thread's ring, or synchronously through a
 * backend), and direct transfers described by dio_args run to completion
 * one completion at a time (xfer).
 *
 * Short transfers are resubmitted for the remainder with the accumulated
 * offset (the remainder is rebuilt from the dio_args and a byte count, never
 * by advancing them).  A transfer that stopped off the alignment resumes
 * from the last aligned byte it reached (direct I/O cannot start anywhere
 * else; the partial block is simply transferred again).  EINTR and EAGAIN
 * are retried.  A read that twice stops at the same place without aligned
 * progress has reached end of file (once may be a filesystem's short
 * read): it reports how far it got and the caller zero-fills the rest.
 */
#ifndef PDIO_IO_H
#define PDIO_IO_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/queue.h>
#include <sys/types.h>
#include <sys/uio.h>

#include "dio_args.h"
#include "engine.h"

/* At most this many transfers of one request are in flight (two RMW reads). */
#define IO_MAX_OPS 2
/* Iovecs one transfer may need: a chunk has at most three segments (head
 * bounce block, the client's middle, tail bounce block), each one run of
 * memory and so one iovec; the fourth is spare.
 */
#define IO_MAX_IOV 4
/* Give up on a transfer that keeps failing with EINTR or EAGAIN. */
#define IO_MAX_RETRIES 1000

struct pdio_thread;

/* Work the thread runs from pdio_thread_poll, in FIFO order. */
struct thread_work {
  STAILQ_ENTRY (thread_work) link;
  void (*fn) (struct thread_work *w);
};

/* Queues w on t.  thread_defer: from t's own thread only.
 * thread_defer_any: from any thread (wakes t if it sleeps in poll).
 */
extern void thread_defer (struct pdio_thread *t, struct thread_work *w);
extern void thread_defer_any (struct pdio_thread *t, struct thread_work *w);

enum sysop_kind {
  SYSOP_READV,                  /* O_DIRECT fd */
  SYSOP_WRITEV,                 /* O_DIRECT fd */
  SYSOP_FDATASYNC,              /* O_DIRECT fd */
  SYSOP_FALLOCATE,              /* O_DIRECT fd; flags = mode */
  SYSOP_TAIL_WRITE,             /* buffered tail fd; iov[0] only */
  SYSOP_TAIL_SYNC_RANGE,        /* tail fd; flags = SYNC_FILE_RANGE_* */
  SYSOP_TAIL_FADVISE,           /* tail fd; flags = POSIX_FADV_* */
};

/* One system call.  The result (bytes or -errno) goes to comp.fn, always
 * from pdio_thread_poll.
 */
struct sysop {
  struct pdio_completion comp;
  enum sysop_kind kind;
  int flags;                    /* RWF_*, fallocate mode, ... */
  uint64_t offset, len;
  const struct iovec *iov;
  int iovcnt;
  /* Synchronous backends: the deferred call and its result. */
  struct thread_work work;
  struct pdio_thread *t;
  int res;
};

/* A backend that does the system calls itself, synchronously (psync: the
 * real ones; the tests' memory disk).  Returns bytes or -errno.
 */
struct io_backend {
  const char *name;
  ssize_t (*run) (void *state, const struct sysop *op);
};
extern const struct io_backend backend_psync;

/* The fds backend_psync works on. */
struct psync_files {
  int fd, tail_fd;
};

/* Hands op to the kernel: an SQE on t's ring, or the synchronous backend
 * from t's deferred work.
 */
extern void thread_issue (struct pdio_thread *t, struct sysop *op);

/* Fills sqe for op (backend_uring.c).  fixed_file: the image is file 0;
 * buf_index >= 0: op's single iovec lies in that registered buffer.
 */
struct io_uring_sqe;
extern void uring_prep (struct io_uring_sqe *sqe, const struct sysop *op,
                        int fd, int tail_fd, bool fixed_file, int buf_index);

struct io_counters {
  _Atomic uint64_t short_io;
};

/* One logical direct transfer: segs follow each other in the file. */
struct xfer {
  struct pdio_thread *t;
  struct io_counters *counters;
  bool write;
  int rw_flags;
  uint32_t align;               /* of the file offsets, for resuming */
  struct dio_args segs[3];
  unsigned nsegs;
  size_t total;
  size_t done;                  /* out: bytes transferred */
  int err;                      /* out: 0 or -errno */
  size_t stalled_at;            /* where a read last stopped without
                                   aligned progress */
  unsigned retries;
  struct iovec iov[IO_MAX_IOV];
  struct sysop op;
  void (*finished) (struct xfer *x);
  void *owner;                  /* the finished callback's */
};

/* Starts x (its segs, nsegs, write, rw_flags, align, t, counters and
 * finished set); x->finished(x) runs from poll when it is over: done is
 * the whole length, or less for a read that met end of file, or err is
 * set.
 */
extern void xfer_start (struct xfer *x);

#endif /* PDIO_IO_H */
