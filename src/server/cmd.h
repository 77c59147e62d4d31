/* An NBD command between its request header and its reply, and what it
 * becomes in the engine (cmd.c).  The connection (conn.c) owns its
 * commands: it gets their memory, receives a WRITE's payload, starts
 * them and sends their replies.  cmd.c turns a checked request into
 * engine work, and a result into the reply's bytes.
 */
#ifndef PDIO_SERVER_CMD_H
#define PDIO_SERVER_CMD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/queue.h>

#include "engine.h"
#include "proto.h"

struct conn;
struct worker;

struct nbd_cmd {
  struct pdio_req er;           /* the engine's request */
  struct worker *w;
  struct conn *c;
  STAILQ_ENTRY (nbd_cmd) link;  /* the reply queue, or the free list */
  struct nbd_request nbd;
  void *buf;                    /* pool memory, or NULL */
  size_t buf_len;
  uint32_t error;               /* the NBD error of the reply */
  uint64_t arrived;             /* the worker's round its header came in
                                   (pdio_req.arrived) */
  /* The reply on the wire: hdr, then payload. */
  uint8_t hdr[NBD_OFFSET_DATA_HEADER_LEN];
  uint8_t hdr_len;
  const void *payload;
  size_t payload_len;
  struct nbd_extents extents;   /* BLOCK_STATUS: built in buf */
};

/* The pool memory a command needs for a request that passed
 * nbd_check_request (0: none).
 */
extern size_t nbd_cmd_buf_len (const struct nbd_request *r);
/* Starts a checked command, its buf (of nbd_cmd_buf_len) got.  It ends,
 * now or from a later completion, in conn_cmd_done (cmd).
 */
extern void nbd_cmd_start (struct nbd_cmd *cmd);
/* Sets cmd's reply from its error or result. */
extern void nbd_cmd_reply (struct nbd_cmd *cmd, bool structured);

/* conn.c: cmd is done, cmd->error says how. */
extern void conn_cmd_done (struct nbd_cmd *cmd);

#endif /* PDIO_SERVER_CMD_H */
