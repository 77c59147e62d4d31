/* SPDX-License-Identifier: BSD-3-Clause */
/* The NBD wire format, and nothing else: constants, the codec (one
 * function to write and one to read each message pdio sends or parses,
 * so no other file knows where a field sits), and the rules that decide
 * whether a request is valid; pdio's server, pdio(1)'s client handshake
 * and the C test clients share it.  No I/O and no allocation, so the
 * fuzzer (tests/protocol/fuzz_server.c) can drive all of it.
 *
 * One job per file: handshake_wire.c the messages of the handshake phase,
 * transmission_wire.c those of the transmission phase, proto.c the rules.
 * ktls.c and gnutls.c, at the end, are the exceptions to "no I/O": the
 * kTLS hand-off and the loading of GnuTLS that both ends of NBD over TLS
 * need, outside the fuzzed set.
 *
 * The codec's conventions: nbd_X (buf, ...) writes message X into buf,
 * which has room for it (its _LEN below), and returns its length;
 * nbd_parse_X (buf, ...) reads it and returns false if the bytes are not
 * such a message (a wrong magic, a length its fields do not add up to).
 * A fixed-size message is read from a buffer of its whole length; a
 * variable one from a pointer and a length, never read past.  Decoded
 * strings point into the buffer and are not NUL-terminated.
 *
 * Reference: doc/proto.md in NetworkBlockDevice/nbd.  Everything on the
 * wire is big-endian.
 */
#ifndef PDIO_PROTOCOL_PROTO_H
#define PDIO_PROTOCOL_PROTO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* --- handshake ----------------------------------------------------------- */
#define NBD_MAGIC               UINT64_C (0x4e42444d41474943) /* "NBDMAGIC" */
#define NBD_IHAVEOPT            UINT64_C (0x49484156454F5054) /* "IHAVEOPT" */
#define NBD_REP_MAGIC           UINT64_C (0x3e889045565a9)

#define NBD_FLAG_FIXED_NEWSTYLE   (1u << 0)
#define NBD_FLAG_NO_ZEROES        (1u << 1)
#define NBD_FLAG_C_FIXED_NEWSTYLE (1u << 0)
#define NBD_FLAG_C_NO_ZEROES      (1u << 1)

#define NBD_OPT_EXPORT_NAME       1
#define NBD_OPT_ABORT             2
#define NBD_OPT_LIST              3
#define NBD_OPT_STARTTLS          5
#define NBD_OPT_INFO              6
#define NBD_OPT_GO                7
#define NBD_OPT_STRUCTURED_REPLY  8
#define NBD_OPT_LIST_META_CONTEXT 9
#define NBD_OPT_SET_META_CONTEXT  10

#define NBD_REP_ACK               1u
#define NBD_REP_SERVER            2u
#define NBD_REP_INFO              3u
#define NBD_REP_META_CONTEXT      4u
#define NBD_REP_ERR_BIT           0x80000000u
#define NBD_REP_ERR_UNSUP         (NBD_REP_ERR_BIT + 1)
#define NBD_REP_ERR_POLICY        (NBD_REP_ERR_BIT + 2)
#define NBD_REP_ERR_INVALID       (NBD_REP_ERR_BIT + 3)
#define NBD_REP_ERR_TLS_REQD      (NBD_REP_ERR_BIT + 5)
#define NBD_REP_ERR_UNKNOWN       (NBD_REP_ERR_BIT + 6)
#define NBD_REP_ERR_SHUTDOWN      (NBD_REP_ERR_BIT + 7)
#define NBD_REP_ERR_TOO_BIG       (NBD_REP_ERR_BIT + 9)

#define NBD_INFO_EXPORT           0
#define NBD_INFO_NAME             1
#define NBD_INFO_DESCRIPTION      2
#define NBD_INFO_BLOCK_SIZE       3

/* Transmission flags. */
#define NBD_FLAG_HAS_FLAGS        (1u << 0)
#define NBD_FLAG_READ_ONLY        (1u << 1)
#define NBD_FLAG_SEND_FLUSH       (1u << 2)
#define NBD_FLAG_SEND_FUA         (1u << 3)
#define NBD_FLAG_SEND_TRIM        (1u << 5)
#define NBD_FLAG_SEND_WRITE_ZEROES (1u << 6)
#define NBD_FLAG_SEND_DF          (1u << 7)
#define NBD_FLAG_CAN_MULTI_CONN   (1u << 8)
#define NBD_FLAG_SEND_FAST_ZERO   (1u << 11)

