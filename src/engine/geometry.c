/* SPDX-License-Identifier: BSD-3-Clause */
/* Geometry: the direct-I/O constraints of this exact file.
 *
 * In order of trust: statx(STATX_DIOALIGN) for regular files (Linux 6.1+,
 * plus the separate read alignment of newer kernels), the BLK* ioctls for
 * block devices, then a probe by trial reads of an allocated block, then
 * 4096.  A probe must never read a hole: an unallocated block reads fine at
 * any alignment and would prove nothing.
 */
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <linux/fs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "geometry.h"
#include "ispowerof2.h"
#include "pagesize.h"
#include "rounding.h"

/* Newer than Debian 12's headers: reads may need less alignment than
 * writes (Linux 6.14+).  The field sits at offset 0xb4 of struct statx.
 */
#ifndef STATX_DIO_READ_ALIGN
#define STATX_DIO_READ_ALIGN 0x00020000U
#endif
#define STATX_DIO_READ_ALIGN_OFFSET 0xb4

#define FALLBACK_ALIGN 4096u

static uint32_t
statx_read_align (const struct statx *stx)
{
  uint32_t v;

  memcpy (&v, (const char *) stx + STATX_DIO_READ_ALIGN_OFFSET, sizeof v);
  return v;
}

/* Can we read one block of len bytes at offset off with O_DIRECT? */
static bool
trial_read (int fd, uint64_t off, uint32_t len, void *page_buf)
{
  ssize_t r;

  do
    r = pread (fd, page_buf, len, off);
  while (r == -1 && errno == EINTR);
  return r >= 0;
}

/* Finds the smallest alignment at which a direct read of allocated data
 * works.  Returns 0 if the file holds no data to probe with.
 */
static uint32_t
probe_align (int fd, uint64_t size)
{
  off_t data;
  void *buf;
  uint32_t align, found = 0;

  data = lseek (fd, 0, SEEK_DATA);
  if (data == -1 || (uint64_t) data >= size)
    return 0;
  data = ROUND_DOWN (data, FALLBACK_ALIGN);
  if ((uint64_t) data + FALLBACK_ALIGN > size)
    return 0;

  buf = mmap (NULL, FALLBACK_ALIGN, PROT_READ | PROT_WRITE,
              MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (buf == MAP_FAILED)
    return 0;
  /* The buffer is page-aligned, so only the offset and length vary: the
   * kernel checks both against the same logical block size.
   */
  for (align = 512; align <= FALLBACK_ALIGN; align *= 2) {
    if (trial_read (fd, data + align, align, buf)) {
      found = align;
      break;
    }
  }
  munmap (buf, FALLBACK_ALIGN);
  return found;
}

static int
probe_blockdev (int fd, struct geometry *g, char *why, size_t whylen)
{
  int lbs = 0;
  unsigned int pbs = 0;
  uint64_t size = 0;

  if (ioctl (fd, BLKGETSIZE64, &size) == -1) {
    int err = errno;
    snprintf (why, whylen, "BLKGETSIZE64: %s", strerror (err));
    return -err;
  }
  if (ioctl (fd, BLKSSZGET, &lbs) == -1 || lbs <= 0) {
    int err = errno ? errno : EINVAL;
    snprintf (why, whylen, "BLKSSZGET: %s", strerror (err));
    return -err;
  }
  if (ioctl (fd, BLKPBSZGET, &pbs) == -1)
    pbs = lbs;

  g->size = size;
  g->offset_align = g->read_align = lbs;
  /* The queue's DMA alignment is not exposed by an ioctl; the logical
   * block size is always enough.
   */
  g->mem_align = lbs;
  /* Zeroing and discard work best in physical blocks. */
  g->fs_block = pbs > (unsigned) lbs ? pbs : (unsigned) lbs;
  g->source = "BLKSSZGET";
  return 0;
}

static int
probe_file (int fd, const struct stat *st, struct geometry *g,
            char *why, size_t whylen)
{
  struct statx stx;

  g->size = st->st_size;
  g->fs_block = st->st_blksize >= 512 && is_power_of_two (st->st_blksize)
    ? st->st_blksize : FALLBACK_ALIGN;

  memset (&stx, 0, sizeof stx);
  if (statx (fd, "", AT_EMPTY_PATH, STATX_DIOALIGN | STATX_DIO_READ_ALIGN,
             &stx) == 0 && (stx.stx_mask & STATX_DIOALIGN)) {
    if (stx.stx_dio_offset_align == 0) {
      snprintf (why, whylen, "the filesystem reports no direct I/O support "
                "for this file");
      return -EINVAL;
    }
    g->offset_align = stx.stx_dio_offset_align;
    g->mem_align = stx.stx_dio_mem_align ? stx.stx_dio_mem_align : 1;
    g->read_align = g->offset_align;
    if ((stx.stx_mask & STATX_DIO_READ_ALIGN) && statx_read_align (&stx) &&
        statx_read_align (&stx) < g->offset_align)
      g->read_align = statx_read_align (&stx);
    g->source = "statx";
    return 0;
  }

  g->offset_align = probe_align (fd, g->size);
  if (g->offset_align)
    g->source = "probe";
  else {
    g->offset_align = FALLBACK_ALIGN;
    g->source = "default";
  }
  g->read_align = g->offset_align;
  g->mem_align = g->offset_align;
  return 0;
}

int
geometry_probe (int fd, const struct stat *st, struct geometry *g,
                char *why, size_t whylen)
{
  int r;

  memset (g, 0, sizeof *g);
  g->blockdev = S_ISBLK (st->st_mode);
  r = g->blockdev ? probe_blockdev (fd, g, why, whylen)
                  : probe_file (fd, st, g, why, whylen);
  if (r < 0)
    return r;

  if (!is_power_of_two (g->offset_align) ||
      g->offset_align > GEOMETRY_MAX_ALIGN ||
      !is_power_of_two (g->mem_align) || g->mem_align > PDIO_PAGE_SIZE) {
    snprintf (why, whylen, "unusable direct-I/O alignment (offset %u, "
              "memory %u, from %s)", g->offset_align, g->mem_align,
              g->source);
    return -EINVAL;
  }
  if (g->fs_block < g->offset_align)
    g->fs_block = g->offset_align;
  return 0;
}

int
geometry_raise_align (struct geometry *g, uint64_t align,
                      char *why, size_t whylen)
{
  if (align == 0)
    return 0;
  if (!is_power_of_two (align) || align < 512 || align > GEOMETRY_MAX_ALIGN) {
    snprintf (why, whylen, "align=%" PRIu64 ": must be a power of two from "
              "512 to %u", align, GEOMETRY_MAX_ALIGN);
    return -EINVAL;
  }
  if (align < g->offset_align) {
    snprintf (why, whylen, "align=%" PRIu64 ": below the file's direct-I/O "
              "alignment of %u (align= can only raise it)", align,
              g->offset_align);
    return -EINVAL;
  }
  g->offset_align = align;
  if (g->read_align < align)
    g->read_align = align;
  if (g->fs_block < align)
    g->fs_block = align;
  return 0;
}
