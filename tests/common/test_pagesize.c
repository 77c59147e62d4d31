/* SPDX-License-Identifier: BSD-3-Clause */
/* PDIO_PAGE_SIZE against this machine: a power of two that the kernel's
 * page divides, so that what the pool does at its granularity (madvise
 * MADV_DONTNEED of one page in the middle of a mapping, mlock of one page)
 * is accepted, and what it gives back reads as zeros.
 */
#include <config.h>

#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "check.h"
#include "ispowerof2.h"
#include "pagesize.h"

int
main (void)
{
  long kpage = sysconf (_SC_PAGESIZE);
  char *m;

  check_u64 ("PDIO_PAGE_SIZE is a power of two",
             is_power_of_two (PDIO_PAGE_SIZE), 1);
  if (kpage <= 0) {
    perror ("sysconf (_SC_PAGESIZE)");
    return 99;
  }
  check_u64 ("the kernel's page divides PDIO_PAGE_SIZE",
             PDIO_PAGE_SIZE % (uint64_t) kpage, 0);

  m = mmap (NULL, 3 * PDIO_PAGE_SIZE, PROT_READ | PROT_WRITE,
            MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) {
    perror ("mmap");
    return 99;
  }
  memset (m, 0xff, 3 * PDIO_PAGE_SIZE);
  check_u64 ("madvise one page",
             madvise (m + PDIO_PAGE_SIZE, PDIO_PAGE_SIZE, MADV_DONTNEED)
             ? (uint64_t) errno : 0, 0);
  check_u64 ("the page given back reads zero", (uint8_t) m[PDIO_PAGE_SIZE], 0);
  check_u64 ("its neighbours keep their bytes",
             (uint8_t) m[PDIO_PAGE_SIZE - 1] + (uint8_t) m[2 * PDIO_PAGE_SIZE],
             0x1fe);
  /* mlock may be refused for RLIMIT_MEMLOCK, never for EINVAL. */
  if (mlock (m + PDIO_PAGE_SIZE, PDIO_PAGE_SIZE) == 0)
    munlock (m + PDIO_PAGE_SIZE, PDIO_PAGE_SIZE);
  else
    check_u64 ("mlock one page: not EINVAL", errno == EINVAL, 0);
  munmap (m, 3 * PDIO_PAGE_SIZE);
  return check_status ();
}
