/* SPDX-License-Identifier: BSD-3-Clause */
/* A backend over a memory "disk" that enforces the kernel's O_DIRECT rules
 * (offset, every iovec's length and address aligned) and can inject short
 * transfers and EAGAIN, so the planner and executor are checked without a
 * file.
 */
#ifndef PDIO_MEM_BACKEND_H
#define PDIO_MEM_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "io.h"

struct mem_disk {
  unsigned char *data;
  size_t size;                  /* reads stop here, like end of file */
  uint32_t align, mem_align;
  unsigned short_every;         /* every Nth transfer comes back short,
                                   by whole blocks or not */
  unsigned eagain_every;        /* every Nth transfer fails with EAGAIN */
  unsigned eio_every;           /* every Nth transfer fails with EIO */
  unsigned long transfers;
  unsigned long violations;     /* alignment rules broken (must stay 0) */
};

extern const struct io_backend mem_backend;

#endif
