/* SPDX-License-Identifier: BSD-3-Clause */
/* libFuzzer target: the native server's handshake state machine
 * (src/server/handshake.c) and request parser and validator
 * (src/protocol/proto.c), fed a client's byte stream exactly as the event
 * loop feeds them: the handshake says how many bytes it wants, gets at
 * most that many, and whatever follows a successful NBD_OPT_GO or
 * NBD_OPT_EXPORT_NAME is parsed as 28-byte requests (with payloads) and
 * answered with the reply builders.  Built like fuzz_plan (clang
 * -fsanitize=fuzzer,address,undefined); fuzz-server.sh runs it.
 *
 * Input: byte 0 picks the export (bit 0 read-only, bits 1-2 the size:
 * 0, 1 MiB + 512, 2^40, 2^63 + 4096; bit 3 a description) and the TLS
 * mode (bits 4-5: 0 off, 1 on, 2 and 3 require); byte 1 caps each
 * receive (1..256 bytes, 0 = as much as asked), so short reads are
 * covered; the rest is what the client sends.  A STARTTLS the handshake
 * accepts is taken as a TLS handshake that succeeded: the bytes after it
 * are what the client sends inside TLS.
 *
 * With bit 6 of byte 0 set, the rest is instead what a server sends, read
 * by the protocol's readers as pdio(1)'s client side reads it
 * (src/cli/negotiate.c, watchdog.c): the greeting, option replies and
 * their INFO and meta-context payloads up to an ACK, then simple replies
 * and structured chunks with their payloads.
 *
 * Invariants (any violation aborts):
 *   - every option reply the server sends is well formed: magic, the
 *     option it answers, a length that matches what follows; the greeting
 *     is the fixed newstyle one; EXPORT_NAME's reply is 10 or 134 bytes;
 *   - what the server says of the export, read back by the client's
 *     readers, is the export: INFO's size, flags and block sizes, the
 *     description, the meta context's name;
 *   - the handshake never asks for more than NBD_HS_IN_MAX bytes at once
 *     and never lasts past NBD_HS_MAX_OPTIONS options;
 *   - the session it ends with advertises HAS_FLAGS, READ_ONLY exactly
 *     when the export is, DF only with structured replies, and
 *     base:allocation only with structured replies;
 *   - a request the validator accepts is in range, has a length within
 *     the advertised maximum for READ/WRITE, carries only flags its
 *     command documents (DISC ends the session whatever its flags), and
 *     is a command pdio serves; one it refuses
 *     gets an error the spec allows, and only a refused WRITE has
 *     payload bytes to skip (exactly its length);
 *   - reply builders write exactly their stated lengths (ASan), their
 *     readers read back what was written, and a block status reply never
 *     describes more than the request;
 *   - the client side's readers never read past the length they are
 *     given (each payload is parsed from a copy of exactly its size, for
 *     ASan), and what they return lies within it;
 *   - TLS: with TLS required, before STARTTLS every reply is
 *     NBD_REP_ERR_TLS_REQD, but ABORT's ACK and STARTTLS's own answer
 *     (ACK, or INVALID if it carried data; either gets TOO_BIG if too
 *     long to keep): nothing of the export is
 *     said, transmission never starts and EXPORT_NAME hangs up; with TLS
 *     off, STARTTLS is never accepted; STARTTLS is accepted at most once,
 *     and what was negotiated before it (structured replies, the meta
 *     context) is forgotten.
 */
#include <config.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "handshake.h"
#include "proto.h"

