/* SPDX-License-Identifier: BSD-3-Clause */
/* The io_uring backend: how each system call of a request becomes an SQE
 * on the thread's ring (thread.c owns the ring and dispatches the CQEs).
 * The image is fixed file 0 where registering it worked, and the pool's
 * chunks in use are fixed buffers; a transfer that is one run within a
 * registered chunk goes as READ/WRITE_FIXED (no per-I/O page pinning),
 * another single run as READ/WRITE, anything else as READV/WRITEV.
 * fdatasync, fallocate and the tail's sync_file_range and fadvise are
 * io_uring opcodes too.  What has no opcode runs on the engine's helper
 * thread (helper.c: SEEK_DATA/SEEK_HOLE, BLKDISCARD), so no step of a
 * request blocks the thread, with one exception: the fstat of the file
 * check of writes, zeroes and flushes (engine_check_file), inline, one
 * for all the requests that had arrived when it was made.
 */
#include <config.h>

#include <fcntl.h>
#include <liburing.h>

#include "io.h"

void
uring_prep (struct io_uring_sqe *sqe, const struct sysop *op, int fd,
            int tail_fd, bool fixed_file, int buf_index)
{
  int target = fixed_file ? 0 : fd;

  switch (op->kind) {
  case SYSOP_READV:
  case SYSOP_WRITEV:
    if (buf_index >= 0) {
      if (op->kind == SYSOP_WRITEV)
        io_uring_prep_write_fixed (sqe, target, op->iov[0].iov_base,
                                   op->iov[0].iov_len, op->offset, buf_index);
      else
        io_uring_prep_read_fixed (sqe, target, op->iov[0].iov_base,
                                  op->iov[0].iov_len, op->offset, buf_index);
      sqe->rw_flags = op->flags;
    }
    else if (op->iovcnt == 1) {
      /* One run (an aligned request, a bounce slice): the plain op, no
       * iovec for the kernel to copy in.
       */
      if (op->kind == SYSOP_WRITEV)
        io_uring_prep_write (sqe, target, op->iov[0].iov_base,
                             op->iov[0].iov_len, op->offset);
      else
        io_uring_prep_read (sqe, target, op->iov[0].iov_base,
                            op->iov[0].iov_len, op->offset);
      sqe->rw_flags = op->flags;
    }
    else if (op->kind == SYSOP_WRITEV)
      io_uring_prep_writev2 (sqe, target, op->iov, op->iovcnt, op->offset,
                             op->flags);
    else
      io_uring_prep_readv2 (sqe, target, op->iov, op->iovcnt, op->offset,
                            op->flags);
    break;
  case SYSOP_FDATASYNC:
    io_uring_prep_fsync (sqe, target, IORING_FSYNC_DATASYNC);
    break;
  case SYSOP_FALLOCATE:
    io_uring_prep_fallocate (sqe, target, op->flags, op->offset, op->len);
    break;
  case SYSOP_TAIL_WRITE:
    io_uring_prep_write (sqe, tail_fd, op->iov[0].iov_base,
                         op->iov[0].iov_len, op->offset);
    return;
  case SYSOP_TAIL_SYNC_RANGE:
    io_uring_prep_sync_file_range (sqe, tail_fd, op->len, op->offset,
                                   op->flags);
    return;
  case SYSOP_TAIL_FADVISE:
    io_uring_prep_fadvise (sqe, tail_fd, op->offset, op->len, op->flags);
    return;
  }
  if (fixed_file)
    sqe->flags |= IOSQE_FIXED_FILE;
}
