/* SPDX-License-Identifier: BSD-3-Clause */
/* is_power_of_two: true for each power of two up to 2^63, false for 0,
 * for its neighbours, and for every other small number.
 */
#include <config.h>

#include <stdint.h>

#include "check.h"
#include "ispowerof2.h"

int
main (void)
{
  check_u64 ("0", is_power_of_two (0), 0);
  check_u64 ("UINT64_MAX", is_power_of_two (UINT64_MAX), 0);
  for (unsigned i = 0; i < 64; i++) {
    uint64_t p = UINT64_C (1) << i;

    check_u64 ("2^i", is_power_of_two (p), 1);
    if (i >= 1)
      check_u64 ("2^i + 1", is_power_of_two (p + 1), 0);
    if (i >= 2)
      check_u64 ("2^i - 1", is_power_of_two (p - 1), 0);
    if (i >= 1)
      check_u64 ("2^i | 1", is_power_of_two (p | 1), 0);
  }
  for (uint64_t v = 1; v <= 1 << 16; v++)
    check_u64 ("v", is_power_of_two (v), (v & (v - 1)) == 0);
  return check_status ();
}
