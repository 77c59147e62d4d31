/* SPDX-License-Identifier: BSD-3-Clause */
/* The psync backend: the same system calls done synchronously on the same
 * fds (preadv2/pwritev2 on the O_DIRECT one), for kernels and sandboxes
 * that refuse io_uring and for FUSE, where io_uring mishandles short
 * direct transfers.  thread.c runs them from poll, so completions still
 * arrive the way they do from the ring.
 */
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <sys/uio.h>
#include <unistd.h>

#include "io.h"

static ssize_t
psync_run (void *state, const struct sysop *op)
{
  const struct psync_files *f = state;
  ssize_t r = 0;

  switch (op->kind) {
  case SYSOP_READV:
    r = preadv2 (f->fd, op->iov, op->iovcnt, op->offset, op->flags);
    break;
  case SYSOP_WRITEV:
    r = pwritev2 (f->fd, op->iov, op->iovcnt, op->offset, op->flags);
    break;
  case SYSOP_FDATASYNC:
    r = fdatasync (f->fd);
    break;
  case SYSOP_FALLOCATE:
    r = fallocate (f->fd, op->flags, op->offset, op->len);
    break;
  case SYSOP_TAIL_WRITE:
    r = pwrite (f->tail_fd, op->iov[0].iov_base, op->iov[0].iov_len,
                op->offset);
    break;
  case SYSOP_TAIL_SYNC_RANGE:
    r = sync_file_range (f->tail_fd, op->offset, op->len, op->flags);
    break;
  case SYSOP_TAIL_FADVISE:
    /* Returns the error number itself. */
    return -posix_fadvise (f->tail_fd, op->offset, op->len, op->flags);
  }
  return r < 0 ? -errno : r;
}

const struct io_backend backend_psync = {
  .name = "psync",
  .run = psync_run,
};