/* The one metadata context pdio has, and the id it goes by. */
#define NBD_CONTEXT_BASE_ALLOCATION "base:allocation"
#define NBD_META_ID_BASE_ALLOCATION 1u
#define NBD_STATE_HOLE            (1u << 0)
#define NBD_STATE_ZERO            (1u << 1)

/* --- transmission -------------------------------------------------------- */
#define NBD_REQUEST_MAGIC         0x25609513u
#define NBD_SIMPLE_REPLY_MAGIC    0x67446698u
#define NBD_STRUCTURED_REPLY_MAGIC 0x668e33efu

#define NBD_CMD_READ              0
#define NBD_CMD_WRITE             1
#define NBD_CMD_DISC              2
#define NBD_CMD_FLUSH             3
#define NBD_CMD_TRIM              4
#define NBD_CMD_WRITE_ZEROES      6
#define NBD_CMD_BLOCK_STATUS      7

#define NBD_CMD_FLAG_FUA          (1u << 0)
#define NBD_CMD_FLAG_NO_HOLE      (1u << 1)
#define NBD_CMD_FLAG_DF           (1u << 2)
#define NBD_CMD_FLAG_REQ_ONE      (1u << 3)
#define NBD_CMD_FLAG_FAST_ZERO    (1u << 4)

#define NBD_REPLY_FLAG_DONE       (1u << 0)
#define NBD_REPLY_TYPE_NONE       0
#define NBD_REPLY_TYPE_OFFSET_DATA 1
#define NBD_REPLY_TYPE_BLOCK_STATUS 5
#define NBD_REPLY_TYPE_ERROR      ((1u << 15) + 1)

/* Error values the spec allows on the wire. */
#define NBD_EPERM                 1
#define NBD_EIO                   5
#define NBD_ENOMEM                12
#define NBD_EINVAL                22
#define NBD_ENOSPC                28
#define NBD_EOVERFLOW             75
#define NBD_ENOTSUP               95
#define NBD_ESHUTDOWN             108

/* The lengths of the messages, as the codec below writes and reads them. */
#define NBD_GREETING_LEN          18    /* NBDMAGIC, IHAVEOPT, flags */
#define NBD_CLIENT_FLAGS_LEN      4
#define NBD_OPTION_HEADER_LEN     16    /* IHAVEOPT, option, length */
#define NBD_OPTION_REPLY_LEN      20    /* magic, option, type, length */
/* EXPORT_NAME's answer: size and flags, then 124 zeroes unless the client
 * asked for none.
 */
#define NBD_EXPORT_NAME_REPLY_LEN(no_zeroes) ((no_zeroes) ? 10u : 134u)
/* INFO and GO's data: the export name, then the info types asked for. */
#define NBD_INFO_REQUEST_LEN(name_len, n) \
  (4 + (size_t) (name_len) + 2 + 2 * (size_t) (n))
/* The NBD_REP_INFO payloads; NAME and DESCRIPTION are a string. */
#define NBD_INFO_EXPORT_LEN       12
#define NBD_INFO_BLOCK_SIZE_LEN   14
#define NBD_INFO_STRING_LEN(n)    (2 + (size_t) (n))
/* NBD_REP_SERVER (LIST): the name's length, the name, the description. */
#define NBD_REP_SERVER_LEN(name_len, desc_len) \
  (4 + (size_t) (name_len) + (size_t) (desc_len))
/* NBD_REP_META_CONTEXT: the context id, then its name. */
#define NBD_META_CONTEXT_REPLY_LEN(n) (4 + (size_t) (n))

#define NBD_REQUEST_LEN           28
#define NBD_SIMPLE_REPLY_LEN      16
#define NBD_CHUNK_HEADER_LEN      20
/* The fixed start of each structured chunk's payload: OFFSET_DATA's
 * offset (the data follows), ERROR's error and message length (the
 * message follows), BLOCK_STATUS's context id (the descriptors follow).
 */
