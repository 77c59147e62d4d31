/* Extents: which parts of a file are data and which are holes, from
 * SEEK_DATA/SEEK_HOLE.  The fd's file position is never used for I/O, so
 * concurrent lseeks need no lock.  Anything past the current end of file
 * (the file may have shrunk) is reported as a hole.
 */
#include <config.h>

#include <errno.h>
#include <unistd.h>

#include "engine_internal.h"

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
    off_t next;
    bool hole;

    next = lseek (img->fd, pos, SEEK_DATA);
    if (next == -1 && errno != ENXIO)
      return -errno;
    if (next == -1 || (uint64_t) next > pos) {
      hole = true;                      /* a hole up to the next data */
      if (next == -1 || (uint64_t) next > end)
        next = end;
    }
    else {
      hole = false;                     /* data up to the next hole */
      next = lseek (img->fd, pos, SEEK_HOLE);
      if (next == -1 && errno != ENXIO)
        return -errno;
      /* Data is always a safe answer, also if a hole just appeared. */
      if (next == -1 || (uint64_t) next > end || (uint64_t) next <= pos)
        next = end;
    }
    r = add (opaque, pos, next - pos, hole);
    if (r != 0)
      return r < 0 ? r : 0;
    pos = next;
    if (req_one)
      break;
  }
  return 0;
}
