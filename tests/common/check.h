/* SPDX-License-Identifier: BSD-3-Clause */
/* What the tests of src/common share: a comparison that prints what it
 * got and what it wanted, and counts the misses; main returns
 * check_status () (exit-code protocol: 0 pass, 1 fail).
 */
#ifndef PDIO_TESTS_COMMON_CHECK_H
#define PDIO_TESTS_COMMON_CHECK_H

#include <inttypes.h>
#include <stdio.h>

static unsigned check_misses;

static inline void
check_u64 (const char *what, uint64_t got, uint64_t want)
{
  if (got != want) {
    fprintf (stderr, "%s: got %#" PRIx64 ", want %#" PRIx64 "\n",
             what, got, want);
    check_misses++;
  }
}

static inline int
check_status (void)
{
  if (check_misses)
    fprintf (stderr, "%u checks failed\n", check_misses);
  return check_misses ? 1 : 0;
}

#endif /* PDIO_TESTS_COMMON_CHECK_H */
