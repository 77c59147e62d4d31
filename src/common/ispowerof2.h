/* SPDX-License-Identifier: BSD-3-Clause */
/* Alignments, block sizes and buddy orders must be powers of two: the
 * rounding of rounding.h is a mask, and the kernel refuses others.
 */
#ifndef PDIO_ISPOWEROF2_H
#define PDIO_ISPOWEROF2_H

#include <stdbool.h>
#include <stdint.h>

static inline bool
is_power_of_two (uint64_t v)
{
  return v && !(v & (v - 1));
}

#endif /* PDIO_ISPOWEROF2_H */
