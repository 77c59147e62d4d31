/* SPDX-License-Identifier: BSD-3-Clause */
/* What the image allows: the direct-I/O alignment of this exact file or
 * device, its allocation unit and its size.
 */
#ifndef PDIO_GEOMETRY_H
#define PDIO_GEOMETRY_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>

struct geometry {
  uint64_t size;
  uint32_t offset_align;        /* file offsets and lengths of direct I/O */
  uint32_t read_align;          /* the same for reads; <= offset_align */
  uint32_t mem_align;           /* buffer addresses of direct I/O */
  uint32_t fs_block;            /* allocation unit: holes, fallocate */
  bool blockdev;
  const char *source;           /* where offset_align came from, for logs */
};

/* Largest alignment we accept from the kernel, a probe or align=. */
#define GEOMETRY_MAX_ALIGN (1u << 20)

/* Learns the geometry of the O_DIRECT fd.  Returns 0, or -errno with a
 * message in why[].
 */
extern int geometry_probe (int fd, const struct stat *st, struct geometry *g,
                           char *why, size_t whylen);

/* Raises the alignment to align (0: no change).  Returns 0, or -EINVAL with
 * a message in why[] if align is not a power of two in range or is below
 * what the file needs.
 */
extern int geometry_raise_align (struct geometry *g, uint64_t align,
                                 char *why, size_t whylen);

#endif /* PDIO_GEOMETRY_H */