#define NBD_OFFSET_DATA_FIXED     8
#define NBD_ERROR_FIXED           6
#define NBD_BLOCK_STATUS_FIXED    4
#define NBD_OFFSET_DATA_HEADER_LEN (NBD_CHUNK_HEADER_LEN + NBD_OFFSET_DATA_FIXED)
#define NBD_ERROR_CHUNK_LEN       (NBD_CHUNK_HEADER_LEN + NBD_ERROR_FIXED)
/* Block status chunk: header, context id, then one descriptor (length,
 * flags) per extent.
 */
#define NBD_EXTENT_LEN            8
#define NBD_BLOCK_STATUS_LEN(n) \
  (NBD_CHUNK_HEADER_LEN + NBD_BLOCK_STATUS_FIXED + \
   NBD_EXTENT_LEN * (size_t) (n))
/* How many extents a block status chunk of len bytes (at least
 * NBD_BLOCK_STATUS_LEN (0)) has room for.
 */
#define NBD_BLOCK_STATUS_ROOM(len) \
  (((size_t) (len) - NBD_BLOCK_STATUS_LEN (0)) / NBD_EXTENT_LEN)

/* The maximum block size pdio advertises (what the kernel client sends at
 * most), and the largest READ or WRITE it serves: nbdkit's limit, which
 * clients that ignore the advertised maximum rely on.  A longer one is
 * refused (a WRITE's payload read and dropped); the server streams any
 * payload through bounded buffers, so neither size is ever allocated.
 */
#define NBD_MAX_PAYLOAD           (32u * 1024 * 1024)
#define NBD_MAX_REQUEST           (64u * 1024 * 1024)

/* --- big-endian helpers --------------------------------------------------- */
/* nbd_put16/32/64 and nbd_get16/32/64 (src/common): the codec's own tools.
 * Outside src/protocol they serve pdio's formats that are not NBD (the
 * hand-over's records); an NBD message is written and read only through
 * the codec below.
 */
#include "byteorder.h"

/* --- what the export offers (proto.c) --------------------------------------- */
/* Everything a connection's replies depend on: the export as opened and
 * what this client negotiated.  Filled by the handshake.
 */
struct nbd_export {
  uint64_t size;
  bool readonly;
  uint32_t block_min, block_preferred, block_max;
  const char *description;      /* NBD_INFO_DESCRIPTION, or NULL */
};

struct nbd_session {
  uint64_t size;
  uint16_t eflags;              /* transmission flags sent to the client */
  uint32_t block_max;
  bool structured;              /* NBD_OPT_STRUCTURED_REPLY acked */
  bool meta_base_allocation;    /* base:allocation selected */
};

/* The transmission flags of an export (NBD_FLAG_SEND_DF only with
 * structured replies, as the spec requires): what the nbdkit plugin gets
 * from nbdkit, so both front ends advertise the same.
 */
extern uint16_t nbd_export_flags (const struct nbd_export *e, bool structured);

/* --- the handshake's messages (handshake_wire.c) ------------------------------ */
/* The server's greeting (fixed newstyle); false unless it starts with
 * NBDMAGIC and IHAVEOPT.
 */
extern size_t nbd_greeting (uint8_t buf[NBD_GREETING_LEN], uint16_t gflags);
extern bool nbd_parse_greeting (const uint8_t buf[NBD_GREETING_LEN],
                                uint16_t *gflags);
/* The client's answer to it: its flags (NBD_FLAG_C_*). */
extern size_t nbd_client_flags (uint8_t buf[NBD_CLIENT_FLAGS_LEN],
                                uint32_t cflags);
extern uint32_t nbd_parse_client_flags (const uint8_t buf[NBD_CLIENT_FLAGS_LEN]);

/* An option's header (its data follows); false if the magic is not
 * IHAVEOPT.
 */
extern size_t nbd_option_header (uint8_t *buf, uint32_t option,
                                 uint32_t length);
extern bool nbd_parse_option_header (const uint8_t buf[NBD_OPTION_HEADER_LEN],
                                     uint32_t *option, uint32_t *length);
/* An option reply's header (its length bytes of payload follow); false if
 * the magic is not the reply magic (the fields are read all the same, for
 * a message).
 */
