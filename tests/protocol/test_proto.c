/* SPDX-License-Identifier: BSD-3-Clause */
/* The NBD codec (src/protocol): each message pdio sends or parses,
 * written and compared with its bytes as the spec lays them out (written
 * here by hand, not by the codec, so that a writer and a reader wrong in
 * the same way still fail), read back, and round-tripped with random
 * fields; every reader given bytes that are not its message -- a wrong
 * magic, one byte short, one byte over, lengths that do not add up --
 * must refuse them.  Readers read from a heap copy of exactly the bytes
 * they are given, so the ASan build (protocol/test_proto_asan) sees a read
 * past them.
 */
#include <config.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto.h"
#include "unit.h"

static uint64_t seed = 0x6e6264636f646563;       /* "nbdcodec" */

/* A heap copy of exactly n bytes (freed by the caller). */
static uint8_t *
exact (const void *p, size_t n)
{
  uint8_t *c = malloc (n ? n : 1);

  CHECK (c != NULL, "malloc");
  if (n)
    memcpy (c, p, n);
  return c;
}

static void
same_bytes (const char *what, const uint8_t *got, size_t got_len,
            const uint8_t *want, size_t want_len)
{
  CHECK (got_len == want_len, "%s: %zu bytes, want %zu", what, got_len,
         want_len);
  for (size_t i = 0; i < want_len; i++)
    CHECK (got[i] == want[i], "%s: byte %zu is %#04x, want %#04x", what, i,
           got[i], want[i]);
}

/* --- the handshake's messages -------------------------------------------- */
static void
test_greeting (void)
{
  static const uint8_t want[] = {
    'N', 'B', 'D', 'M', 'A', 'G', 'I', 'C',
    'I', 'H', 'A', 'V', 'E', 'O', 'P', 'T', 0x00, 0x03,
  };
  uint8_t buf[NBD_GREETING_LEN], *c;
  uint16_t flags;

  same_bytes ("greeting", buf, nbd_greeting (buf, NBD_FLAG_FIXED_NEWSTYLE |
                                             NBD_FLAG_NO_ZEROES),
              want, sizeof want);
  c = exact (want, sizeof want);
  CHECK (nbd_parse_greeting (c, &flags) && flags == 3, "greeting read back");
  c[0] = 'X';
  CHECK (!nbd_parse_greeting (c, &flags), "NBDMAGIC is checked");
  memcpy (c, want, sizeof want);
  c[15] = 'X';
  CHECK (!nbd_parse_greeting (c, &flags), "IHAVEOPT is checked");
  free (c);
}

static void
test_client_flags (void)
{
  static const uint8_t want[] = { 0, 0, 0, 3 };
  uint8_t buf[NBD_CLIENT_FLAGS_LEN];

  same_bytes ("client flags", buf,
              nbd_client_flags (buf, NBD_FLAG_C_FIXED_NEWSTYLE |
                                NBD_FLAG_C_NO_ZEROES), want, sizeof want);
  CHECK (nbd_parse_client_flags (want) == 3, "client flags read back");
}

static void
test_option_header (void)
{
  static const uint8_t want[] = {
    'I', 'H', 'A', 'V', 'E', 'O', 'P', 'T',
    0x00, 0x00, 0x00, 0x07, 0x00, 0x00, 0x01, 0x02,
  };
  uint8_t buf[NBD_OPTION_HEADER_LEN], *c;
  uint32_t option, length;

  same_bytes ("option header", buf, nbd_option_header (buf, NBD_OPT_GO, 258),
              want, sizeof want);
  c = exact (want, sizeof want);
  CHECK (nbd_parse_option_header (c, &option, &length) &&
         option == NBD_OPT_GO && length == 258, "option header read back");
  c[7] ^= 1;
  CHECK (!nbd_parse_option_header (c, &option, &length),
         "an option header's magic is checked");
  free (c);
  for (int i = 0; i < 1000; i++) {
    uint32_t o = unit_rand (&seed), l = unit_rand (&seed);

    nbd_option_header (buf, o, l);
    CHECK (nbd_parse_option_header (buf, &option, &length) &&
           option == o && length == l, "option header round trip");
  }
}

