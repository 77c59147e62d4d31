/* SPDX-License-Identifier: BSD-3-Clause */
/* The messages of the NBD handshake phase (fixed newstyle), both ways:
 * what pdio's server sends and parses, and what pdio(1)'s client
 * handshake sends and parses.  See proto.h for the conventions.  Pure
 * functions only.
 */
#include <config.h>

#include <string.h>

#include "proto.h"

/* A string field: memcpy may not be given NULL, even for no bytes. */
static void
put_bytes (uint8_t *p, const void *s, size_t n)
{
  if (n)
    memcpy (p, s, n);
}

size_t
nbd_greeting (uint8_t buf[NBD_GREETING_LEN], uint16_t gflags)
{
  nbd_put64 (buf, NBD_MAGIC);
  nbd_put64 (buf + 8, NBD_IHAVEOPT);
  nbd_put16 (buf + 16, gflags);
  return NBD_GREETING_LEN;
}

bool
nbd_parse_greeting (const uint8_t buf[NBD_GREETING_LEN], uint16_t *gflags)
{
  *gflags = nbd_get16 (buf + 16);
  return nbd_get64 (buf) == NBD_MAGIC && nbd_get64 (buf + 8) == NBD_IHAVEOPT;
}

size_t
nbd_client_flags (uint8_t buf[NBD_CLIENT_FLAGS_LEN], uint32_t cflags)
{
  nbd_put32 (buf, cflags);
  return NBD_CLIENT_FLAGS_LEN;
}

uint32_t
nbd_parse_client_flags (const uint8_t buf[NBD_CLIENT_FLAGS_LEN])
{
  return nbd_get32 (buf);
}

size_t
nbd_option_header (uint8_t *buf, uint32_t option, uint32_t length)
{
  nbd_put64 (buf, NBD_IHAVEOPT);
  nbd_put32 (buf + 8, option);
  nbd_put32 (buf + 12, length);
  return NBD_OPTION_HEADER_LEN;
}

bool
nbd_parse_option_header (const uint8_t buf[NBD_OPTION_HEADER_LEN],
                         uint32_t *option, uint32_t *length)
{
  if (nbd_get64 (buf) != NBD_IHAVEOPT)
    return false;
  *option = nbd_get32 (buf + 8);
  *length = nbd_get32 (buf + 12);
  return true;
}

size_t
nbd_option_reply (uint8_t *buf, uint32_t option, uint32_t type,
                  uint32_t length)
{
  nbd_put64 (buf, NBD_REP_MAGIC);
  nbd_put32 (buf + 8, option);
  nbd_put32 (buf + 12, type);
  nbd_put32 (buf + 16, length);
  return NBD_OPTION_REPLY_LEN;
}

bool
nbd_parse_option_reply (const uint8_t buf[NBD_OPTION_REPLY_LEN],
                        uint32_t *option, uint32_t *type, uint32_t *length)
{
  *option = nbd_get32 (buf + 8);
  *type = nbd_get32 (buf + 12);
  *length = nbd_get32 (buf + 16);
  return nbd_get64 (buf) == NBD_REP_MAGIC;
}

size_t
nbd_export_name_reply (uint8_t *buf, uint64_t size, uint16_t eflags,
                       bool no_zeroes)
{
  size_t n = NBD_EXPORT_NAME_REPLY_LEN (no_zeroes);

  memset (buf, 0, n);
  nbd_put64 (buf, size);
  nbd_put16 (buf + 8, eflags);
  return n;
}

size_t
nbd_info_request (uint8_t *buf, const void *name, uint32_t name_len,
                  const uint16_t *infos, uint16_t n_infos)
{
  uint8_t *p = buf + 4 + name_len;

  nbd_put32 (buf, name_len);
  put_bytes (buf + 4, name, name_len);
  nbd_put16 (p, n_infos);
  for (uint16_t i = 0; i < n_infos; i++)
    nbd_put16 (p + 2 + 2 * i, infos[i]);
  return NBD_INFO_REQUEST_LEN (name_len, n_infos);
}

bool
nbd_parse_info_request (const uint8_t *d, uint32_t len,
                        struct nbd_info_request *r)
{
  uint32_t name_len;
  uint16_t n;

  if (len < NBD_INFO_REQUEST_LEN (0, 0) ||
      (name_len = nbd_get32 (d)) > len - NBD_INFO_REQUEST_LEN (0, 0))
    return false;
  n = nbd_get16 (d + 4 + name_len);
  if (len != NBD_INFO_REQUEST_LEN (name_len, n))
    return false;
  *r = (struct nbd_info_request) {
    .name = d + 4, .name_len = name_len,
    .n_infos = n, .infos = d + 4 + name_len + 2,
  };
  return true;
}