extern size_t nbd_option_reply (uint8_t *buf, uint32_t option, uint32_t type,
                                uint32_t length);
extern bool nbd_parse_option_reply (const uint8_t buf[NBD_OPTION_REPLY_LEN],
                                    uint32_t *option, uint32_t *type,
                                    uint32_t *length);

/* EXPORT_NAME's answer (NBD_EXPORT_NAME_REPLY_LEN (no_zeroes) bytes). */
extern size_t nbd_export_name_reply (uint8_t *buf, uint64_t size,
                                     uint16_t eflags, bool no_zeroes);

/* INFO and GO's data: an export name and a list of NBD_INFO_* asked for. */
extern size_t nbd_info_request (uint8_t *buf, const void *name,
                                uint32_t name_len, const uint16_t *infos,
                                uint16_t n_infos);
struct nbd_info_request {
  const uint8_t *name;
  uint32_t name_len;
  uint16_t n_infos;
  const uint8_t *infos;         /* read with nbd_info_request_item */
};
/* false unless the name and the list fill the len bytes exactly. */
extern bool nbd_parse_info_request (const uint8_t *d, uint32_t len,
                                    struct nbd_info_request *r);
/* The i-th info asked for (i < n_infos). */
extern uint16_t nbd_info_request_item (const struct nbd_info_request *r,
                                       uint16_t i);

/* NBD_REP_INFO's payloads: EXPORT (size and transmission flags),
 * NAME or DESCRIPTION (type, then the string), BLOCK_SIZE.
 */
extern size_t nbd_info_export (uint8_t *p, uint64_t size, uint16_t eflags);
extern size_t nbd_info_string (uint8_t *p, uint16_t type, const void *s,
                               size_t n);
extern size_t nbd_info_block_size (uint8_t *p, uint32_t min,
                                   uint32_t preferred, uint32_t max);
struct nbd_info {
  uint16_t type;                /* NBD_INFO_* */
  uint64_t size;                /* EXPORT */
  uint16_t eflags;
  uint32_t block_min, block_preferred, block_max;       /* BLOCK_SIZE */
  const uint8_t *string;        /* NAME, DESCRIPTION */
  size_t string_len;
};
/* false if len is not what the type's layout has (EXPORT 12 bytes,
 * BLOCK_SIZE 14, any at least its 2-byte type); a type pdio does not know
 * is true with only the type read.
 */
extern bool nbd_parse_info (const uint8_t *p, size_t len, struct nbd_info *i);

/* NBD_REP_SERVER, LIST's reply for one export. */
extern size_t nbd_rep_server (uint8_t *p, const void *name, uint32_t name_len,
                              const void *desc, size_t desc_len);

/* LIST_META_CONTEXT and SET_META_CONTEXT's data: an export name and the
 * queries, each a length and a string.
 */
struct nbd_meta_request {
  const uint8_t *name;
  uint32_t name_len;
  uint32_t n_queries;
  const uint8_t *queries;       /* read with nbd_meta_request_next */
  uint32_t queries_len;
};
/* false unless the name and n_queries queries fill the len bytes exactly. */
extern bool nbd_parse_meta_request (const uint8_t *d, uint32_t len,
                                    struct nbd_meta_request *m);
/* The query at *pos (0 for the first), moving *pos past it; false after
 * the last.
 */
extern bool nbd_meta_request_next (const struct nbd_meta_request *m,
                                   uint32_t *pos, const uint8_t **q,
                                   uint32_t *q_len);
/* NBD_REP_META_CONTEXT: a context's id and name. */
extern size_t nbd_meta_context_reply (uint8_t *p, uint32_t id,
                                      const void *name, size_t n);
extern bool nbd_parse_meta_context_reply (const uint8_t *p, size_t len,
                                          uint32_t *id, const uint8_t **name,
                                          size_t *n);

/* --- requests (transmission_wire.c; the verdict in proto.c) ------------------ */
struct nbd_request {
  uint16_t flags;
  uint16_t type;
  uint64_t cookie;              /* the spec's "handle" */
  uint64_t offset;
  uint32_t count;
};

/* false if the magic is wrong (the stream is lost: hang up). */
extern bool nbd_parse_request (const uint8_t buf[NBD_REQUEST_LEN],
                               struct nbd_request *r);