static void
test_option_reply (void)
{
  static const uint8_t want[] = {
    0x00, 0x03, 0xe8, 0x89, 0x04, 0x55, 0x65, 0xa9,
    0x00, 0x00, 0x00, 0x06, 0x80, 0x00, 0x00, 0x05, 0x00, 0x00, 0x00, 0x0c,
  };
  uint8_t buf[NBD_OPTION_REPLY_LEN], *c;
  uint32_t option, type, length;

  same_bytes ("option reply", buf,
              nbd_option_reply (buf, NBD_OPT_INFO, NBD_REP_ERR_TLS_REQD, 12),
              want, sizeof want);
  c = exact (want, sizeof want);
  CHECK (nbd_parse_option_reply (c, &option, &type, &length) &&
         option == NBD_OPT_INFO && type == NBD_REP_ERR_TLS_REQD &&
         length == 12, "option reply read back");
  c[1] ^= 0x10;
  CHECK (!nbd_parse_option_reply (c, &option, &type, &length),
         "an option reply's magic is checked");
  free (c);
  for (int i = 0; i < 1000; i++) {
    uint32_t o = unit_rand (&seed), t = unit_rand (&seed),
      l = unit_rand (&seed);

    nbd_option_reply (buf, o, t, l);
    CHECK (nbd_parse_option_reply (buf, &option, &type, &length) &&
           option == o && type == t && length == l,
           "option reply round trip");
  }
}

static void
test_export_name_reply (void)
{
  uint8_t want[134] = {
    0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x02, 0x00, 0x01, 0x4d,
  };
  uint8_t buf[134];

  memset (buf, 0xaa, sizeof buf);
  same_bytes ("EXPORT_NAME reply with zeroes", buf,
              nbd_export_name_reply (buf, UINT64_C (0x10000000200), 0x14d,
                                     false), want, 134);
  memset (buf, 0xaa, sizeof buf);
  same_bytes ("EXPORT_NAME reply without", buf,
              nbd_export_name_reply (buf, UINT64_C (0x10000000200), 0x14d,
                                     true), want, 10);
  CHECK (buf[10] == 0xaa, "NO_ZEROES: nothing written past 10 bytes");
}

static void
test_info_request (void)
{
  static const uint8_t want[] = {
    0x00, 0x00, 0x00, 0x03, 'a', 'b', 'c',
    0x00, 0x02, 0x00, 0x03, 0x00, 0x01,
  };
  static const uint16_t infos[] = { NBD_INFO_BLOCK_SIZE, NBD_INFO_NAME };
  static const uint8_t empty[] = { 0, 0, 0, 0, 0, 0 };
  uint8_t buf[NBD_INFO_REQUEST_LEN (3, 2)], *c;
  struct nbd_info_request r;

  same_bytes ("INFO request", buf, nbd_info_request (buf, "abc", 3, infos, 2),
              want, sizeof want);
  c = exact (want, sizeof want);
  CHECK (nbd_parse_info_request (c, sizeof want, &r), "INFO request read");
  CHECK (r.name_len == 3 && memcmp (r.name, "abc", 3) == 0, "its name");
  CHECK (r.n_infos == 2 && nbd_info_request_item (&r, 0) == 3 &&
         nbd_info_request_item (&r, 1) == 1, "its infos");
  free (c);
  same_bytes ("INFO request, default export, no infos", buf,
              nbd_info_request (buf, "", 0, NULL, 0), empty, sizeof empty);
  CHECK (nbd_parse_info_request (empty, sizeof empty, &r) &&
         r.name_len == 0 && r.n_infos == 0, "the shortest INFO request");

  /* Truncated, oversized, and lengths that do not add up. */
  for (uint32_t len = 0; len < sizeof want; len++) {
    c = exact (want, len);
    CHECK (!nbd_parse_info_request (c, len, &r),
           "INFO request cut to %u bytes", len);
    free (c);
  }
  {
    uint8_t over[sizeof want + 1];

    memcpy (over, want, sizeof want);
    over[sizeof want] = 0;
    c = exact (over, sizeof over);
    CHECK (!nbd_parse_info_request (c, sizeof over, &r),
           "INFO request with a byte over");
    free (c);
  }
  c = exact (want, sizeof want);
  c[3] = 200;                   /* a name longer than the option */
  CHECK (!nbd_parse_info_request (c, sizeof want, &r), "name past the end");
  c[3] = 0xff; c[0] = 0xff;     /* 4 GiB name: no overflow */
  CHECK (!nbd_parse_info_request (c, sizeof want, &r), "a 4 GiB name");
  memcpy (c, want, sizeof want);
  c[8] = 3;                     /* three infos, two present */
  CHECK (!nbd_parse_info_request (c, sizeof want, &r), "infos past the end");
  free (c);

  for (int i = 0; i < 200; i++) {
    uint8_t name[64], big[NBD_INFO_REQUEST_LEN (64, 8)];
    uint16_t list[8];
    uint32_t nl = unit_rand (&seed) % 64;
    uint16_t n = unit_rand (&seed) % 8;
    size_t len;

    for (uint32_t j = 0; j < nl; j++)
      name[j] = unit_rand (&seed);
    for (uint16_t j = 0; j < n; j++)
      list[j] = unit_rand (&seed);
    len = nbd_info_request (big, name, nl, list, n);
    CHECK (len == NBD_INFO_REQUEST_LEN (nl, n), "INFO request length");
    c = exact (big, len);
    CHECK (nbd_parse_info_request (c, len, &r) && r.name_len == nl &&
           memcmp (r.name, name, nl) == 0 && r.n_infos == n,
           "INFO request round trip");
    for (uint16_t j = 0; j < n; j++)
      CHECK (nbd_info_request_item (&r, j) == list[j], "info %u", j);
    free (c);
  }
}

