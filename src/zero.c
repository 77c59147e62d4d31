/* Write-zeroes and trim: FS-block mapping.
 *
 * fallocate only ever sees whole allocation units (fs blocks of a file,
 * logical blocks of a device): on a partial block, filesystems zero through
 * the page cache, which is exactly what pdio must not touch.  The partial
 * edges are written as zeroes with direct I/O instead.  Zeroing tries, in
 * order, punching a hole (when the client allows deallocation), ZERO_RANGE,
 * then punch + allocate, remembering which modes the filesystem refused;
 * when none works, a fast-zero request fails with ENOTSUP before anything
 * is changed and any other writes zeroes from the engine's zero pages.
 */
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <linux/falloc.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include "engine_internal.h"

static bool
unsupported (int err)
{
  return err == EOPNOTSUPP || err == ENOTSUP || err == ENOSYS;
}

/* Tries one fallocate mode; 0, -EOPNOTSUPP (remembered in *no), -errno. */
static int
try_fallocate (atomic_bool *no, int fd, int mode, uint64_t off, uint64_t len)
{
  if (no && atomic_load (no))
    return -EOPNOTSUPP;
  if (fallocate (fd, mode, off, len) == 0)
    return 0;
  if (unsupported (errno)) {
    if (no)
      atomic_store (no, true);
    return -EOPNOTSUPP;
  }
  return -errno;
}

/* Zeroes whole allocation units [off, off+len) without writing data. */
static int
zero_fallocate (struct pdio_image *img, uint64_t off, uint64_t len,
                unsigned flags)
{
  const int keep = FALLOC_FL_KEEP_SIZE;
  int r = -EOPNOTSUPP;

  if (img->geo.blockdev) {
    /* On a block device PUNCH_HOLE never falls back to writing zeroes
     * (BLKDEV_ZERO_NOFALLBACK) while ZERO_RANGE may: the first is the
     * fast one.
     */
    r = try_fallocate (NULL, img->fd, FALLOC_FL_PUNCH_HOLE | keep, off, len);
    if (r == -EOPNOTSUPP && !(flags & PDIO_FAST_ZERO))
      r = try_fallocate (NULL, img->fd, FALLOC_FL_ZERO_RANGE | keep, off,
                         len);
    return r;
  }

  if (flags & PDIO_MAY_TRIM)
    r = try_fallocate (&img->no_punch, img->fd,
                       FALLOC_FL_PUNCH_HOLE | keep, off, len);
  if (r == -EOPNOTSUPP)
    r = try_fallocate (&img->no_zero_range, img->fd,
                       FALLOC_FL_ZERO_RANGE | keep, off, len);
  if (r == -EOPNOTSUPP) {
    r = try_fallocate (&img->no_punch, img->fd,
                       FALLOC_FL_PUNCH_HOLE | keep, off, len);
    /* Allocate again so later writes do not hit ENOSPC unexpectedly; if
     * that fails the hole still reads as zeroes, which is what was asked.
     */
    if (r == 0 && !(flags & PDIO_MAY_TRIM))
      (void) fallocate (img->fd, keep, off, len);
  }
  return r;
}

/* Allocation units lying wholly inside [offset, end), never past the last
 * whole one of a file.
 */
static void
whole_units (const struct pdio_image *img, uint64_t offset, uint64_t end,
             uint64_t *u0, uint64_t *u1)
{
  uint64_t grain = img->geo.blockdev ? img->geo.offset_align
                                     : img->geo.fs_block;
  uint64_t limit = round_down (img->geo.size, grain);

  *u0 = round_up (offset, grain);
  *u1 = round_down (end, grain);
  if (*u1 > limit)
    *u1 = limit;
  if (*u0 > *u1)
    *u0 = *u1;
}

static int
zero_locked (struct pdio_image *img, struct io_ctx *ctx, uint64_t offset,
             uint64_t count, unsigned flags)
{
  const uint64_t end = offset + count;
  uint64_t u0, u1;
  int r;

  whole_units (img, offset, end, &u0, &u1);
  if (u0 < u1) {
    r = zero_fallocate (img, u0, u1 - u0, flags);
    if (r == -EOPNOTSUPP) {
      if (flags & PDIO_FAST_ZERO)
        return -ENOTSUP;
      r = engine_write_zeroes (img, ctx, u0, u1 - u0);
    }
    else if (r == 0)
      COUNT (img, zero_fallocate, 1);
    if (r < 0)
      return r;
  }
  else
    u0 = u1 = end;
  if (offset < u0 && (r = engine_write_zeroes (img, ctx, offset,
                                               u0 - offset)) < 0)
    return r;
  if (u1 < end && (r = engine_write_zeroes (img, ctx, u1, end - u1)) < 0)
    return r;
  return 0;
}

int
pdio_zero (struct pdio_image *img, size_t count, uint64_t offset,
           unsigned flags)
{
  struct range_lock_entry lock;
  struct io_ctx *ctx;
  int r;

  r = engine_begin_write (img, offset, count, &lock, &ctx);
  if (r != 0)
    return r < 0 ? r : 0;
  r = zero_locked (img, ctx, offset, count, flags);
  if (r == 0 && (flags & PDIO_FUA) && fdatasync (img->fd) == -1)
    r = -errno;
  range_lock_release (&img->lock, &lock);
  return r;
}

/* Trim is advisory: only whole units are deallocated, partial edges are
 * left alone, and a filesystem that cannot punch holes ignores it.
 */
int
pdio_trim (struct pdio_image *img, size_t count, uint64_t offset,
           unsigned flags)
{
  struct range_lock_entry lock;
  uint64_t u0, u1;
  int r = 0;

  if (img->readonly)
    return -EPERM;
  if (offset > img->geo.size || count > img->geo.size - offset)
    return -EINVAL;
  whole_units (img, offset, offset + count, &u0, &u1);
  if (u0 >= u1 && !(flags & PDIO_FUA))
    return 0;

  engine_lock_write (img, &lock, offset, count ? count : 1);
  if (u0 < u1 && img->geo.blockdev) {
    uint64_t range[2] = { u0, u1 - u0 };

    if (ioctl (img->fd, BLKDISCARD, range) == -1 && !unsupported (errno))
      r = -errno;
  }
  else if (u0 < u1) {
    r = try_fallocate (&img->no_punch, img->fd,
                       FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                       u0, u1 - u0);
    if (r == -EOPNOTSUPP)
      r = 0;
    else if (r == 0)
      COUNT (img, zero_fallocate, 1);
  }
  if (r == 0 && (flags & PDIO_FUA) && fdatasync (img->fd) == -1)
    r = -errno;
  range_lock_release (&img->lock, &lock);
  return r;
}