/* The request's 28 bytes as a client sends them: what nbd_parse_request
 * read, for a server handing a request it has not started to another.
 */
extern void nbd_request_bytes (uint8_t buf[NBD_REQUEST_LEN],
                               const struct nbd_request *r);

/* The verdict on a parsed request. */
struct nbd_verdict {
  uint32_t error;               /* 0: serve it; else the NBD error to reply */
  uint32_t discard;             /* payload bytes to read and drop: a refused
                                   WRITE still sends its data, of any length
                                   (it is read into scratch memory, never
                                   allocated), and the stream stays in step */
};
/* Applies the spec's rules: known command, flags documented for it and
 * negotiated, READ and WRITE lengths up to NBD_MAX_REQUEST (not the
 * advertised maximum: nbdkit serves up to that too), range within the
 * export (EINVAL, or ENOSPC for writes and zeroes), EPERM for writes on a
 * read-only export, BLOCK_STATUS only after base:allocation was selected.
 */
extern struct nbd_verdict nbd_check_request (const struct nbd_request *r,
                                             const struct nbd_session *s);

/* The NBD error for an engine error (-errno or errno). */
extern uint32_t nbd_error_of_errno (int err);

/* --- replies (transmission_wire.c) ------------------------------------------- */
/* The 16-byte simple reply (followed by the data for a successful READ);
 * false if the magic is not the simple reply's.
 */
extern size_t nbd_simple_reply (uint8_t *buf, uint64_t cookie, uint32_t error);
extern bool nbd_parse_simple_reply (const uint8_t buf[NBD_SIMPLE_REPLY_LEN],
                                    uint32_t *error, uint64_t *cookie);

/* A structured chunk header (payload follows); false if the magic is not
 * the structured reply's.
 */
extern size_t nbd_chunk_header (uint8_t *buf, uint16_t flags, uint16_t type,
                                uint64_t cookie, uint32_t payload_len);
struct nbd_chunk {
  uint16_t flags;               /* NBD_REPLY_FLAG_DONE */
  uint16_t type;                /* NBD_REPLY_TYPE_* */
  uint64_t cookie;
  uint32_t length;              /* of the payload that follows */
};
extern bool nbd_parse_chunk_header (const uint8_t buf[NBD_CHUNK_HEADER_LEN],
                                    struct nbd_chunk *c);

/* OFFSET_DATA chunk header and offset: the data follows (one chunk for a
 * whole read: pdio never fragments one, so it honours NBD_CMD_FLAG_DF).
 * DONE is set when last: a read streamed in pieces cannot know, when the
 * header goes out, that no error will follow it.  The parser reads the
 * offset from the chunk's payload, and where the data starts.
 */
extern size_t nbd_offset_data_header (uint8_t *buf, uint64_t cookie,
                                      uint64_t offset, uint32_t data_len,
                                      bool last);
extern bool nbd_parse_offset_data (const uint8_t *payload, uint32_t len,
                                   uint64_t *offset, const uint8_t **data,
                                   uint32_t *data_len);
/* NBD_REPLY_TYPE_NONE with DONE (a chunk header alone). */
extern size_t nbd_none_chunk (uint8_t *buf, uint64_t cookie);
/* NBD_REPLY_TYPE_ERROR with DONE and no message (NBD_ERROR_CHUNK_LEN); the
 * parser reads an error chunk's payload, message included.
 */
extern size_t nbd_error_chunk (uint8_t *buf, uint64_t cookie, uint32_t error);
extern bool nbd_parse_error_chunk (const uint8_t *payload, uint32_t len,
                                   uint32_t *error, const uint8_t **msg,
                                   uint16_t *msg_len);

/* The extents of a BLOCK_STATUS reply, built in place in a caller's buffer
 * of room for max extents: add() merges runs of the same status, refuses
 * (returns false) when full or when the total would pass the request.
 */
struct nbd_extents {
  uint8_t *buf;                 /* NBD_BLOCK_STATUS_LEN (max) bytes */
  size_t n, max;
  uint64_t total, limit;        /* bytes described so far; the request's */
  uint32_t last_flags;
};
extern void nbd_extents_init (struct nbd_extents *x, uint8_t *buf,
                              size_t max, uint32_t count);