#define CHECK(cond) \
  do { if (!(cond)) { fprintf (stderr, "invariant broken: %s (line %d)\n", \
                               #cond, __LINE__); abort (); } } while (0)

/* An INFO or META_CONTEXT payload, read back as a client reads it. */
static void
check_payload (const struct nbd_handshake *h, uint32_t type,
               const uint8_t *p, uint32_t n)
{
  const struct nbd_export *e = h->export;
  struct nbd_info info;
  const uint8_t *name;
  size_t name_len;
  uint32_t id;

  if (type == NBD_REP_INFO) {
    CHECK (nbd_parse_info (p, n, &info));
    switch (info.type) {
    case NBD_INFO_EXPORT:
      CHECK (info.size == e->size);
      CHECK (info.eflags == nbd_export_flags (e, h->structured));
      break;
    case NBD_INFO_BLOCK_SIZE:
      CHECK (info.block_min == e->block_min &&
             info.block_preferred == e->block_preferred &&
             info.block_max == e->block_max);
      break;
    case NBD_INFO_DESCRIPTION:
      CHECK (e->description && info.string_len == strlen (e->description) &&
             memcmp (info.string, e->description, info.string_len) == 0);
      break;
    case NBD_INFO_NAME:
      break;                    /* the client's own name, echoed */
    default:
      CHECK (!"an info type pdio does not send");
    }
  }
  else if (type == NBD_REP_META_CONTEXT) {
    CHECK (nbd_parse_meta_context_reply (p, n, &id, &name, &name_len));
    CHECK (name_len == strlen (NBD_CONTEXT_BASE_ALLOCATION) &&
           memcmp (name, NBD_CONTEXT_BASE_ALLOCATION, name_len) == 0);
    CHECK (id == (h->option == NBD_OPT_LIST_META_CONTEXT
                  ? 0 : NBD_META_ID_BASE_ALLOCATION));
  }
}

static void
check_option_replies (const struct nbd_handshake *h, const uint8_t *p,
                      size_t len)
{
  while (len) {
    uint32_t option, type, n;

    CHECK (len >= NBD_OPTION_REPLY_LEN);
    CHECK (nbd_parse_option_reply (p, &option, &type, &n));
    CHECK (option == h->option);
    CHECK (n <= len - NBD_OPTION_REPLY_LEN);
    check_payload (h, type, p + NBD_OPTION_REPLY_LEN, n);
    p += NBD_OPTION_REPLY_LEN + n;
    len -= NBD_OPTION_REPLY_LEN + n;
  }
}

/* FORCEDTLS before STARTTLS: nothing but refusals, ABORT's ACK and
 * STARTTLS's own answer.
 */
static void
check_pre_tls_replies (const uint8_t *p, size_t len, uint32_t option)
{
  while (len >= NBD_OPTION_REPLY_LEN) {
    uint32_t opt, type, n;

    nbd_parse_option_reply (p, &opt, &type, &n);
    /* Either, sent too long to keep, is refused as such. */
    if (option == NBD_OPT_ABORT)
      CHECK (type == NBD_REP_ACK || type == NBD_REP_ERR_TOO_BIG);
    else if (option == NBD_OPT_STARTTLS)
      CHECK (type == NBD_REP_ACK || type == NBD_REP_ERR_INVALID ||
             type == NBD_REP_ERR_TOO_BIG);
    else
      CHECK (type == NBD_REP_ERR_TLS_REQD);
    p += NBD_OPTION_REPLY_LEN + n;
    len -= NBD_OPTION_REPLY_LEN + n;
  }
}

static void
check_session (const struct nbd_session *s, const struct nbd_export *e)
{
  CHECK (s->eflags & NBD_FLAG_HAS_FLAGS);
  CHECK (!!(s->eflags & NBD_FLAG_READ_ONLY) == e->readonly);
  CHECK (!(s->eflags & NBD_FLAG_SEND_DF) || s->structured);
  CHECK (!s->meta_base_allocation || s->structured);
  CHECK (s->size == e->size && s->block_max == e->block_max);
}

static bool
is_spec_error (uint32_t e)
{
  return e == NBD_EPERM || e == NBD_EINVAL || e == NBD_ENOSPC ||
         e == NBD_EOVERFLOW;
}

static void
check_verdict (const struct nbd_request *r, const struct nbd_session *s,
               const struct nbd_verdict *v)
{
  if (v->error) {
    CHECK (is_spec_error (v->error));
    CHECK (v->discard == (r->type == NBD_CMD_WRITE ? r->count : 0));
    return;
  }
  CHECK (v->discard == 0);
  switch (r->type) {
  case NBD_CMD_READ: case NBD_CMD_WRITE:
    CHECK (r->count > 0 && r->count <= NBD_MAX_REQUEST);
    /* fall through */
  case NBD_CMD_TRIM: case NBD_CMD_WRITE_ZEROES: case NBD_CMD_BLOCK_STATUS:
    CHECK (r->count > 0);
    CHECK (r->offset <= s->size && r->count <= s->size - r->offset);
    if (r->type != NBD_CMD_READ && r->type != NBD_CMD_BLOCK_STATUS)
      CHECK (!(s->eflags & NBD_FLAG_READ_ONLY));
    if (r->type == NBD_CMD_BLOCK_STATUS)
      CHECK (s->meta_base_allocation);
    break;
  case NBD_CMD_FLUSH:
    CHECK (r->offset == 0 && r->count == 0);
    break;
  case NBD_CMD_DISC:
    return;                     /* ends the session whatever its flags */
  default:
    CHECK (!"an unknown command was accepted");
  }
  if (r->flags & NBD_CMD_FLAG_DF)
    CHECK (r->type == NBD_CMD_READ && s->structured);
  if (r->flags & (NBD_CMD_FLAG_NO_HOLE | NBD_CMD_FLAG_FAST_ZERO))
    CHECK (r->type == NBD_CMD_WRITE_ZEROES);
  if (r->flags & NBD_CMD_FLAG_REQ_ONE)
    CHECK (r->type == NBD_CMD_BLOCK_STATUS);
  CHECK (!(r->flags & ~0x1fu));
}

/* A chunk header as built: the magic, DONE, the type and the cookie. */
static const uint8_t *
check_chunk (const uint8_t *buf, uint16_t flags, uint16_t type,
             uint64_t cookie, uint32_t length)
{
  struct nbd_chunk c;

  CHECK (nbd_parse_chunk_header (buf, &c));
  CHECK (c.flags == flags && c.type == type && c.cookie == cookie &&
         c.length == length);
  return buf + NBD_CHUNK_HEADER_LEN;
}

static void
check_simple (const uint8_t *buf, uint64_t cookie, uint32_t error)
{
  uint32_t e;
  uint64_t c;

  CHECK (nbd_parse_simple_reply (buf, &e, &c));
  CHECK (e == error && c == cookie);
}

/* The 4-byte extent lengths and 1-byte flags the test takes from its
 * input for a BLOCK_STATUS reply.
 */
#define FUZZ_EXTENT 5
static uint32_t
fuzz_extent_len (const uint8_t *d)
{
  return nbd_get32 (d);
}

/* Builds the reply the connection would send, from input bytes, and reads
 * it back.
 */
static void
build_reply (const struct nbd_request *r, const struct nbd_verdict *v,
             const struct nbd_session *s, const uint8_t *data, size_t len)
{
  uint8_t hdr[NBD_OFFSET_DATA_HEADER_LEN];
  uint8_t bs[NBD_BLOCK_STATUS_LEN (16)];
  struct nbd_extents x;
  const uint8_t *payload, *msg;
  uint64_t offset;
  uint32_t error, data_len, context;
  uint16_t msg_len;
  size_t n;

  if (v->error) {
    if (s->structured) {
      CHECK (nbd_error_chunk (bs, r->cookie, v->error) == NBD_ERROR_CHUNK_LEN);
      payload = check_chunk (bs, NBD_REPLY_FLAG_DONE, NBD_REPLY_TYPE_ERROR,
                             r->cookie, NBD_ERROR_FIXED);
      CHECK (nbd_parse_error_chunk (payload, NBD_ERROR_FIXED, &error, &msg,
                                    &msg_len));
      CHECK (error == v->error && msg_len == 0);
    }
    else {
      CHECK (nbd_simple_reply (hdr, r->cookie, v->error) ==
             NBD_SIMPLE_REPLY_LEN);
      check_simple (hdr, r->cookie, v->error);
    }
    return;
  }
  switch (r->type) {
  case NBD_CMD_READ:
    if (s->structured) {
      CHECK (nbd_offset_data_header (hdr, r->cookie, r->offset, r->count,
                                     true) == NBD_OFFSET_DATA_HEADER_LEN);
      payload = check_chunk (hdr, NBD_REPLY_FLAG_DONE,
                             NBD_REPLY_TYPE_OFFSET_DATA, r->cookie,
                             NBD_OFFSET_DATA_FIXED + r->count);
      /* The data would follow: read the offset alone. */
      CHECK (nbd_parse_offset_data (payload, NBD_OFFSET_DATA_FIXED, &offset,
                                    &msg, &data_len));
      CHECK (offset == r->offset && data_len == 0);
    }
    break;
  case NBD_CMD_BLOCK_STATUS:
    nbd_extents_init (&x, bs, (r->flags & NBD_CMD_FLAG_REQ_ONE) ? 1 : 16,
                      r->count);
    for (size_t i = 0; i + FUZZ_EXTENT <= len; i += FUZZ_EXTENT)
      if (!nbd_extents_add (&x, fuzz_extent_len (data + i), data[i + 4] & 3))
        break;
    if (x.n == 0)
      nbd_extents_add (&x, r->count, 0);
    CHECK (x.n >= 1 && x.total <= r->count);
    CHECK (nbd_extents_finish (&x, r->cookie) == NBD_BLOCK_STATUS_LEN (x.n));
    payload = check_chunk (bs, NBD_REPLY_FLAG_DONE,
                           NBD_REPLY_TYPE_BLOCK_STATUS, r->cookie,
                           NBD_BLOCK_STATUS_LEN (x.n) - NBD_CHUNK_HEADER_LEN);
    CHECK (nbd_parse_block_status (payload, NBD_BLOCK_STATUS_LEN (x.n) -
                                   NBD_CHUNK_HEADER_LEN, &context, &n));
    CHECK (context == NBD_META_ID_BASE_ALLOCATION && n == x.n);
    {
      uint64_t sum = 0;
      for (size_t i = 0; i < n; i++) {
        uint32_t l, f;

        nbd_parse_extent (payload, i, &l, &f);
        CHECK (l > 0 && !(f & ~(NBD_STATE_HOLE | NBD_STATE_ZERO)));
        sum += l;
      }
      CHECK (sum == x.total);
    }
    break;
  default:
    if (s->structured) {
      CHECK (nbd_none_chunk (hdr, r->cookie) == NBD_CHUNK_HEADER_LEN);
      check_chunk (hdr, NBD_REPLY_FLAG_DONE, NBD_REPLY_TYPE_NONE, r->cookie,
                   0);
    }
    else {
      CHECK (nbd_simple_reply (hdr, r->cookie, 0) == NBD_SIMPLE_REPLY_LEN);
      check_simple (hdr, r->cookie, 0);
    }
  }
}

static void
transmission (const struct nbd_session *s, const uint8_t *p, size_t len)
{
  while (len >= NBD_REQUEST_LEN) {
    struct nbd_request r;
    struct nbd_verdict v;
    size_t payload;

    if (!nbd_parse_request (p, &r))
      return;                   /* the connection hangs up */
    p += NBD_REQUEST_LEN;
    len -= NBD_REQUEST_LEN;
    v = nbd_check_request (&r, s);
    check_verdict (&r, s, &v);
    if (r.type == NBD_CMD_DISC && !v.error)
      return;
    build_reply (&r, &v, s, p, len);
    payload = v.error ? v.discard : (r.type == NBD_CMD_WRITE ? r.count : 0);
    if (payload > len)
      return;                   /* truncated payload: the client went away */
    p += payload;
    len -= payload;
  }
}

/* --- the client side --------------------------------------------------- */
/* A copy of exactly n bytes, so that ASan sees a read past them. */
static uint8_t *
exact (const uint8_t *p, size_t n)
{
  uint8_t *c = malloc (n ? n : 1);

  CHECK (c != NULL);
  memcpy (c, p, n);
  return c;
}

static void
client_option_payload (uint32_t type, const uint8_t *p, uint32_t n)
{
  uint8_t *c = exact (p, n);
  struct nbd_info info;
  const uint8_t *name;
  size_t name_len;
  uint32_t id;

  if (type == NBD_REP_INFO && nbd_parse_info (c, n, &info)) {
    if (info.type == NBD_INFO_EXPORT)
      CHECK (n == NBD_INFO_EXPORT_LEN);
    else if (info.type == NBD_INFO_BLOCK_SIZE)
      CHECK (n == NBD_INFO_BLOCK_SIZE_LEN);
    else if (info.type == NBD_INFO_NAME || info.type == NBD_INFO_DESCRIPTION)
      CHECK (info.string + info.string_len == c + n);
  }
  if (type == NBD_REP_META_CONTEXT &&
      nbd_parse_meta_context_reply (c, n, &id, &name, &name_len))
    CHECK (name + name_len == c + n);
  free (c);
}

static void
client_chunk_payload (const struct nbd_chunk *ch, const uint8_t *p,
                      uint32_t n)
{
  uint8_t *c = exact (p, n);
  const uint8_t *d;
  uint64_t offset;
  uint32_t error, len, context, l, f;
  uint16_t msg_len;
  size_t extents;

  switch (ch->type) {
  case NBD_REPLY_TYPE_OFFSET_DATA:
    if (nbd_parse_offset_data (c, n, &offset, &d, &len))
      CHECK (d + len == c + n);
    break;
  case NBD_REPLY_TYPE_ERROR:
    if (nbd_parse_error_chunk (c, n, &error, &d, &msg_len))
      CHECK (d + msg_len <= c + n);
    break;
  case NBD_REPLY_TYPE_BLOCK_STATUS:
    if (nbd_parse_block_status (c, n, &context, &extents)) {
      CHECK (extents >= 1 && NBD_BLOCK_STATUS_LEN (extents) ==
             NBD_CHUNK_HEADER_LEN + n);
      for (size_t i = 0; i < extents; i++)
        nbd_parse_extent (c, i, &l, &f);
    }
    break;
  }
  free (c);
}

/* What a server sends, read as pdio(1)'s client side reads it. */
static void
client_side (const uint8_t *p, size_t len)
{
  uint16_t gflags;
  uint32_t option, type, n, error;
  uint64_t cookie;
  struct nbd_chunk ch;

  if (len < NBD_GREETING_LEN || !nbd_parse_greeting (p, &gflags))
    return;
  p += NBD_GREETING_LEN;
  len -= NBD_GREETING_LEN;
  do {
    if (len < NBD_OPTION_REPLY_LEN ||
        !nbd_parse_option_reply (p, &option, &type, &n) ||
        n > len - NBD_OPTION_REPLY_LEN)
      return;
    client_option_payload (type, p + NBD_OPTION_REPLY_LEN, n);
    p += NBD_OPTION_REPLY_LEN + n;
    len -= NBD_OPTION_REPLY_LEN + n;
  } while (type != NBD_REP_ACK);

  while (len >= NBD_SIMPLE_REPLY_LEN) {
    if (nbd_parse_simple_reply (p, &error, &cookie)) {
      p += NBD_SIMPLE_REPLY_LEN;
      len -= NBD_SIMPLE_REPLY_LEN;
      continue;                 /* a READ's data would follow: unknown here */
    }
    if (len < NBD_CHUNK_HEADER_LEN || !nbd_parse_chunk_header (p, &ch) ||
        ch.length > len - NBD_CHUNK_HEADER_LEN)
      return;
    client_chunk_payload (&ch, p + NBD_CHUNK_HEADER_LEN, ch.length);
    p += NBD_CHUNK_HEADER_LEN + ch.length;
    len -= NBD_CHUNK_HEADER_LEN + ch.length;
  }
}

int LLVMFuzzerTestOneInput (const uint8_t *data, size_t size);

int
LLVMFuzzerTestOneInput (const uint8_t *data, size_t size)
{
  static const uint64_t sizes[] = {
    0, (1 << 20) + 512, UINT64_C (1) << 40, (UINT64_C (1) << 63) + 4096,
  };
  static const enum pdio_tls_mode modes[] = {
    PDIO_TLS_OFF, PDIO_TLS_ON, PDIO_TLS_REQUIRE, PDIO_TLS_REQUIRE,
  };
  static struct nbd_handshake h;        /* 10 KiB: not on the stack */
  struct nbd_export e;
  enum pdio_tls_mode mode;
  unsigned cap, starttls = 0;
  bool greeted = false;

  if (size < 2)
    return 0;
  if (data[0] & 0x40) {
    client_side (data + 2, size - 2);
    return 0;
  }
  e = (struct nbd_export) {
    .size = sizes[(data[0] >> 1) & 3], .readonly = data[0] & 1,
    .block_min = 1, .block_preferred = 4096, .block_max = NBD_MAX_PAYLOAD,
    .description = (data[0] & 8) ? "fuzz export" : NULL,
  };
  mode = modes[(data[0] >> 4) & 3];
  cap = data[1];
  data += 2;
  size -= 2;

  nbd_hs_init (&h, &e, mode);
  for (;;) {
    void *buf;
    size_t len, n;

    switch (nbd_hs_next (&h, &buf, &len)) {
    case NBD_HS_SEND:
      CHECK (len > 0 && len <= NBD_HS_OUT_MAX);
      if (!greeted) {
        uint16_t gflags;

        CHECK (len == NBD_GREETING_LEN && nbd_parse_greeting (buf, &gflags));
        CHECK (gflags == (NBD_FLAG_FIXED_NEWSTYLE | NBD_FLAG_NO_ZEROES));
        greeted = true;
      }
      else if (h.option == NBD_OPT_EXPORT_NAME && h.done_after_send) {
        CHECK (len == NBD_EXPORT_NAME_REPLY_LEN (h.no_zeroes));
        CHECK (mode != PDIO_TLS_REQUIRE || h.tls_active);
      }
      else {
        check_option_replies (&h, buf, len);
        if (mode == PDIO_TLS_REQUIRE && !h.tls_active)
          check_pre_tls_replies (buf, len, h.option);
      }
      nbd_hs_sent (&h);
      break;
    case NBD_HS_STARTTLS:
      CHECK (mode != PDIO_TLS_OFF && ++starttls == 1 && !h.tls_active);
      nbd_hs_tls_started (&h);
      CHECK (h.tls_active && !h.structured && !h.meta_base_allocation);
      break;
    case NBD_HS_RECV:
      CHECK (len > 0 && len <= NBD_HS_IN_MAX);
      CHECK (h.options <= NBD_HS_MAX_OPTIONS);
      if (size == 0)
        return 0;               /* the client stopped sending */
      n = len < size ? len : size;
      if (cap && n > cap)
        n = cap;
      memcpy (buf, data, n);
      data += n;
      size -= n;
      nbd_hs_received (&h, n);
      break;
    case NBD_HS_DONE:
      CHECK (mode != PDIO_TLS_REQUIRE || h.tls_active);
      check_session (&h.session, &e);
      transmission (&h.session, data, size);
      return 0;
    case NBD_HS_CLOSE:
      CHECK (h.why != NULL);
      return 0;
    }
  }
}
