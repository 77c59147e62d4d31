/* SPDX-License-Identifier: BSD-3-Clause */
/* Rounding to a power-of-two alignment, and dividing rounded up.  The
 * result has the type of the value rounded, so that rounding a 64-bit
 * offset by a 32-bit alignment never truncates the offset.  a must be a
 * power of two (is_power_of_two, ispowerof2.h); d any non-zero divisor.
 */
#ifndef PDIO_ROUNDING_H
#define PDIO_ROUNDING_H

#define ROUND_DOWN(v, a) ((v) & ~((__typeof__ (v)) (a) - 1))

#define ROUND_UP(v, a) ROUND_DOWN ((v) + ((__typeof__ (v)) (a) - 1), (a))

#define IS_ALIGNED(v, a) (((v) & ((__typeof__ (v)) (a) - 1)) == 0)

#define DIV_ROUND_UP(v, d) (((v) + (d) - 1) / (d))

#endif /* PDIO_ROUNDING_H */
