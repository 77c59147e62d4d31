/* SPDX-License-Identifier: BSD-3-Clause */
/* The page every part assumes: bounce buffers and the pool are carved in
 * pages, dio_args splits memory at page boundaries, and no O_DIRECT memory
 * alignment can exceed a page.  A constant, not sysconf (_SC_PAGESIZE), so
 * that it folds into masks and array sizes; the pool's madvise and mlock
 * need the kernel's page to be no larger (tests/common/test_pagesize
 * checks this machine's).
 */
#ifndef PDIO_PAGESIZE_H
#define PDIO_PAGESIZE_H

#define PDIO_PAGE_SIZE 4096u

#endif /* PDIO_PAGESIZE_H */
