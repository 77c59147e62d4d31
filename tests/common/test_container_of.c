/* SPDX-License-Identifier: BSD-3-Clause */
/* container_of: from a pointer to any member, first, middle, last, an
 * array member and an element of a member struct, back to the struct.
 */
#include <config.h>

#include <stdint.h>

#include "check.h"
#include "container_of.h"

struct inner {
  int a;
  double b;
};

struct outer {
  char first;
  struct inner mid;
  uint64_t arr[3];
  short last;
};

int
main (void)
{
  struct outer o[2];

  for (int i = 0; i < 2; i++) {
    struct outer *want = &o[i];

    check_u64 ("first", (uintptr_t) container_of (&want->first, struct outer,
                                                  first), (uintptr_t) want);
    check_u64 ("mid", (uintptr_t) container_of (&want->mid, struct outer,
                                                mid), (uintptr_t) want);
    check_u64 ("mid.b", (uintptr_t) container_of (&want->mid.b, struct outer,
                                                  mid.b), (uintptr_t) want);
    check_u64 ("arr", (uintptr_t) container_of (want->arr, struct outer, arr),
               (uintptr_t) want);
    check_u64 ("last", (uintptr_t) container_of (&want->last, struct outer,
                                                 last), (uintptr_t) want);
  }
  return check_status ();
}