/* A reader's verdict on an INFO payload of n bytes (from a copy). */
static bool
parse_info (const uint8_t *p, size_t n, struct nbd_info *i)
{
  uint8_t *c = exact (p, n);
  bool ok = nbd_parse_info (c, n, i);

  /* A string must lie within the payload; the copy is gone after this. */
  if (ok && i->string)
    CHECK (i->string == c + 2 && i->string_len == n - 2, "string bounds");
  if (ok && i->string)
    i->string = p + 2;
  free (c);
  return ok;
}

static void
test_info_payloads (void)
{
  static const uint8_t export[] = {
    0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x4d,
  };
  static const uint8_t block_size[] = {
    0x00, 0x03, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x10, 0x00,
    0x02, 0x00, 0x00, 0x00,
  };
  static const uint8_t name[] = { 0x00, 0x01, 'd', 'i', 's', 'k' };
  static const uint8_t desc[] = { 0x00, 0x02, 'a', ' ', 'd' };
  uint8_t buf[64], over[64] = { 0 };
  struct nbd_info i;

  same_bytes ("INFO_EXPORT", buf,
              nbd_info_export (buf, UINT64_C (1) << 40, 0x14d), export,
              sizeof export);
  CHECK (parse_info (export, sizeof export, &i) && i.type == NBD_INFO_EXPORT
         && i.size == UINT64_C (1) << 40 && i.eflags == 0x14d,
         "INFO_EXPORT read back");
  same_bytes ("INFO_BLOCK_SIZE", buf,
              nbd_info_block_size (buf, 512, 4096, 32 << 20), block_size,
              sizeof block_size);
  CHECK (parse_info (block_size, sizeof block_size, &i) &&
         i.type == NBD_INFO_BLOCK_SIZE && i.block_min == 512 &&
         i.block_preferred == 4096 && i.block_max == 32u << 20,
         "INFO_BLOCK_SIZE read back");
  same_bytes ("INFO_NAME", buf, nbd_info_string (buf, NBD_INFO_NAME, "disk", 4),
              name, sizeof name);
  CHECK (parse_info (name, sizeof name, &i) && i.type == NBD_INFO_NAME &&
         i.string_len == 4 && memcmp (i.string, "disk", 4) == 0,
         "INFO_NAME read back");
  same_bytes ("INFO_DESCRIPTION", buf,
              nbd_info_string (buf, NBD_INFO_DESCRIPTION, "a d", 3), desc,
              sizeof desc);
  CHECK (parse_info (desc, sizeof desc, &i) && i.type == NBD_INFO_DESCRIPTION
         && i.string_len == 3 && memcmp (i.string, "a d", 3) == 0,
         "INFO_DESCRIPTION read back");
  CHECK (parse_info (name, 2, &i) && i.string_len == 0, "an empty name");

  /* The fixed-size infos: one byte short or over is refused. */
  CHECK (!parse_info (export, sizeof export - 1, &i), "EXPORT cut short");
  memcpy (over, export, sizeof export);
  CHECK (!parse_info (over, sizeof export + 1, &i), "EXPORT a byte over");
  CHECK (!parse_info (block_size, sizeof block_size - 1, &i),
         "BLOCK_SIZE cut short");
  memcpy (over, block_size, sizeof block_size);
  CHECK (!parse_info (over, sizeof block_size + 1, &i),
         "BLOCK_SIZE a byte over");
  CHECK (!parse_info (export, 1, &i) && !parse_info (export, 0, &i),
         "no room for the type");
  /* A type pdio does not know: its type alone, for the caller to skip. */
  over[0] = 0; over[1] = 99;
  CHECK (parse_info (over, 7, &i) && i.type == 99 && i.string == NULL,
         "an unknown info");

  for (int k = 0; k < 1000; k++) {
    uint64_t size = unit_rand (&seed);
    uint16_t flags = unit_rand (&seed);
    uint32_t a = unit_rand (&seed), b = unit_rand (&seed),
      c = unit_rand (&seed);

    CHECK (parse_info (buf, nbd_info_export (buf, size, flags), &i) &&
           i.size == size && i.eflags == flags, "EXPORT round trip");
    CHECK (parse_info (buf, nbd_info_block_size (buf, a, b, c), &i) &&
           i.block_min == a && i.block_preferred == b && i.block_max == c,
           "BLOCK_SIZE round trip");
  }
}

