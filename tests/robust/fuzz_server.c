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
 * Invariants (any violation aborts):
 *   - every option reply the server sends is well formed: magic, the
 *     option it answers, a length that matches what follows; the greeting
 *     is the fixed newstyle one; EXPORT_NAME's reply is 10 or 134 bytes;
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
 *   - reply builders write exactly their stated lengths (ASan), and a
 *     block status reply never describes more than the request;
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

static void
check_option_replies (const uint8_t *p, size_t len, uint32_t option)
{
  while (len) {
    uint32_t n;

    CHECK (len >= NBD_OPTION_REPLY_LEN);
    CHECK (nbd_get64 (p) == NBD_REP_MAGIC);
    CHECK (nbd_get32 (p + 8) == option);
    n = nbd_get32 (p + 16);
    CHECK (n <= len - NBD_OPTION_REPLY_LEN);
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
    uint32_t type = nbd_get32 (p + 12), n = nbd_get32 (p + 16);

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

/* Builds the reply the connection would send, from input bytes. */
static void
build_reply (const struct nbd_request *r, const struct nbd_verdict *v,
             const struct nbd_session *s, const uint8_t *data, size_t len)
{
  uint8_t hdr[NBD_OFFSET_DATA_HEADER_LEN];
  uint8_t bs[NBD_BLOCK_STATUS_LEN (16)];
  struct nbd_extents x;

  if (v->error) {
    if (s->structured)
      CHECK (nbd_error_chunk (bs, r->cookie, v->error) == NBD_ERROR_CHUNK_LEN);
    else
      CHECK (nbd_simple_reply (hdr, r->cookie, v->error) == 16);
    return;
  }
  switch (r->type) {
  case NBD_CMD_READ:
    if (s->structured)
      CHECK (nbd_offset_data_header (hdr, r->cookie, r->offset, r->count, true) ==
             NBD_OFFSET_DATA_HEADER_LEN);
    break;
  case NBD_CMD_BLOCK_STATUS:
    nbd_extents_init (&x, bs, (r->flags & NBD_CMD_FLAG_REQ_ONE) ? 1 : 16,
                      r->count);
    for (size_t i = 0; i + 5 <= len; i += 5)
      if (!nbd_extents_add (&x, nbd_get32 (data + i), data[i + 4] & 3))
        break;
    if (x.n == 0)
      nbd_extents_add (&x, r->count, 0);
    CHECK (x.n >= 1 && x.total <= r->count);
    {
      uint64_t sum = 0;
      for (size_t i = 0; i < x.n; i++) {
        uint32_t l = nbd_get32 (bs + NBD_BLOCK_STATUS_LEN (i));
        CHECK (l > 0);
        sum += l;
      }
      CHECK (sum == x.total);
    }
    CHECK (nbd_extents_finish (&x, r->cookie) == NBD_BLOCK_STATUS_LEN (x.n));
    break;
  default:
    if (s->structured)
      CHECK (nbd_none_chunk (hdr, r->cookie) == NBD_CHUNK_HEADER_LEN);
    else
      CHECK (nbd_simple_reply (hdr, r->cookie, 0) == NBD_SIMPLE_REPLY_LEN);
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
        CHECK (len == 18 && nbd_get64 (buf) == NBD_MAGIC);
        greeted = true;
      }
      else if (h.option == NBD_OPT_EXPORT_NAME && h.done_after_send) {
        CHECK (len == 10 || len == 134);
        CHECK (mode != PDIO_TLS_REQUIRE || h.tls_active);
      }
      else {
        check_option_replies (buf, len, h.option);
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
