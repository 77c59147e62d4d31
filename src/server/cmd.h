/* SPDX-License-Identifier: BSD-3-Clause */
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
struct nbd_cmd;

/* A READ or WRITE longer than NBD_STREAM_OVER is streamed: its data goes
 * through NBD_STREAM_SLOTS buffers of NBD_STREAM_PIECE in turn, some on
 * the disk while the others are on the socket, so what it holds does not
 * grow with its length.  Up to NBD_STREAM_OVER, a request takes one buffer
 * of its length.  Either way a command takes at most one pool chunk
 * (2 MiB), so that the one chunk a worker keeps in reserve finishes any
 * request without allocating (pdio_thread_config.reserve_chunks), and
 * each buffer is one registered fixed buffer, zero-copy.  A piece is
 * within the engine's bounce cap, so an unaligned piece is one chunk of
 * the engine's; at 1 MiB a system call per piece is still small next to
 * its copy.  Two slots: with four (then of 2 MiB), a mixed load's 8 MiB
 * blocks spread over the pool, and a server running 64 MiB requests
 * peaked at 54 MiB RSS against 23-32 MiB with two.
 */
#define NBD_STREAM_OVER ((size_t) 2 << 20)
#define NBD_STREAM_PIECE ((size_t) 1 << 20)
#define NBD_STREAM_SLOTS 2
/* The most pool memory one command takes, whatever its length. */
#define NBD_CMD_BUF_MAX NBD_STREAM_OVER
_Static_assert (NBD_STREAM_SLOTS * NBD_STREAM_PIECE <= NBD_CMD_BUF_MAX,
                "a streamed command's slots exceed NBD_CMD_BUF_MAX");

/* One piece's buffer: piece k of a request is in slot k % NBD_STREAM_SLOTS. */
enum slot_state {
  SLOT_FREE,
  SLOT_FILLING,                 /* WRITE: its bytes are being received */
  SLOT_FULL,                    /* WRITE: received, waits for the lock */
  SLOT_IO,                      /* its engine request is in flight */
  SLOT_READY,                   /* READ: read (or zeroed), waits to be sent */
};

struct stream_slot {
  struct pdio_req er;
  struct nbd_cmd *cmd;
  uint8_t *buf;                 /* NBD_STREAM_PIECE of cmd's buf */
  enum slot_state state;
  uint32_t pos, len;            /* the piece: [pos, pos+len) of the request */
  uint32_t got;                 /* WRITE: bytes received */
};

/* A streamed command's state (cmd.c), beside its nbd_cmd. */
struct nbd_stream {
  struct pdio_req lock;         /* WRITE: the whole range, its whole life */
  bool lock_pending, locked;
  bool rx_done;                 /* WRITE: no more payload will come */
  bool started;                 /* READ: the reply is queued to be sent */
  bool last;                    /* READ: the piece set is the reply's last */
  bool finished;                /* nbd_stream_finish was called */
  unsigned io;                  /* engine requests in flight */
  uint32_t next;                /* where the next piece starts */
  uint32_t sent;                /* READ: data bytes sent */
  int err;                      /* the first error (-errno) */
  struct stream_slot slot[NBD_STREAM_SLOTS];
  struct nbd_stream *next_free; /* the connection's free list (conn.c) */
};

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
  uint64_t size;                /* the image size it was judged against:
                                   every engine request it makes is
                                   checked against it (PDIO_SIZED) */
  /* The reply on the wire: hdr, then payload. */
  uint8_t hdr[NBD_OFFSET_DATA_HEADER_LEN];
  uint8_t hdr_len;
  const void *payload;
  size_t payload_len;
  struct nbd_extents extents;   /* BLOCK_STATUS: built in buf */
  struct nbd_stream *stream;    /* a streamed READ or WRITE, or NULL */
  /* The device's counters (devstats.c): when its header came in, and
   * whether it is counted in flight (NBD_CMD_STATS_*).
   */
  uint64_t received_ns;
  uint8_t stats;
};
#define NBD_CMD_STATS_NONE 0
#define NBD_CMD_STATS_STARTED 1
#define NBD_CMD_STATS_DONE 2

/* The pool memory a command needs for a request that passed
 * nbd_check_request (0: none).
 */
extern size_t nbd_cmd_buf_len (const struct nbd_request *r);
/* Whether a checked request is streamed (it then needs cmd->stream). */
extern bool nbd_cmd_streamed (const struct nbd_request *r);
/* Starts a checked command, its buf (of nbd_cmd_buf_len) got.  It ends,
 * now or from a later completion, in conn_cmd_done (cmd); a streamed READ
 * instead queues its reply piece by piece (conn_stream_ready) and ends
 * when its last piece is sent (nbd_stream_sent).
 */
extern void nbd_cmd_start (struct nbd_cmd *cmd);
/* Sets cmd's reply from its error or result. */
extern void nbd_cmd_reply (struct nbd_cmd *cmd, bool structured);

/* Streamed WRITEs: where the next payload bytes go (NULL: every slot is
 * on the disk, wait for conn_stream_progress), and that n bytes arrived
 * there.  A full piece is written under the lock; once an error is known,
 * the rest of the payload is still received, and dropped.
 */
extern uint8_t *nbd_stream_rx_buf (struct nbd_cmd *cmd, size_t *len);
extern void nbd_stream_received (struct nbd_cmd *cmd, size_t n);
/* No more payload comes (all of it arrived, or the connection is gone and
 * no receive is pending): the WRITE ends once its pieces are on disk.
 */
extern void nbd_stream_rx_end (struct nbd_cmd *cmd);

/* Streamed READs: sets cmd's reply to the next piece that can be sent
 * (false: none yet, wait for conn_stream_ready), and tells cmd that the
 * piece set last was sent: true if that was the whole reply.
 */
extern bool nbd_stream_piece (struct nbd_cmd *cmd, bool structured);
extern bool nbd_stream_sent (struct nbd_cmd *cmd);
/* Whether a simple reply's data can no longer be sent as promised: a read
 * failed after the reply's header went out (the connection must hang up).
 */
extern bool nbd_stream_broken (const struct nbd_cmd *cmd, bool structured);

/* The connection is done with a streamed cmd: its reply is sent, or will
 * never be (the connection is gone; a WRITE's payload stopped coming).
 * True: nothing of it is in flight (a WRITE's range is released), the
 * caller frees it now; false: cmd.c calls conn_stream_end once its engine
 * requests are done.
 */
extern bool nbd_stream_finish (struct nbd_cmd *cmd);

/* conn.c: cmd is done, cmd->error says how. */
extern void conn_cmd_done (struct nbd_cmd *cmd);
/* conn.c: a streamed WRITE's piece is on disk (receive more); a streamed
 * READ's piece is ready to send; a finished stream's last engine request
 * is done (free it).
 */
extern void conn_stream_progress (struct nbd_cmd *cmd);
extern void conn_stream_ready (struct nbd_cmd *cmd);
extern void conn_stream_end (struct nbd_cmd *cmd);

#endif /* PDIO_SERVER_CMD_H */