uint16_t
nbd_info_request_item (const struct nbd_info_request *r, uint16_t i)
{
  return nbd_get16 (r->infos + 2 * i);
}

size_t
nbd_info_export (uint8_t *p, uint64_t size, uint16_t eflags)
{
  nbd_put16 (p, NBD_INFO_EXPORT);
  nbd_put64 (p + 2, size);
  nbd_put16 (p + 10, eflags);
  return NBD_INFO_EXPORT_LEN;
}

size_t
nbd_info_string (uint8_t *p, uint16_t type, const void *s, size_t n)
{
  nbd_put16 (p, type);
  put_bytes (p + 2, s, n);
  return NBD_INFO_STRING_LEN (n);
}

size_t
nbd_info_block_size (uint8_t *p, uint32_t min, uint32_t preferred,
                     uint32_t max)
{
  nbd_put16 (p, NBD_INFO_BLOCK_SIZE);
  nbd_put32 (p + 2, min);
  nbd_put32 (p + 6, preferred);
  nbd_put32 (p + 10, max);
  return NBD_INFO_BLOCK_SIZE_LEN;
}

bool
nbd_parse_info (const uint8_t *p, size_t len, struct nbd_info *i)
{
  if (len < 2)
    return false;
  *i = (struct nbd_info) { .type = nbd_get16 (p) };
  switch (i->type) {
  case NBD_INFO_EXPORT:
    if (len != NBD_INFO_EXPORT_LEN)
      return false;
    i->size = nbd_get64 (p + 2);
    i->eflags = nbd_get16 (p + 10);
    return true;
  case NBD_INFO_BLOCK_SIZE:
    if (len != NBD_INFO_BLOCK_SIZE_LEN)
      return false;
    i->block_min = nbd_get32 (p + 2);
    i->block_preferred = nbd_get32 (p + 6);
    i->block_max = nbd_get32 (p + 10);
    return true;
  case NBD_INFO_NAME:
  case NBD_INFO_DESCRIPTION:
    i->string = p + 2;
    i->string_len = len - 2;
    return true;
  default:
    return true;
  }
}

size_t
nbd_rep_server (uint8_t *p, const void *name, uint32_t name_len,
                const void *desc, size_t desc_len)
{
  nbd_put32 (p, name_len);
  put_bytes (p + 4, name, name_len);
  put_bytes (p + 4 + name_len, desc, desc_len);
  return NBD_REP_SERVER_LEN (name_len, desc_len);
}

bool
nbd_parse_meta_request (const uint8_t *d, uint32_t len,
                        struct nbd_meta_request *m)
{
  uint32_t name_len, pos;

  if (len < 8 || (name_len = nbd_get32 (d)) > len - 8)
    return false;
  *m = (struct nbd_meta_request) {
    .name = d + 4, .name_len = name_len,
    .n_queries = nbd_get32 (d + 4 + name_len),
    .queries = d + 8 + name_len, .queries_len = len - 8 - name_len,
  };
  /* Each query must lie within the option, and together fill it: the
   * walk below is bounded by the bytes, not by a count the client chose.
   */
  pos = 0;
  for (uint32_t i = 0; i < m->n_queries; i++) {
    uint32_t q;

    if (m->queries_len - pos < 4 ||
        (q = nbd_get32 (m->queries + pos)) > m->queries_len - pos - 4)
      return false;
    pos += 4 + q;
  }
  return pos == m->queries_len;
}

bool
nbd_meta_request_next (const struct nbd_meta_request *m, uint32_t *pos,
                       const uint8_t **q, uint32_t *q_len)
{
  if (*pos >= m->queries_len)
    return false;
  *q_len = nbd_get32 (m->queries + *pos);
  *q = m->queries + *pos + 4;
  *pos += 4 + *q_len;
  return true;
}

size_t
nbd_meta_context_reply (uint8_t *p, uint32_t id, const void *name, size_t n)
{
  nbd_put32 (p, id);
  put_bytes (p + 4, name, n);
  return NBD_META_CONTEXT_REPLY_LEN (n);
}

bool
nbd_parse_meta_context_reply (const uint8_t *p, size_t len, uint32_t *id,
                              const uint8_t **name, size_t *n)
{
  if (len < NBD_META_CONTEXT_REPLY_LEN (0))
    return false;
  *id = nbd_get32 (p);
  *name = p + 4;
  *n = len - 4;
  return true;
}
