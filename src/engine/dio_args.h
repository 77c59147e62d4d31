/* SPDX-License-Identifier: BSD-3-Clause */
/* dio_args: one direct I/O described as a page vector, after Jens Axboe's
 * 2009 proposal for a page-based ->direct_IO(): the pages, the offset of
 * the data in the first page, the page count, the length and the file
 * offset.  A request is one or more dio_args that follow each other in the
 * file (head block, middle, tail block) and go to the kernel together as
 * one vectored I/O.
 *
 * The page array is walked with an explicit index wherever it is walked; a
 * dio_args is never advanced in place, so a failed or short transfer leaves
 * it exactly as it was and the remainder is rebuilt from a byte count.
 *
 * Memory that is one contiguous run (all the engine ever maps: the
 * caller's buffer, a bounce slice, the zero pages) is described without a
 * page array: pages == NULL and page i is base + i * PDIO_PAGE_SIZE.  Then
 * nothing is split into page slots only to be merged back into one iovec;
 * the page-array form stays for memory that really is scattered.
 */
#ifndef PDIO_DIO_ARGS_H
#define PDIO_DIO_ARGS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "pagesize.h"
#include "rounding.h"

struct dio_args {
  void **pages;                 /* nr_pages page-aligned addresses, or NULL:
                                   contiguous pages from base */
  char *base;                   /* page-aligned; only when pages == NULL */
  unsigned first_page_off;      /* where the data starts in pages[0] */
  unsigned nr_pages;
  size_t length;                /* bytes, starting first_page_off into pages[0] */
  uint64_t offset;              /* file offset of the first byte */
};

/* How many page slots mapping len bytes at mem takes. */
static inline unsigned
dio_pages_needed (const void *mem, size_t len)
{
  uintptr_t first = ROUND_DOWN ((uintptr_t) mem, PDIO_PAGE_SIZE);
  uintptr_t end = (uintptr_t) mem + len;

  return len ? DIV_ROUND_UP (end - first, PDIO_PAGE_SIZE) : 0;
}

/* Describes the memory [mem, mem+len), which goes to or comes from file
 * offset `offset`, in d.  pages must have dio_pages_needed(mem, len) slots.
 */
extern void dio_args_map (struct dio_args *d, void **pages, void *mem,
                          size_t len, uint64_t offset);

/* The same for contiguous memory, with no page slots. */
extern void dio_args_map_contig (struct dio_args *d, void *mem, size_t len,
                                 uint64_t offset);

/* Fills iov[] with the bytes of segs[0..nsegs) from byte `skip` on, merging
 * pages that are adjacent in memory.  Returns the number of iovecs, or -1
 * if more than max_iov would be needed.
 */
extern int dio_args_to_iovec (const struct dio_args *segs, unsigned nsegs,
                              size_t skip, struct iovec *iov,
                              unsigned max_iov);

extern size_t dio_args_total (const struct dio_args *segs, unsigned nsegs);

#endif /* PDIO_DIO_ARGS_H */