static void
test_rep_server (void)
{
  static const uint8_t want[] = {
    0x00, 0x00, 0x00, 0x00, 'a', 'n', ' ', 'i', 'm', 'a', 'g', 'e',
  };
  static const uint8_t named[] = {
    0x00, 0x00, 0x00, 0x01, 'x', 'y', 'z',
  };
  uint8_t buf[32];

  CHECK (NBD_REP_SERVER_LEN (0, 8) == sizeof want, "NBD_REP_SERVER_LEN");
  same_bytes ("NBD_REP_SERVER", buf,
              nbd_rep_server (buf, "", 0, "an image", 8), want, sizeof want);
  same_bytes ("NBD_REP_SERVER with a name", buf,
              nbd_rep_server (buf, "x", 1, "yz", 2), named, sizeof named);
}

/* The queries of a parsed meta-context request, joined by ','. */
static void
queries (const struct nbd_meta_request *m, char *out, size_t len)
{
  const uint8_t *q;
  uint32_t pos = 0, n;
  size_t at = 0;

  out[0] = '\0';
  while (nbd_meta_request_next (m, &pos, &q, &n)) {
    CHECK (at + n + 2 <= len, "queries fit");
    if (at)
      out[at++] = ',';
    memcpy (out + at, q, n);
    at += n;
    out[at] = '\0';
  }
}

static void
test_meta_request (void)
{
  static const uint8_t want[] = {
    0x00, 0x00, 0x00, 0x01, 'e',
    0x00, 0x00, 0x00, 0x02,
    0x00, 0x00, 0x00, 0x05, 'b', 'a', 's', 'e', ':',
    0x00, 0x00, 0x00, 0x01, 'x',
  };
  static const uint8_t none[] = { 0, 0, 0, 0, 0, 0, 0, 0 };
  struct nbd_meta_request m;
  char got[64];
  uint8_t *c;

  c = exact (want, sizeof want);
  CHECK (nbd_parse_meta_request (c, sizeof want, &m), "meta request read");
  CHECK (m.name_len == 1 && m.name[0] == 'e' && m.n_queries == 2,
         "its name and count");
  queries (&m, got, sizeof got);
  CHECK (strcmp (got, "base:,x") == 0, "its queries: %s", got);
  free (c);
  CHECK (nbd_parse_meta_request (none, sizeof none, &m) &&
         m.n_queries == 0, "no query");
  queries (&m, got, sizeof got);
  CHECK (got[0] == '\0', "no query walked");

  for (uint32_t len = 0; len < sizeof want; len++) {
    c = exact (want, len);
    CHECK (!nbd_parse_meta_request (c, len, &m),
           "meta request cut to %u bytes", len);
    free (c);
  }
  {
    uint8_t over[sizeof want + 1];

    memcpy (over, want, sizeof want);
    over[sizeof want] = 'z';
    c = exact (over, sizeof over);
    CHECK (!nbd_parse_meta_request (c, sizeof over, &m),
           "a byte after the last query");
    free (c);
  }
  c = exact (want, sizeof want);
  c[8] = 3;                     /* three queries, two present */
  CHECK (!nbd_parse_meta_request (c, sizeof want, &m), "a query missing");
  c[8] = 1;                     /* one query, the second left over */
  CHECK (!nbd_parse_meta_request (c, sizeof want, &m), "a query too many");
  c[8] = 2;
  c[12] = 200;                  /* a query running past the option */
  CHECK (!nbd_parse_meta_request (c, sizeof want, &m), "query past the end");
  c[12] = 5;
  c[3] = 100;                   /* a name running past the option */
  CHECK (!nbd_parse_meta_request (c, sizeof want, &m), "name past the end");
  c[3] = 1;
  memset (c + 5, 0xff, 4);      /* 4 billion queries: bounded by the bytes */
  CHECK (!nbd_parse_meta_request (c, sizeof want, &m), "a huge count");
  free (c);
}

