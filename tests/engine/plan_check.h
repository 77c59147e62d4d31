/* SPDX-License-Identifier: BSD-3-Clause */
/* Helpers for tests that check plan_chunk()'s invariants (test_plan.c and
 * the fuzzer in tests/robust).
 */
#ifndef PDIO_PLAN_CHECK_H
#define PDIO_PLAN_CHECK_H

#include <stddef.h>
#include <stdint.h>

#include "plan.h"

/* File offset of bounce byte b in chunk c, or UINT64_MAX if no bounce
 * segment maps it.
 */
static inline uint64_t
bounce_file_off (const struct plan_chunk *c, size_t b)
{
  uint64_t pos = c->file_off;
  unsigned s;

  for (s = 0; s < c->nseg; s++) {
    const struct plan_seg *seg = &c->seg[s];

    if (seg->mem == PLAN_MEM_BOUNCE && b >= seg->mem_off &&
        b < seg->mem_off + seg->len)
      return pos + (b - seg->mem_off);
    pos += seg->len;
  }
  return UINT64_MAX;
}

#endif
