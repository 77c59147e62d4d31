/* SPDX-License-Identifier: BSD-3-Clause */
/* mkimage FILE SIZE SEED: writes SIZE bytes of pseudo-random data (the
 * same for the same seed, so a failing run can be replayed exactly) to a
 * new FILE, makes it durable and drops it from the page cache, so tests
 * start from a fully allocated image that nothing has cached.
 */
#include <config.h>

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "harness.h"

int
main (int argc, char *argv[])
{
  static uint8_t buf[1 << 20];
  struct rng r;
  uint64_t size, off = 0;
  int fd;

  progname = "mkimage";
  if (argc != 4)
    hard_error ("usage: mkimage FILE SIZE SEED");
  size = parse_u64 (argv[2], "SIZE");
  r.s = parse_u64 (argv[3], "SEED");

  fd = open (argv[1], O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd == -1)
    hard_error ("create %s: %m", argv[1]);
  while (off < size) {
    size_t n = size - off < sizeof buf ? size - off : sizeof buf;
    rng_fill (&r, buf, n);
    if (pwrite (fd, buf, n, off) != (ssize_t) n)
      hard_error ("write %s: %m", argv[1]);
    off += n;
  }
  if (fdatasync (fd) == -1)
    hard_error ("fdatasync %s: %m", argv[1]);
  /* Clean pages after fdatasync, so DONTNEED drops all of them. */
  posix_fadvise (fd, 0, 0, POSIX_FADV_DONTNEED);
  if (close (fd) == -1)
    hard_error ("close %s: %m", argv[1]);
  return 0;
}