static void
test_meta_context_reply (void)
{
  static const uint8_t want[] = {
    0x00, 0x00, 0x00, 0x01, 'b', 'a', 's', 'e', ':', 'a', 'l', 'l', 'o', 'c',
    'a', 't', 'i', 'o', 'n',
  };
  uint8_t buf[64], *c;
  const uint8_t *name;
  size_t n;
  uint32_t id;

  same_bytes ("NBD_REP_META_CONTEXT", buf,
              nbd_meta_context_reply (buf, NBD_META_ID_BASE_ALLOCATION,
                                      NBD_CONTEXT_BASE_ALLOCATION, 15),
              want, sizeof want);
  c = exact (want, sizeof want);
  CHECK (nbd_parse_meta_context_reply (c, sizeof want, &id, &name, &n) &&
         id == 1 && n == 15 && name == c + 4 &&
         memcmp (name, "base:allocation", 15) == 0,
         "NBD_REP_META_CONTEXT read back");
  free (c);
  for (size_t len = 0; len < 4; len++) {
    c = exact (want, len);
    CHECK (!nbd_parse_meta_context_reply (c, len, &id, &name, &n),
           "meta context reply cut to %zu bytes", len);
    free (c);
  }
}

/* --- the transmission's messages ------------------------------------------- */
static void
test_request (void)
{
  static const uint8_t want[] = {
    0x25, 0x60, 0x95, 0x13, 0x00, 0x05, 0x00, 0x01,
    0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08,
    0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x02, 0x00,
    0x00, 0x01, 0x00, 0x00,
  };
  const struct nbd_request r = {
    .flags = NBD_CMD_FLAG_FUA | NBD_CMD_FLAG_DF, .type = NBD_CMD_WRITE,
    .cookie = UINT64_C (0x0102030405060708),
    .offset = UINT64_C (0x100000200), .count = 65536,
  };
  uint8_t buf[NBD_REQUEST_LEN], *c;
  struct nbd_request got;

  nbd_request_bytes (buf, &r);
  same_bytes ("request", buf, sizeof buf, want, sizeof want);
  c = exact (want, sizeof want);
  CHECK (nbd_parse_request (c, &got) && got.flags == r.flags &&
         got.type == r.type && got.cookie == r.cookie &&
         got.offset == r.offset && got.count == r.count,
         "request read back");
  c[3] ^= 1;
  CHECK (!nbd_parse_request (c, &got), "a request's magic is checked");
  free (c);
  for (int i = 0; i < 1000; i++) {
    struct nbd_request x = {
      .flags = unit_rand (&seed), .type = unit_rand (&seed),
      .cookie = unit_rand (&seed), .offset = unit_rand (&seed),
      .count = unit_rand (&seed),
    };

    nbd_request_bytes (buf, &x);
    CHECK (nbd_parse_request (buf, &got) &&
           got.flags == x.flags && got.type == x.type &&
           got.cookie == x.cookie && got.offset == x.offset &&
           got.count == x.count, "request round trip");
  }
}

