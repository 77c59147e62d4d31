/* SPDX-License-Identifier: BSD-3-Clause */
/* dio_args: memory -> page vector -> iovec, with the remainder of a short
 * transfer rebuilt from a byte count.  Checked for every offset within a
 * page, lengths across page boundaries, and every skip.
 */
#include <config.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dio_args.h"
#include "pagesize.h"
#include "unit.h"

#define AREA (8 * PDIO_PAGE_SIZE)

/* The bytes iov[] describes, in order, must be exactly want[0..len). */
static void
check_iov (const struct iovec *iov, int n, const unsigned char *want,
           size_t len)
{
  size_t pos = 0;
  int i;

  for (i = 0; i < n; i++) {
    CHECK (iov[i].iov_len > 0, "empty iovec %d", i);
    CHECK (pos + iov[i].iov_len <= len, "iovecs overrun");
    CHECK (memcmp (iov[i].iov_base, want + pos, iov[i].iov_len) == 0 ||
           iov[i].iov_base == want + pos, "iovec %d points elsewhere", i);
    CHECK (iov[i].iov_base == (const void *) (want + pos),
           "iovec %d does not follow", i);
    pos += iov[i].iov_len;
  }
  CHECK (pos == len, "iovecs cover %zu of %zu bytes", pos, len);
}

int
main (void)
{
  static void *pages[3][AREA / PDIO_PAGE_SIZE + 2];
  unsigned char *area = aligned_alloc (PDIO_PAGE_SIZE, 2 * AREA);
  const size_t lengths[] = { 1, 511, 512, 4095, 4096, 4097, 8192, 12289 };
  size_t off, l, skip;
  unsigned long n_cases = 0;

  CHECK (area != NULL, "out of memory");

  /* One segment: contiguous memory always merges into one iovec. */
  for (off = 0; off < PDIO_PAGE_SIZE; off++)
    for (l = 0; l < sizeof lengths / sizeof lengths[0]; l++) {
      size_t len = lengths[l];
      struct dio_args d;
      struct iovec iov[4];

      dio_args_map (&d, pages[0], area + off, len, 1000);
      CHECK (d.first_page_off == off % PDIO_PAGE_SIZE, "first_page_off");
      CHECK (d.nr_pages == (off + len + PDIO_PAGE_SIZE - 1) / PDIO_PAGE_SIZE,
             "nr_pages %u for off %zu len %zu", d.nr_pages, off, len);
      CHECK (d.length == len && d.offset == 1000, "length/offset");
      for (skip = 0; skip < len; skip += off % 7 + 1) {
        int n = dio_args_to_iovec (&d, 1, skip, iov, 4);
        CHECK (n == 1, "contiguous memory gave %d iovecs", n);
        check_iov (iov, n, area + off + skip, len - skip);
        n_cases++;
      }
      CHECK (dio_args_to_iovec (&d, 1, len, iov, 4) == 0, "skip all");
    }

  /* Three segments in separate places (head bounce, middle, tail bounce):
   * three iovecs, and a skip that lands in any of them.
   */
  for (off = 0; off < PDIO_PAGE_SIZE; off += 64) {
    unsigned char *head = area, *mid = area + PDIO_PAGE_SIZE + off;
    unsigned char *tail = area + AREA;
    unsigned char expect[512 + 8192 + 512];
    struct dio_args d[3];
    struct iovec iov[4];
    int n;

    memset (area, 0, 2 * AREA);
    memset (head, 1, 512);
    memset (mid, 2, 8192);
    memset (tail, 3, 512);
    dio_args_map (&d[0], pages[0], head, 512, 0);
    dio_args_map (&d[1], pages[1], mid, 8192, 512);
    dio_args_map (&d[2], pages[2], tail, 512, 512 + 8192);
    CHECK (dio_args_total (d, 3) == 512 + 8192 + 512, "total");
    memset (expect, 1, 512);
    memset (expect + 512, 2, 8192);
    memset (expect + 512 + 8192, 3, 512);
    for (skip = 0; skip < sizeof expect; skip += 97) {
      unsigned char got[sizeof expect];
      size_t pos = 0;
      int i;

      n = dio_args_to_iovec (d, 3, skip, iov, 4);
      CHECK (n >= 1 && n <= 3, "%d iovecs", n);
      for (i = 0; i < n; i++) {
        memcpy (got + pos, iov[i].iov_base, iov[i].iov_len);
        pos += iov[i].iov_len;
      }
      CHECK (pos == sizeof expect - skip, "covers %zu", pos);
      CHECK (memcmp (got, expect + skip, pos) == 0, "content at skip %zu",
             skip);
      n_cases++;
    }
    /* Too few iovecs is an error, not a silent truncation. */
    CHECK (dio_args_to_iovec (d, 3, 0, iov, 2) == -1, "max_iov ignored");
  }

  free (area);
  printf ("%lu cases\n", n_cases);
  return 0;
}
