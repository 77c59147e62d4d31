/* SPDX-License-Identifier: BSD-3-Clause */
/* rounding.h against plain arithmetic: every value near the multiples of
 * each alignment, 64-bit values rounded by 32-bit alignments (no
 * truncation past 4 GiB), and the result's type that of the value.
 */
#include <config.h>

#include <stdint.h>

#include "check.h"
#include "rounding.h"

_Static_assert (sizeof ROUND_UP ((uint32_t) 1, UINT64_C (8)) == 4,
                "ROUND_UP has the type of the value rounded");
_Static_assert (sizeof ROUND_DOWN (UINT64_C (1), 8u) == 8,
                "ROUND_DOWN has the type of the value rounded");

int
main (void)
{
  static const uint64_t bases[] = { 0, UINT64_C (1) << 32,
                                    (UINT64_C (1) << 40) + 4096 };

  for (unsigned shift = 0; shift <= 20; shift++) {
    uint32_t a = 1u << shift;

    for (size_t b = 0; b < sizeof bases / sizeof bases[0]; b++)
      for (uint64_t k = 0; k < 4; k++)
        for (int64_t d = -2; d <= 2; d++) {
          uint64_t v = bases[b] + k * a + (uint64_t) d;
          uint64_t down = v / a * a;
          uint64_t up = (v + a - 1) / a * a;

          if (bases[b] == 0 && k == 0 && d < 0)
            continue;           /* would wrap below 0 */
          check_u64 ("ROUND_DOWN", ROUND_DOWN (v, a), down);
          check_u64 ("ROUND_UP", ROUND_UP (v, a), up);
          check_u64 ("IS_ALIGNED", IS_ALIGNED (v, a), v % a == 0);
          check_u64 ("DIV_ROUND_UP", DIV_ROUND_UP (v, (uint64_t) a),
                     v / a + (v % a != 0));
        }
  }

  /* Divisors that are not powers of two. */
  for (uint64_t d = 1; d <= 13; d++)
    for (uint64_t v = 0; v <= 100; v++)
      check_u64 ("DIV_ROUND_UP any divisor", DIV_ROUND_UP (v, d),
                 v / d + (v % d != 0));

  /* A 32-bit value rounded by a wider alignment stays 32-bit. */
  check_u64 ("ROUND_UP uint32_t", ROUND_UP ((uint32_t) 4097, UINT64_C (4096)),
             8192);
  return check_status ();
}
