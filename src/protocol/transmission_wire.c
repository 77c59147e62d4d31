/* SPDX-License-Identifier: BSD-3-Clause */
/* The messages of the NBD transmission phase: requests, and the simple
 * and structured replies pdio's server sends (their parsers serve the
 * clients: the supervisor's watchdog, the tests and the fuzzer).  See
 * proto.h for the conventions.  Pure functions only.
 */
#include <config.h>

#include "proto.h"

bool
nbd_parse_request (const uint8_t buf[NBD_REQUEST_LEN], struct nbd_request *r)
{
  if (nbd_get32 (buf) != NBD_REQUEST_MAGIC)
    return false;
  r->flags = nbd_get16 (buf + 4);
  r->type = nbd_get16 (buf + 6);
  r->cookie = nbd_get64 (buf + 8);
  r->offset = nbd_get64 (buf + 16);
  r->count = nbd_get32 (buf + 24);
  return true;
}

void
nbd_request_bytes (uint8_t buf[NBD_REQUEST_LEN], const struct nbd_request *r)
{
  nbd_put32 (buf, NBD_REQUEST_MAGIC);
  nbd_put16 (buf + 4, r->flags);
  nbd_put16 (buf + 6, r->type);
  nbd_put64 (buf + 8, r->cookie);
  nbd_put64 (buf + 16, r->offset);
  nbd_put32 (buf + 24, r->count);
}

size_t
nbd_simple_reply (uint8_t *buf, uint64_t cookie, uint32_t error)
{
  nbd_put32 (buf, NBD_SIMPLE_REPLY_MAGIC);
  nbd_put32 (buf + 4, error);
  nbd_put64 (buf + 8, cookie);
  return NBD_SIMPLE_REPLY_LEN;
}

bool
nbd_parse_simple_reply (const uint8_t buf[NBD_SIMPLE_REPLY_LEN],
                        uint32_t *error, uint64_t *cookie)
{
  *error = nbd_get32 (buf + 4);
  *cookie = nbd_get64 (buf + 8);
  return nbd_get32 (buf) == NBD_SIMPLE_REPLY_MAGIC;
}

size_t
nbd_chunk_header (uint8_t *buf, uint16_t flags, uint16_t type,
                  uint64_t cookie, uint32_t payload_len)
{
  nbd_put32 (buf, NBD_STRUCTURED_REPLY_MAGIC);
  nbd_put16 (buf + 4, flags);
  nbd_put16 (buf + 6, type);
  nbd_put64 (buf + 8, cookie);
  nbd_put32 (buf + 16, payload_len);
  return NBD_CHUNK_HEADER_LEN;
}

bool
nbd_parse_chunk_header (const uint8_t buf[NBD_CHUNK_HEADER_LEN],
                        struct nbd_chunk *c)
{
  *c = (struct nbd_chunk) {
    .flags = nbd_get16 (buf + 4), .type = nbd_get16 (buf + 6),
    .cookie = nbd_get64 (buf + 8), .length = nbd_get32 (buf + 16),
  };
  return nbd_get32 (buf) == NBD_STRUCTURED_REPLY_MAGIC;
}

size_t
nbd_offset_data_header (uint8_t *buf, uint64_t cookie, uint64_t offset,
                        uint32_t data_len, bool last)
{
  nbd_chunk_header (buf, last ? NBD_REPLY_FLAG_DONE : 0,
                    NBD_REPLY_TYPE_OFFSET_DATA, cookie,
                    NBD_OFFSET_DATA_FIXED + data_len);
  nbd_put64 (buf + NBD_CHUNK_HEADER_LEN, offset);
  return NBD_OFFSET_DATA_HEADER_LEN;
}

bool
nbd_parse_offset_data (const uint8_t *payload, uint32_t len, uint64_t *offset,
                       const uint8_t **data, uint32_t *data_len)
{
  if (len < NBD_OFFSET_DATA_FIXED)
    return false;
  *offset = nbd_get64 (payload);
  *data = payload + NBD_OFFSET_DATA_FIXED;
  *data_len = len - NBD_OFFSET_DATA_FIXED;
  return true;
}

