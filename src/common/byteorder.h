/* SPDX-License-Identifier: BSD-3-Clause */
/* Big-endian loads and stores at any address: the NBD wire's byte order,
 * and that of pdio's own records (the hand-over's).  Byte by byte, so
 * neither alignment nor the host's order matters, and no caller writes a
 * shift sequence of its own.
 */
#ifndef PDIO_BYTEORDER_H
#define PDIO_BYTEORDER_H

#include <stdint.h>

static inline void
nbd_put16 (uint8_t *p, uint16_t v)
{
  p[0] = v >> 8;
  p[1] = v;
}

static inline void
nbd_put32 (uint8_t *p, uint32_t v)
{
  p[0] = v >> 24;
  p[1] = v >> 16;
  p[2] = v >> 8;
  p[3] = v;
}

static inline void
nbd_put64 (uint8_t *p, uint64_t v)
{
  nbd_put32 (p, v >> 32);
  nbd_put32 (p + 4, (uint32_t) v);
}

static inline uint16_t
nbd_get16 (const uint8_t *p)
{
  return (uint16_t) (p[0] << 8 | p[1]);
}

static inline uint32_t
nbd_get32 (const uint8_t *p)
{
  return (uint32_t) p[0] << 24 | (uint32_t) p[1] << 16 |
         (uint32_t) p[2] << 8 | p[3];
}

static inline uint64_t
nbd_get64 (const uint8_t *p)
{
  return (uint64_t) nbd_get32 (p) << 32 | nbd_get32 (p + 4);
}

#endif /* PDIO_BYTEORDER_H */
