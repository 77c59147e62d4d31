/* SPDX-License-Identifier: BSD-3-Clause */
/* dio_args: memory -> page vector -> iovec. */
#include <config.h>

#include <stdbool.h>

#include "dio_args.h"
#include "pagesize.h"
#include "rounding.h"

void
dio_args_map (struct dio_args *d, void **pages, void *mem, size_t len,
              uint64_t offset)
{
  uintptr_t first = ROUND_DOWN ((uintptr_t) mem, PDIO_PAGE_SIZE);
  unsigned i, n = dio_pages_needed (mem, len);

  for (i = 0; i < n; i++)
    pages[i] = (void *) (first + (uintptr_t) i * PDIO_PAGE_SIZE);
  d->pages = pages;
  d->base = NULL;
  d->first_page_off = (uintptr_t) mem - first;
  d->nr_pages = n;
  d->length = len;
  d->offset = offset;
}

void
dio_args_map_contig (struct dio_args *d, void *mem, size_t len,
                     uint64_t offset)
{
  uintptr_t first = ROUND_DOWN ((uintptr_t) mem, PDIO_PAGE_SIZE);

  d->pages = NULL;
  d->base = (char *) first;
  d->first_page_off = (uintptr_t) mem - first;
  d->nr_pages = dio_pages_needed (mem, len);
  d->length = len;
  d->offset = offset;
}

/* Appends [base, base+bytes) to iov, merging with the last iovec when the
 * memory follows on.  false if it needs more than max_iov.
 */
static bool
add_run (struct iovec *iov, unsigned *n, unsigned max_iov, char *base,
         size_t bytes)
{
  if (*n > 0 && (char *) iov[*n-1].iov_base + iov[*n-1].iov_len == base) {
    iov[*n-1].iov_len += bytes;
    return true;
  }
  if (*n == max_iov)
    return false;
  iov[*n].iov_base = base;
  iov[*n].iov_len = bytes;
  (*n)++;
  return true;
}

size_t
dio_args_total (const struct dio_args *segs, unsigned nsegs)
{
  size_t total = 0;
  unsigned s;

  for (s = 0; s < nsegs; s++)
    total += segs[s].length;
  return total;
}

int
dio_args_to_iovec (const struct dio_args *segs, unsigned nsegs, size_t skip,
                   struct iovec *iov, unsigned max_iov)
{
  unsigned s, i, n = 0;

  for (s = 0; s < nsegs; s++) {
    const struct dio_args *d = &segs[s];
    size_t left = d->length;

    if (d->pages == NULL) {
      /* One run: no page walk at all. */
      if (skip >= left) {
        skip -= left;
        continue;
      }
      if (!add_run (iov, &n, max_iov,
                    d->base + d->first_page_off + skip, left - skip))
        return -1;
      skip = 0;
      continue;
    }
    for (i = 0; i < d->nr_pages && left > 0; i++) {
      size_t start = i == 0 ? d->first_page_off : 0;
      size_t bytes = PDIO_PAGE_SIZE - start;

      if (bytes > left)
        bytes = left;
      left -= bytes;
      if (skip >= bytes) {
        skip -= bytes;
        continue;
      }
      if (!add_run (iov, &n, max_iov, (char *) d->pages[i] + start + skip,
                    bytes - skip))
        return -1;
      skip = 0;
    }
  }
  return n;
}