extern bool nbd_extents_add (struct nbd_extents *x, uint64_t length,
                             uint32_t flags);
/* Writes the chunk header (DONE set) in front; returns the whole length. */
extern size_t nbd_extents_finish (struct nbd_extents *x, uint64_t cookie);
/* A BLOCK_STATUS chunk's payload: false unless it is a context id and one
 * or more whole descriptors; then descriptor i (< n) is read with
 * nbd_parse_extent.
 */
extern bool nbd_parse_block_status (const uint8_t *payload, uint32_t len,
                                    uint32_t *context, size_t *n);
extern void nbd_parse_extent (const uint8_t *payload, size_t i,
                              uint32_t *length, uint32_t *flags);

/* --- kTLS (ktls.c) --------------------------------------------------------- */
/* Apart from the codec, and not pure: it sets a socket's options.  Both
 * ends of NBD over TLS use it, pdio serve and a client handing its socket
 * to the kernel's nbd driver.
 *
 * After a completed GnuTLS handshake on the TCP socket fd, hands the
 * session's keys, IVs and sequence numbers to the kernel (TCP_ULP "tls",
 * then SOL_TLS TLS_TX, and TLS_RX if rx): from then on plain send and
 * recv on fd carry TLS records, and the session must not send or receive
 * any more.  TLS 1.2 and 1.3 with AES-128-GCM, AES-256-GCM or
 * CHACHA20-POLY1305.  The caller must hold no ciphertext read from fd
 * ahead of the switch, and must have sent all GnuTLS wrote.
 *
 * 0: done, why says what (cipher, version).  -1: refused (no tls kernel
 * module, another cipher, a GnuTLS without gnutls_record_get_state...),
 * why says which, and the socket is as it was: user-space TLS goes on.
 * -2: TLS_RX was refused after TLS_TX was set: the socket carries neither
 * kind of TLS any more and must be closed.  GnuTLS must be loaded (the
 * session's library: libgnutls.so.30).  s is a gnutls_session_t.
 */
struct gnutls_session_int;
extern int pdio_ktls_enable (struct gnutls_session_int *s, int fd, bool rx,
                             char *why, size_t len);

/* --- GnuTLS, loaded when asked for (gnutls.c) ------------------------------ */
/* GnuTLS is not linked: with it and what it pulls in (nettle, gmp,
 * p11-kit...) mapped, an idle pdio serve measured 2.0 MiB PSS instead of
 * 0.56, and every supervisor would pay that too.  Each user calls its
 * functions through a table of its own: PDIO_GNUTLS_TABLE (LIST), where
 * LIST (X) calls X (f) for each function f it needs, declares gt (with a
 * member of f's type for each f, and gnutls_free) and gt_names, their
 * names in the order of gt.addr, which pdio_gnutls_load fills.
 *
 * pdio_gnutls_load opens PDIO_GNUTLS_SONAME (never closed) and sets
 * addr[i] to the address of names[i], for the n of them.  0, or -ENOENT
 * (no GnuTLS) or -ENOSYS (one of names is missing: too old) with why set.
 */
#define PDIO_GNUTLS_SONAME "libgnutls.so.30"
#define PDIO_GNUTLS_MEMBER(f) __typeof__ (f) *f;
#define PDIO_GNUTLS_NAME(f) #f,
#define PDIO_GNUTLS_TABLE(LIST)                                         \
  static const char *const gt_names[] = {                               \
    LIST (PDIO_GNUTLS_NAME)                                             \
    "gnutls_free",                                                      \
  };                                                                    \
  static union {                                                        \
    struct {                                                            \
      LIST (PDIO_GNUTLS_MEMBER)                                         \
      gnutls_free_function *gnutls_free;                                \
    };                                                                  \
    void *addr[sizeof gt_names / sizeof *gt_names];                     \
  } gt;                                                                 \
  _Static_assert (sizeof gt.addr == sizeof gt, "gt: one pointer a name")
extern int pdio_gnutls_load (const char *const *names, void **addr, size_t n,
                             char *why, size_t len);

#endif /* PDIO_PROTOCOL_PROTO_H */