size_t
nbd_none_chunk (uint8_t *buf, uint64_t cookie)
{
  return nbd_chunk_header (buf, NBD_REPLY_FLAG_DONE, NBD_REPLY_TYPE_NONE,
                           cookie, 0);
}

size_t
nbd_error_chunk (uint8_t *buf, uint64_t cookie, uint32_t error)
{
  nbd_chunk_header (buf, NBD_REPLY_FLAG_DONE, NBD_REPLY_TYPE_ERROR, cookie,
                    NBD_ERROR_FIXED);
  nbd_put32 (buf + NBD_CHUNK_HEADER_LEN, error);
  nbd_put16 (buf + NBD_CHUNK_HEADER_LEN + 4, 0);        /* no message */
  return NBD_ERROR_CHUNK_LEN;
}

bool
nbd_parse_error_chunk (const uint8_t *payload, uint32_t len, uint32_t *error,
                       const uint8_t **msg, uint16_t *msg_len)
{
  if (len < NBD_ERROR_FIXED)
    return false;
  *error = nbd_get32 (payload);
  *msg_len = nbd_get16 (payload + 4);
  *msg = payload + NBD_ERROR_FIXED;
  /* The spec lets more follow the message (ERROR_OFFSET's offset). */
  return *msg_len <= len - NBD_ERROR_FIXED;
}

void
nbd_extents_init (struct nbd_extents *x, uint8_t *buf, size_t max,
                  uint32_t count)
{
  *x = (struct nbd_extents) { .buf = buf, .max = max, .limit = count };
}

bool
nbd_extents_add (struct nbd_extents *x, uint64_t length, uint32_t flags)
{
  uint8_t *last;

  if (length == 0)
    return true;
  if (length > x->limit - x->total)
    length = x->limit - x->total;       /* never describe past the request */
  if (length == 0)
    return false;
  last = x->buf + NBD_BLOCK_STATUS_LEN (x->n) - NBD_EXTENT_LEN;
  /* Merge a run of the same status, as long as its length fits 32 bits. */
  if (x->n && x->last_flags == flags &&
      nbd_get32 (last) + length <= UINT32_MAX) {
    nbd_put32 (last, nbd_get32 (last) + (uint32_t) length);
    x->total += length;
    return x->total < x->limit;
  }
  if (x->n == x->max)
    return false;
  last = x->buf + NBD_BLOCK_STATUS_LEN (x->n);
  /* The limit is a 32-bit request count, so length fits. */
  nbd_put32 (last, (uint32_t) length);
  nbd_put32 (last + 4, flags);
  x->n++;
  x->last_flags = flags;
  x->total += length;
  return x->total < x->limit;
}

size_t
nbd_extents_finish (struct nbd_extents *x, uint64_t cookie)
{
  size_t len = NBD_BLOCK_STATUS_LEN (x->n);

  nbd_chunk_header (x->buf, NBD_REPLY_FLAG_DONE, NBD_REPLY_TYPE_BLOCK_STATUS,
                    cookie, (uint32_t) (len - NBD_CHUNK_HEADER_LEN));
  nbd_put32 (x->buf + NBD_CHUNK_HEADER_LEN, NBD_META_ID_BASE_ALLOCATION);
  return len;
}

bool
nbd_parse_block_status (const uint8_t *payload, uint32_t len,
                        uint32_t *context, size_t *n)
{
  if (len < NBD_BLOCK_STATUS_FIXED + NBD_EXTENT_LEN ||
      (len - NBD_BLOCK_STATUS_FIXED) % NBD_EXTENT_LEN)
    return false;
  *context = nbd_get32 (payload);
  *n = (len - NBD_BLOCK_STATUS_FIXED) / NBD_EXTENT_LEN;
  return true;
}

void
nbd_parse_extent (const uint8_t *payload, size_t i, uint32_t *length,
                  uint32_t *flags)
{
  const uint8_t *d = payload + NBD_BLOCK_STATUS_FIXED + NBD_EXTENT_LEN * i;

  *length = nbd_get32 (d);
  *flags = nbd_get32 (d + 4);
}
