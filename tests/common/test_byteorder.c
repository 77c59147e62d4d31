/* SPDX-License-Identifier: BSD-3-Clause */
/* byteorder.h: each store writes exactly its bytes, most significant
 * first, at any address (odd ones included), and each load reads them
 * back; the bytes either side are never touched.
 */
#include <config.h>

#include <stdint.h>
#include <string.h>

#include "byteorder.h"
#include "check.h"

#define GUARD 0xa5

int
main (void)
{
  static const uint8_t want64[8] = { 0x01, 0x23, 0x45, 0x67,
                                     0x89, 0xab, 0xcd, 0xef };
  uint8_t buf[16];

  for (size_t at = 0; at < 8; at++) {
    memset (buf, GUARD, sizeof buf);
    nbd_put64 (buf + at, UINT64_C (0x0123456789abcdef));
    check_u64 ("put64 bytes", memcmp (buf + at, want64, 8), 0);
    check_u64 ("put64 before", at ? buf[at - 1] : GUARD, GUARD);
    check_u64 ("put64 after", buf[at + 8], GUARD);
    check_u64 ("get64", nbd_get64 (buf + at), UINT64_C (0x0123456789abcdef));

    memset (buf, GUARD, sizeof buf);
    nbd_put32 (buf + at, 0x89abcdef);
    check_u64 ("put32 bytes", memcmp (buf + at, want64 + 4, 4), 0);
    check_u64 ("put32 after", buf[at + 4], GUARD);
    check_u64 ("get32", nbd_get32 (buf + at), 0x89abcdef);

    memset (buf, GUARD, sizeof buf);
    nbd_put16 (buf + at, 0xcdef);
    check_u64 ("put16 bytes", memcmp (buf + at, want64 + 6, 2), 0);
    check_u64 ("put16 after", buf[at + 2], GUARD);
    check_u64 ("get16", nbd_get16 (buf + at), 0xcdef);
  }

  /* Every bit in every position: a load that mixed up two bytes, or
   * sign-extended one, shows here.
   */
  for (unsigned bit = 0; bit < 64; bit++) {
    uint64_t v = UINT64_C (1) << bit;

    nbd_put64 (buf + 1, v);
    check_u64 ("64-bit round trip", nbd_get64 (buf + 1), v);
    check_u64 ("64-bit ~ round trip", (nbd_put64 (buf + 1, ~v),
                                      nbd_get64 (buf + 1)), ~v);
    if (bit < 32) {
      nbd_put32 (buf + 3, (uint32_t) v);
      check_u64 ("32-bit round trip", nbd_get32 (buf + 3), v);
    }
    if (bit < 16) {
      nbd_put16 (buf + 5, (uint16_t) ~v);
      check_u64 ("16-bit round trip", nbd_get16 (buf + 5), (uint16_t) ~v);
    }
  }
  return check_status ();
}