static void
test_simple_reply (void)
{
  static const uint8_t want[] = {
    0x67, 0x44, 0x66, 0x98, 0x00, 0x00, 0x00, 0x16,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x2a,
  };
  uint8_t buf[NBD_SIMPLE_REPLY_LEN], *c;
  uint32_t error;
  uint64_t cookie;

  same_bytes ("simple reply", buf, nbd_simple_reply (buf, 42, NBD_EINVAL),
              want, sizeof want);
  c = exact (want, sizeof want);
  CHECK (nbd_parse_simple_reply (c, &error, &cookie) &&
         error == NBD_EINVAL && cookie == 42, "simple reply read back");
  c[0] ^= 0x80;
  CHECK (!nbd_parse_simple_reply (c, &error, &cookie),
         "a simple reply's magic is checked");
  free (c);
  for (int i = 0; i < 1000; i++) {
    uint64_t k = unit_rand (&seed);
    uint32_t e = unit_rand (&seed);

    nbd_simple_reply (buf, k, e);
    CHECK (nbd_parse_simple_reply (buf, &error, &cookie) && error == e &&
           cookie == k, "simple reply round trip");
  }
}

static void
test_chunks (void)
{
  static const uint8_t data_hdr[] = {
    0x66, 0x8e, 0x33, 0xef, 0x00, 0x00, 0x00, 0x01,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x07,
    0x00, 0x00, 0x02, 0x08,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x10, 0x00, 0x00,
  };
  static const uint8_t none[] = {
    0x66, 0x8e, 0x33, 0xef, 0x00, 0x01, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x07,
    0x00, 0x00, 0x00, 0x00,
  };
  static const uint8_t error[] = {
    0x66, 0x8e, 0x33, 0xef, 0x00, 0x01, 0x80, 0x01,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x07,
    0x00, 0x00, 0x00, 0x06,
    0x00, 0x00, 0x00, 0x1c, 0x00, 0x00,
  };
  uint8_t buf[64], *c;
  struct nbd_chunk ch;
  const uint8_t *d;
  uint64_t offset;
  uint32_t len, err;
  uint16_t msg_len;

  same_bytes ("OFFSET_DATA header", buf,
              nbd_offset_data_header (buf, 7, 1 << 20, 512, false),
              data_hdr, sizeof data_hdr);
  c = exact (data_hdr, sizeof data_hdr);
  CHECK (nbd_parse_chunk_header (c, &ch) && ch.flags == 0 &&
         ch.type == NBD_REPLY_TYPE_OFFSET_DATA && ch.cookie == 7 &&
         ch.length == 520, "OFFSET_DATA's chunk header read back");
  free (c);
  c = exact (data_hdr + NBD_CHUNK_HEADER_LEN, NBD_OFFSET_DATA_FIXED);
  CHECK (nbd_parse_offset_data (c, NBD_OFFSET_DATA_FIXED, &offset, &d, &len)
         && offset == 1 << 20 && len == 0 && d == c + NBD_OFFSET_DATA_FIXED,
         "OFFSET_DATA's offset read back");
  CHECK (!nbd_parse_offset_data (c, NBD_OFFSET_DATA_FIXED - 1, &offset, &d,
                                 &len), "OFFSET_DATA without its offset");
  free (c);
  nbd_offset_data_header (buf, 7, 0, 512, true);
  CHECK (nbd_parse_chunk_header (buf, &ch) && ch.flags == NBD_REPLY_FLAG_DONE,
         "the last OFFSET_DATA says DONE");

  same_bytes ("NONE chunk", buf, nbd_none_chunk (buf, 7), none, sizeof none);
  CHECK (nbd_parse_chunk_header (none, &ch) && ch.type == NBD_REPLY_TYPE_NONE
         && ch.flags == NBD_REPLY_FLAG_DONE && ch.length == 0,
         "NONE read back");

  same_bytes ("ERROR chunk", buf, nbd_error_chunk (buf, 7, NBD_ENOSPC),
              error, sizeof error);
  c = exact (error + NBD_CHUNK_HEADER_LEN, NBD_ERROR_FIXED);
  CHECK (nbd_parse_error_chunk (c, NBD_ERROR_FIXED, &err, &d, &msg_len) &&
         err == NBD_ENOSPC && msg_len == 0, "ERROR read back");
  CHECK (!nbd_parse_error_chunk (c, NBD_ERROR_FIXED - 1, &err, &d, &msg_len),
         "ERROR cut short");
  free (c);
  {
    static const uint8_t msg[] = { 0, 0, 0, 5, 0, 3, 'b', 'a', 'd' };

    c = exact (msg, sizeof msg);
    CHECK (nbd_parse_error_chunk (c, sizeof msg, &err, &d, &msg_len) &&
           err == NBD_EIO && msg_len == 3 && memcmp (d, "bad", 3) == 0,
           "an ERROR with a message");
    CHECK (!nbd_parse_error_chunk (c, sizeof msg - 1, &err, &d, &msg_len),
           "a message running past the chunk");
    free (c);
  }
  memcpy (buf, none, sizeof none);
  buf[2] ^= 1;
  CHECK (!nbd_parse_chunk_header (buf, &ch), "a chunk's magic is checked");
}

