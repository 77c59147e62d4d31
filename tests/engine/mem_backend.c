/* SPDX-License-Identifier: BSD-3-Clause */
/* mem_backend; see mem_backend.h. */
#include <config.h>

#include <errno.h>
#include <string.h>

#include "mem_backend.h"

static bool
aligned (const struct mem_disk *d, const struct sysop *s)
{
  int i;

  if (s->offset % d->align)
    return false;
  for (i = 0; i < s->iovcnt; i++)
    if (s->iov[i].iov_len % d->align ||
        (uintptr_t) s->iov[i].iov_base % d->mem_align)
      return false;
  return true;
}

static ssize_t
transfer (struct mem_disk *d, const struct sysop *s)
{
  const bool write = s->kind == SYSOP_WRITEV;
  size_t want = 0, done = 0;
  int i;

  d->transfers++;
  if (!aligned (d, s)) {
    d->violations++;
    return -EINVAL;
  }
  if (d->eagain_every && d->transfers % d->eagain_every == 0)
    return -EAGAIN;
  if (d->eio_every && d->transfers % d->eio_every == 0)
    return -EIO;
  for (i = 0; i < s->iovcnt; i++)
    want += s->iov[i].iov_len;
  /* Short by whole blocks, as the kernel's direct I/O would be, or (every
   * other time) anywhere, as FUSE or a network filesystem may be.
   */
  if (d->short_every && d->transfers % d->short_every == 0 &&
      want >= 2 * d->align)
    want = d->transfers % 2 ? want / 2 + 7 : (want / 2) / d->align * d->align;

  for (i = 0; i < s->iovcnt && done < want; i++) {
    size_t n = s->iov[i].iov_len;
    uint64_t off = s->offset + done;

    if (n > want - done)
      n = want - done;
    if (write) {
      if (off + n > d->size)
        return done ? (ssize_t) done : -ENOSPC;
      memcpy (d->data + off, s->iov[i].iov_base, n);
    }
    else {
      if (off >= d->size)
        break;
      if (off + n > d->size)
        n = d->size - off;
      memcpy (s->iov[i].iov_base, d->data + off, n);
    }
    done += n;
  }
  return done;
}

static ssize_t
mem_run (void *state, const struct sysop *op)
{
  switch (op->kind) {
  case SYSOP_READV:
  case SYSOP_WRITEV:
    return transfer (state, op);
  case SYSOP_FDATASYNC:
    return 0;
  default:                      /* the planner's tests use no others */
    return -EOPNOTSUPP;
  }
}

const struct io_backend mem_backend = {
  .name = "mem",
  .run = mem_run,
};
