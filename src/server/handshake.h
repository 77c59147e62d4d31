/* SPDX-License-Identifier: BSD-3-Clause */
/* Fixed newstyle option negotiation as a small state machine, one per
 * connection.  It does no I/O: the connection asks it what to do next
 * (send these bytes, receive exactly that many into here), does it, and
 * reports back.  So the fuzzer can drive it from a byte string, and the
 * event loop from io_uring completions, with the same code.
 *
 * Bounded: one option's data is at most NBD_HS_IN_MAX bytes (longer ones
 * are read in pieces into the same buffer and dropped, up to
 * NBD_HS_DISCARD_MAX, then the client is hung up on), the replies to one
 * option fit NBD_HS_OUT_MAX, and a client gets NBD_HS_MAX_OPTIONS options.
 * Nothing is allocated: the whole state is this struct (about 10 KiB),
 * freed by the connection when transmission starts.
 */
#ifndef PDIO_SERVER_HANDSHAKE_H
#define PDIO_SERVER_HANDSHAKE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proto.h"
#include "tls.h"

/* A GO with a 4096-byte name (the spec's longest string) and every info
 * request fits; so does a meta-context option with a few queries.
 */
#define NBD_HS_IN_MAX      (4096 + 512)
#define NBD_HS_OUT_MAX     (4096 + 1024)
#define NBD_HS_DISCARD_MAX (1u << 20)
#define NBD_HS_MAX_OPTIONS 256
/* Longer descriptions are cut. */
#define NBD_HS_DESCRIPTION_MAX 256

enum nbd_hs_action {
  NBD_HS_SEND,                  /* send *buf, *len bytes, then nbd_hs_sent */
  NBD_HS_RECV,                  /* receive exactly *len bytes into *buf
                                   (partial receipts reported as they come
                                   with nbd_hs_received) */
  NBD_HS_DONE,                  /* transmission starts: see session */
  NBD_HS_CLOSE,                 /* hang up (ABORT, or a client breaking a
                                   MUST) */
  NBD_HS_STARTTLS,              /* run the TLS handshake, then
                                   nbd_hs_tls_started; everything after it
                                   goes through TLS */
};

struct nbd_handshake {
  const struct nbd_export *export;
  enum pdio_tls_mode tls_mode;
  bool tls_active;              /* STARTTLS done */
  struct nbd_session session;   /* valid once NBD_HS_DONE */
  const char *why;              /* why NBD_HS_CLOSE, for the log */
  const char *refused;          /* set when an option was refused for want
                                   of TLS: logged if the client then leaves
                                   without TLS (cleared by STARTTLS) */

  enum {
    HS_CLIENT_FLAGS, HS_OPT_HEADER, HS_OPT_DATA, HS_OPT_DISCARD,
    HS_FINISHED,
  } state;
  bool no_zeroes, structured, meta_base_allocation;
  bool close_after_send, done_after_send, starttls_after_send;
  unsigned options;             /* options received so far */
  uint32_t option, option_len;  /* the option being read */
  uint32_t discard_left;        /* HS_OPT_DISCARD: bytes still to drop */

  size_t in_need, in_got;
  size_t out_len;
  uint8_t in[NBD_HS_IN_MAX];
  uint8_t out[NBD_HS_OUT_MAX];
};

/* Queues the server's greeting.  With tls PDIO_TLS_REQUIRE, before
 * STARTTLS only STARTTLS and ABORT are answered (every other option gets
 * NBD_REP_ERR_TLS_REQD, EXPORT_NAME a hang-up), so nothing of the export
 * is told to a client that has not done TLS.
 */
extern void nbd_hs_init (struct nbd_handshake *h,
                         const struct nbd_export *export,
                         enum pdio_tls_mode tls);
/* The TLS handshake after NBD_HS_STARTTLS succeeded: options again, and
 * what was negotiated in plain text is forgotten.
 */
extern void nbd_hs_tls_started (struct nbd_handshake *h);
extern enum nbd_hs_action nbd_hs_next (struct nbd_handshake *h, void **buf,
                                       size_t *len);
/* All of the NBD_HS_SEND bytes went out. */
extern void nbd_hs_sent (struct nbd_handshake *h);
/* n (> 0) of the NBD_HS_RECV bytes arrived. */
extern void nbd_hs_received (struct nbd_handshake *h, size_t n);

#endif /* PDIO_SERVER_HANDSHAKE_H */
