/* SPDX-License-Identifier: BSD-3-Clause */
/* Minimal checks for the engine's unit tests (exit-code protocol: 0 pass,
 * 1 fail).  CHECK prints where and what failed and exits.
 */
#ifndef PDIO_UNIT_H
#define PDIO_UNIT_H

#include <stdio.h>
#include <stdlib.h>

#define CHECK(cond, ...)                                                \
  do {                                                                  \
    if (!(cond)) {                                                      \
      fprintf (stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, \
               #cond);                                                  \
      fprintf (stderr, __VA_ARGS__);                                    \
      fprintf (stderr, "\n");                                           \
      exit (1);                                                         \
    }                                                                   \
  } while (0)

/* xorshift64*: reproducible from a printed seed. */
static inline uint64_t
unit_rand (uint64_t *state)
{
  uint64_t x = *state;

  x ^= x >> 12;
  x ^= x << 25;
  x ^= x >> 27;
  *state = x;
  return x * 0x2545F4914F6CDD1DULL;
}

#endif /* PDIO_UNIT_H */