static void
test_block_status (void)
{
  static const uint8_t want[] = {
    0x66, 0x8e, 0x33, 0xef, 0x00, 0x01, 0x00, 0x05,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x09,
    0x00, 0x00, 0x00, 0x14,
    0x00, 0x00, 0x00, 0x01,
    0x00, 0x00, 0x30, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x10, 0x00, 0x00, 0x00, 0x00, 0x03,
  };
  uint8_t buf[NBD_BLOCK_STATUS_LEN (4)], *c;
  struct nbd_extents x;
  struct nbd_chunk ch;
  uint32_t context, l, f;
  size_t n;

  /* Two data runs merge; the hole is cut at the request's end. */
  nbd_extents_init (&x, buf, 4, 16384);
  CHECK (nbd_extents_add (&x, 4096, 0) && nbd_extents_add (&x, 8192, 0),
         "room for more");
  CHECK (!nbd_extents_add (&x, 1 << 20, NBD_STATE_HOLE | NBD_STATE_ZERO),
         "the request is described");
  CHECK (x.n == 2 && x.total == 16384, "two extents, the whole request");
  same_bytes ("BLOCK_STATUS", buf, nbd_extents_finish (&x, 9), want,
              sizeof want);
  CHECK (nbd_parse_chunk_header (want, &ch) &&
         ch.type == NBD_REPLY_TYPE_BLOCK_STATUS && ch.length == 20,
         "BLOCK_STATUS header read back");
  c = exact (want + NBD_CHUNK_HEADER_LEN, ch.length);
  CHECK (nbd_parse_block_status (c, ch.length, &context, &n) &&
         context == NBD_META_ID_BASE_ALLOCATION && n == 2,
         "BLOCK_STATUS payload read back");
  nbd_parse_extent (c, 0, &l, &f);
  CHECK (l == 12288 && f == 0, "extent 0: %u %u", l, f);
  nbd_parse_extent (c, 1, &l, &f);
  CHECK (l == 4096 && f == 3, "extent 1: %u %u", l, f);
  /* Cut to its first extent, it is still one; any other cut is not. */
  for (uint32_t len = 0; len < ch.length; len++)
    if (len == NBD_BLOCK_STATUS_FIXED + NBD_EXTENT_LEN)
      CHECK (nbd_parse_block_status (c, len, &context, &n) && n == 1,
             "BLOCK_STATUS cut to one extent");
    else
      CHECK (!nbd_parse_block_status (c, len, &context, &n),
             "BLOCK_STATUS payload of %u bytes", len);
  free (c);
  {
    uint8_t over[64];

    memcpy (over, want + NBD_CHUNK_HEADER_LEN, 20);
    CHECK (!nbd_parse_block_status (over, 21, &context, &n),
           "BLOCK_STATUS with a byte over");
  }

  /* REQ_ONE: room for one; a full buffer refuses, and never describes
   * past the request.
   */
  nbd_extents_init (&x, buf, 1, 100);
  CHECK (nbd_extents_add (&x, 10, 0), "one");
  CHECK (!nbd_extents_add (&x, 10, NBD_STATE_HOLE), "no room for two");
  CHECK (x.n == 1 && x.total == 10, "one extent");
  CHECK (NBD_BLOCK_STATUS_ROOM (NBD_BLOCK_STATUS_LEN (7)) == 7,
         "NBD_BLOCK_STATUS_ROOM");
  CHECK (NBD_BLOCK_STATUS_ROOM (NBD_BLOCK_STATUS_LEN (7) + 7) == 7,
         "NBD_BLOCK_STATUS_ROOM rounds down");
}

int
main (void)
{
  test_greeting ();
  test_client_flags ();
  test_option_header ();
  test_option_reply ();
  test_export_name_reply ();
  test_info_request ();
  test_info_payloads ();
  test_rep_server ();
  test_meta_request ();
  test_meta_context_reply ();
  test_request ();
  test_simple_reply ();
  test_chunks ();
  test_block_status ();
  printf ("test_proto: ok\n");
  return 0;
}
