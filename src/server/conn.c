/* SPDX-License-Identifier: BSD-3-Clause */
/* One client connection, driven by completions on its worker's ring:
 * everything runs on the worker's thread and nothing waits.  Its life is
 * one phase (enum conn_phase):
 *
 *   CONN_HANDSHAKE     the negotiation (handshake.c) says what to receive
 *                      and send next; it ends in TRANSMISSION, or DEAD.
 *   CONN_TRANSMISSION  requests are read and answered.  NBD_CMD_DISC or a
 *                      server stop leads to DRAINING; a hang-up or a
 *                      failure (bad magic, a receive or send that fails,
 *                      the watchdog) to DEAD.
 *   CONN_DRAINING      the soft end: no request is read any more; once
 *                      every request read has its reply sent, DEAD.
 *   CONN_HANDING_OVER  the server hands its connections to a successor
 *                      (handover.h): no request is read or started any
 *                      more; the pending receive is cancelled, and what
 *                      it brought is kept -- except that a streamed
 *                      WRITE, started at its header, still receives the
 *                      rest of its payload: its range is locked and
 *                      pieces of it may be on the disk, so only this
 *                      server can finish it.  Once every request started
 *                      has its reply sent, the socket and the bytes of
 *                      the first request not started (part of a header,
 *                      or a whole one, and a WRITE's payload so far) go
 *                      to the worker's hand-over list and the connection
 *                      is freed without a close: the client sees nothing.
 *                      A connection taken over starts in TRANSMISSION
 *                      with those bytes (conn_adopt), which take the path
 *                      of bytes received.
 *   CONN_DEAD          the hard end: the socket is shut down, the receive
 *                      cancelled, the replies not being sent dropped; the
 *                      connection is freed once nothing of it is in
 *                      flight (maybe_end says when a phase is over).
 *
 * In flight, whatever the phase: at most one receive and one send on the
 * ring (a stream socket's bytes must stay in order), the receive's
 * cancel, and the commands started (cmd.c; engine requests cannot be
 * cancelled: their completions find the connection dead and just free
 * their memory).  Within transmission, rx says what the next receive is
 * for; tx says where the replies are: none, queued until the end of this
 * round of completions, or being sent.
 *
 * A request's life: its 28-byte header is received into the connection;
 * it is checked (nbd_check_request); a READ or WRITE gets pool memory of
 * its length (pdio_buf_get: page-aligned, so the engine does direct I/O
 * on it), a WRITE's payload is received straight into that memory; the
 * command is started (cmd.c) and its end queues the reply; once the round
 * of completions is dispatched, a READ's reply goes out as its header and
 * data in one sendmsg, batched with every other queued reply.  The memory
 * goes back to the pool when the engine is done (WRITE) or the reply is
 * sent (READ).  Replies go out in completion order, not request order.
 *
 * A READ or WRITE longer than NBD_STREAM_OVER is streamed (cmd.c): its
 * memory is a few pieces' buffers, whatever its length.  A WRITE's
 * payload is received piece by piece into whichever buffer is free (none:
 * no receive until a piece is on disk); a READ's reply is queued once,
 * and then sent piece by piece as they are read: nothing is sent after it
 * until its last piece is out, since its bytes must stay together.  A
 * READ that fails after a simple reply's header went out hangs up: the
 * spec leaves no other honest answer.
 *
 * Backpressure: when the pool says no, or the connection holds
 * CONN_MAX_REQUESTS requests or CONN_MAX_POOL_BYTES of memory, it stops
 * receiving (RX_STALLED, on its worker's stalled list) and the worker
 * retries it after its next round of completions.  So it does when a
 * request's state cannot be had: a connection starts with one command
 * and one stream's state (the largest request needs no more), and keeps
 * every one it used on free lists until it closes, so that requests
 * after the first few allocate nothing, however long it was idle; one
 * that would allocate and cannot waits, as for pool memory, rather than
 * hang up.
 *
 * The worker's lists of connections (struct conn_lists) are this file's:
 * the worker only calls conn_list_*.
 */
#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>
#include <linux/tls.h>

#include "cmd.h"
#include "container_of.h"
#include "handover.h"
#include "handshake.h"
#include "internal.h"
#include "tls.h"
#include "vg.h"

/* Iovecs per sendmsg: up to 32 replies of header + data in one call. */
#define CONN_IOV 64
/* A small WRITE's payload is received together with whatever of the next
 * request's header has arrived behind it, in one receive without
 * MSG_WAITALL: a client that pipelines sends both at once, so one
 * completion (one trip through the ring) serves two steps.  Larger
 * payloads keep MSG_WAITALL, where a partial receive would cost more
 * completions than it saves.
 */
#define RX_COMBINED_MAX (16 * 1024)
/* A receive that left bytes in the socket (its CQE said
 * IORING_CQE_F_SOCK_NONEMPTY, or a receive made at once filled all it
 * asked for) is followed at once by a recvmsg with MSG_DONTWAIT rather
 * than a trip through the ring: the requests a pipelining client has
 * queued are then all taken in one round, and their I/O goes to the
 * kernel in one io_uring_enter (one plug, one doorbell for the disk)
 * instead of one round and one enter each.  At most this many in a row,
 * so that one busy connection does not hold its worker's other
 * connections and completions for long.
 */
#define RX_INLINE_MAX 16

/* The life stage: see the top of this file. */
enum conn_phase {
  CONN_HANDSHAKE,
  CONN_TRANSMISSION,
  CONN_DRAINING,
  CONN_HANDING_OVER,
  CONN_DEAD,
};

/* What the next receive of the transmission phase is for. */
enum rx_step {
  RX_HEADER,                    /* a request header */
  RX_PAYLOAD,                   /* a WRITE's data, into rx_cmd */
  RX_DISCARD,                   /* a refused WRITE's data, dropped */
  RX_STALLED,                   /* none yet: the header in pending waits
                                   for memory or a slot, on the worker's
                                   stalled list */
};

/* Where the replies are. */
enum tx_state {
  TX_IDLE,                      /* none queued */
  TX_QUEUED,                    /* queued, on the worker's to_send list
                                   until this round of completions ends */
  TX_SENDING,                   /* a send is on the ring */
};

struct conn {
  struct worker *w;
  int fd;
  enum conn_phase phase;
  LIST_ENTRY (conn) link;       /* w->conns.all */
  TAILQ_ENTRY (conn) stall_link; /* w->conns.stalled, while RX_STALLED */
  TAILQ_ENTRY (conn) send_link; /* w->conns.to_send, while TX_QUEUED */

  struct nbd_handshake *hs;     /* CONN_HANDSHAKE only */
  struct tls_conn *tls;         /* after STARTTLS: every byte goes through
                                   it (tls.c) */
  bool ktls;                    /* or, after the handshake, the kernel
                                   holds the session (tls_conn_to_kernel) */
  size_t hs_sent;
  struct nbd_export export;     /* what the handshake offers */
  struct nbd_session s;

  time_t started, rx_progress, tx_progress;

  /* Receiving. */
  bool rx_pending;              /* a receive is on the ring */
  bool cancel_pending;          /* and a cancel of it */
  struct pdio_completion rx_c, cancel_c;
  enum rx_step rx;              /* CONN_TRANSMISSION */
  uint8_t hdr[NBD_REQUEST_LEN];
  size_t hdr_got;
  struct nbd_request pending;   /* the parsed header being started */
  uint64_t pending_round;       /* the engine round it came in (the file
                                   check's answer from then on will do) */
  uint64_t pending_ns;          /* and when (devstats_clock) */
  struct nbd_cmd *rx_cmd;       /* RX_PAYLOAD, RX_DISCARD (its reply) */
  size_t payload_got;
  uint32_t discard_left;        /* RX_DISCARD */
  /* Taken over mid-WRITE: the payload bytes the old server received,
   * used when the header in hdr is started; taken_payload is NULL if they
   * were a refused WRITE's, read and dropped.  A streamed WRITE takes
   * them piece by piece, as if received, as its buffers come free: until
   * then taken_left of them, from taken_payload + payload_got, wait.
   */
  uint8_t *taken_payload;
  uint32_t taken_got;
  uint32_t taken_left;
  struct msghdr rx_msg;         /* a payload and the next header */
  struct iovec rx_iov[2];       /* where the pending receive goes */
  int rx_iovcnt;
  bool rx_more;                 /* the last receive left bytes behind */
  unsigned rx_inline;           /* receives made at once, in a row */

  /* Sending. */
  enum tx_state tx;
  STAILQ_HEAD (, nbd_cmd) replies; /* in the order they go out */
  size_t tx_off;                /* bytes of the first reply already sent */
  struct pdio_completion tx_c;
  struct msghdr msg;
  struct iovec iov[CONN_IOV];

  /* Commands and memory. */
  STAILQ_HEAD (, nbd_cmd) free_cmds;
  struct nbd_stream *free_streams;
  unsigned n_cmds;              /* between header and freeing */
  unsigned n_running;           /* started, not yet done */
  size_t pool_held;             /* pdio_buf_cost of their memory */
};

static void hs_step (struct conn *c);
static void rx_next (struct conn *c);
static void received (struct conn *c, int res);
static void tx_kick (struct conn *c);
static void start_request (struct conn *c);
static void conn_abort (struct conn *c, const char *why);

static struct pdio_thread *
thr (const struct conn *c)
{
  return c->w->t;
}

/* An SQE, or NULL with the connection hung up (the ring cannot submit:
 * nothing else would work either).
 */
static struct io_uring_sqe *
get_sqe (struct conn *c)
{
  struct io_uring_sqe *sqe = pdio_thread_sqe (thr (c));

  if (sqe == NULL)
    worker_log (c->w, PDIO_LOG_ERROR, "io_uring submission failed");
  return sqe;
}

static bool
submit_recv (struct conn *c, void *buf, size_t len)
{
  struct io_uring_sqe *sqe = c->tls ? NULL : get_sqe (c);

  if (sqe == NULL && c->tls == NULL)
    return false;
  /* For valgrind, which cannot see into the ring (vg.h): the kernel
   * writes buf now, and on_recv marks what it wrote.
   */
  c->rx_iov[0] = (struct iovec) { .iov_base = buf, .iov_len = len };
  c->rx_iovcnt = 1;
  vg_kernel_owns_iov (c->rx_iov, 1);
  if (c->tls) {
    c->rx_pending = tls_conn_recv (c->tls, c->rx_iov, 1, true, &c->rx_c);
    return c->rx_pending;
  }
  /* MSG_WAITALL: one completion for a whole header or payload. */
  io_uring_prep_recv (sqe, c->fd, buf, len, MSG_WAITALL);
  io_uring_sqe_set_data (sqe, &c->rx_c);
  c->rx_pending = true;
  return true;
}

/* The rest of rx_cmd's payload, then into hdr (empty: hdr_got is 0 while
 * a payload is received) what of the next header is there already.
 */
static bool
submit_recv_payload_and_header (struct conn *c)
{
  struct io_uring_sqe *sqe = c->tls ? NULL : get_sqe (c);

  if (sqe == NULL && c->tls == NULL)
    return false;
  c->rx_iov[0] = (struct iovec) {
    .iov_base = (uint8_t *) c->rx_cmd->buf + c->payload_got,
    .iov_len = c->rx_cmd->nbd.count - c->payload_got,
  };
  c->rx_iov[1] = (struct iovec) { .iov_base = c->hdr,
                                  .iov_len = NBD_REQUEST_LEN };
  c->rx_iovcnt = 2;
  c->rx_msg = (struct msghdr) { .msg_iov = c->rx_iov, .msg_iovlen = 2 };
  vg_kernel_owns_iov (c->rx_iov, 2);
  if (c->tls) {
    c->rx_pending = tls_conn_recv (c->tls, c->rx_iov, 2, false, &c->rx_c);
    return c->rx_pending;
  }
  io_uring_prep_recvmsg (sqe, c->fd, &c->rx_msg, 0);
  io_uring_sqe_set_data (sqe, &c->rx_c);
  c->rx_pending = true;
  return true;
}

static bool
submit_send (struct conn *c, size_t iovcnt)
{
  struct io_uring_sqe *sqe;

  /* What valgrind checks for sendmsg(2), which it cannot see here. */
  vg_check_iov (c->iov, iovcnt);
  if (c->tls) {
    if (!tls_conn_send (c->tls, c->iov, iovcnt, &c->tx_c))
      return false;
    c->tx = TX_SENDING;
    return true;
  }
  if ((sqe = get_sqe (c)) == NULL)
    return false;
  c->msg = (struct msghdr) { .msg_iov = c->iov, .msg_iovlen = iovcnt };
  io_uring_prep_sendmsg (sqe, c->fd, &c->msg, MSG_NOSIGNAL);
  io_uring_sqe_set_data (sqe, &c->tx_c);
  c->tx = TX_SENDING;
  return true;
}

/* --- commands ----------------------------------------------------------------- */
/* NULL if there is no memory for it now. */
static struct nbd_cmd *
nbd_cmd_new (struct conn *c)
{
  struct nbd_cmd *cmd = STAILQ_FIRST (&c->free_cmds);

  if (cmd)
    STAILQ_REMOVE_HEAD (&c->free_cmds, link);
  else if ((cmd = malloc (sizeof *cmd)) == NULL)
    return NULL;
  memset (cmd, 0, sizeof *cmd);
  cmd->w = c->w;
  cmd->c = c;
  c->n_cmds++;
  return cmd;
}

/* A streamed command's state, zeroed; NULL if there is no memory now. */
static struct nbd_stream *
stream_new (struct conn *c)
{
  struct nbd_stream *st = c->free_streams;

  if (st == NULL)
    return calloc (1, sizeof *st);
  c->free_streams = st->next_free;
  memset (st, 0, sizeof *st);
  return st;
}

static void
stream_free (struct conn *c, struct nbd_cmd *cmd)
{
  if (cmd->stream) {
    cmd->stream->next_free = c->free_streams;
    c->free_streams = cmd->stream;
    cmd->stream = NULL;
  }
}

static void
release_buf (struct conn *c, struct nbd_cmd *cmd)
{
  if (cmd->buf) {
    pdio_buf_put (thr (c), cmd->buf, cmd->buf_len);
    c->pool_held -= pdio_buf_cost (cmd->buf_len);
    cmd->buf = NULL;
    cmd->payload = NULL;
  }
}

static void
nbd_cmd_free (struct conn *c, struct nbd_cmd *cmd)
{
  devstats_gone (c->w, cmd, true);
  release_buf (c, cmd);
  stream_free (c, cmd);
  c->n_cmds--;
  STAILQ_INSERT_HEAD (&c->free_cmds, cmd, link);
}

/* The connection is done with a streamed command (see nbd_stream_finish):
 * freed now, or by conn_stream_end once its engine requests are done.
 */
static void
stream_let_go (struct conn *c, struct nbd_cmd *cmd)
{
  if (nbd_stream_finish (cmd)) {
    c->n_running--;
    nbd_cmd_free (c, cmd);
  }
}

/* A streamed WRITE is started and its payload still coming. */
static bool
receiving_stream (const struct conn *c)
{
  return c->rx == RX_PAYLOAD && c->rx_cmd && c->rx_cmd->stream;
}

/* --- the end ------------------------------------------------------------------- */
/* What of c the ring or the engine still holds: c outlives all of it. */
static bool
in_flight (const struct conn *c)
{
  return c->rx_pending || c->cancel_pending || c->tx == TX_SENDING ||
         c->n_running || (c->tls && tls_conn_busy (c->tls));
}

/* Drops the replies not being sent right now. */
static void
drop_queue (struct conn *c)
{
  struct nbd_cmd *cmd;

  if (c->tx == TX_SENDING)
    return;
  while ((cmd = STAILQ_FIRST (&c->replies)) != NULL) {
    STAILQ_REMOVE_HEAD (&c->replies, link);
    if (cmd->stream)
      stream_let_go (c, cmd);
    else
      nbd_cmd_free (c, cmd);
  }
  c->tx_off = 0;
}

/* The command whose payload was being received, once no receive into it
 * is pending: its payload will not all come.
 */
static void
drop_rx_cmd (struct conn *c)
{
  struct nbd_cmd *cmd = c->rx_cmd;

  if (cmd == NULL || c->rx_pending)
    return;
  c->rx_cmd = NULL;
  if (cmd->stream)
    stream_let_go (c, cmd);
  else
    nbd_cmd_free (c, cmd);
}

/* Frees c; its socket is closed unless it was handed over. */
static void
conn_free (struct conn *c, bool close_socket)
{
  struct worker *w = c->w;
  struct nbd_cmd *cmd;
  struct nbd_stream *stream;

  drop_queue (c);
  if (c->rx_cmd)
    nbd_cmd_free (c, c->rx_cmd);
  while ((cmd = STAILQ_FIRST (&c->free_cmds)) != NULL) {
    STAILQ_REMOVE_HEAD (&c->free_cmds, link);
    free (cmd);
  }
  while ((stream = c->free_streams) != NULL) {
    c->free_streams = stream->next_free;
    free (stream);
  }
  if (w->ctx->log.debug) {
    /* As the plugin does at each close: the tests read these. */
    struct pdio_stats st;
    char buf[512];

    pdio_get_stats (w->ctx->img, &st);
    pdio_format_stats (&st, buf, sizeof buf);
    worker_log (w, PDIO_LOG_DEBUG, "connection %d: stats: %s", c->fd, buf);
  }
  if (close_socket)
    close (c->fd);
  server_conn_closed (w->ctx);
  LIST_REMOVE (c, link);
  w->conns.n--;
  free (c->hs);
  free (c->taken_payload);
  tls_conn_free (c->tls);
  free (c);
}

/* CONN_HANDING_OVER is over: the socket and the bytes of the first
 * request not started go to the worker's hand-over list.
 */
static void
handed (struct conn *c)
{
  struct handover_conn h = {
    .fd = c->fd, .s = c->s, .hdr_got = c->hdr_got,
  };

  switch (c->rx) {
  case RX_HEADER:
    memcpy (h.hdr, c->hdr, NBD_REQUEST_LEN);
    break;
  case RX_PAYLOAD:
  case RX_DISCARD:
    /* Not a streamed WRITE: that one runs (in_flight) until its payload
     * is all in.  hdr is where the next header goes: the WRITE's header
     * is rebuilt from what was parsed, as the client sent it.
     */
    nbd_request_bytes (h.hdr, &c->rx_cmd->nbd);
    h.hdr_got = NBD_REQUEST_LEN;
    if (c->rx == RX_DISCARD)
      h.payload_got = c->rx_cmd->nbd.count - c->discard_left;
    else if ((h.payload_got = c->payload_got) > 0) {
      h.payload = malloc (h.payload_got);
      if (h.payload == NULL) {
        conn_abort (c, "out of memory for the hand-over");
        return;
      }
      memcpy (h.payload, c->rx_cmd->buf, h.payload_got);
    }
    /* The successor counts it. */
    devstats_gone (c->w, c->rx_cmd, false);
    nbd_cmd_free (c, c->rx_cmd);
    c->rx_cmd = NULL;
    break;
  case RX_STALLED:
    /* hand_over made it RX_HEADER. */
    abort ();
  }
  worker_log (c->w, PDIO_LOG_DEBUG, "connection %d: handed over with %u header "
              "and %u payload bytes of a request not started", c->fd,
              h.hdr_got, h.payload_got);
  if (!worker_handed (c->w, &h)) {
    free (h.payload);
    conn_abort (c, "out of memory for the hand-over");
    return;
  }
  c->phase = CONN_DEAD;
  conn_free (c, false);
}

/* Called whenever something of c completed or its phase changed: a
 * draining connection closes once every reply is sent, a dead one is
 * freed once nothing of it is in flight.  The caller must not touch c
 * afterwards.
 */
static void
maybe_end (struct conn *c)
{
  switch (c->phase) {
  case CONN_DRAINING:
    if (!in_flight (c) && STAILQ_EMPTY (&c->replies))
      conn_abort (c, "all replies sent");
    return;
  case CONN_HANDING_OVER:
    if (!in_flight (c) && STAILQ_EMPTY (&c->replies))
      handed (c);
    return;
  case CONN_DEAD:
    /* What waited for a send that has now completed. */
    drop_queue (c);
    drop_rx_cmd (c);
    if (!in_flight (c))
      conn_free (c, true);
    return;
  case CONN_HANDSHAKE:
  case CONN_TRANSMISSION:
    return;
  }
}

static void
on_cancel (struct pdio_completion *pc, int res, uint32_t flags)
{
  struct conn *c = container_of (pc, struct conn, cancel_c);

  (void) res;                   /* 0, -ENOENT, -EALREADY: all fine */
  (void) flags;
  c->cancel_pending = false;
  maybe_end (c);
}

static void
cancel_recv (struct conn *c)
{
  struct io_uring_sqe *sqe;

  if (!c->rx_pending || c->cancel_pending || (sqe = get_sqe (c)) == NULL)
    return;
  /* With TLS, what is on the ring is the session's receive, if anything
   * (the shutdown in conn_abort ends it anyway).
   */
  io_uring_prep_cancel (sqe, c->tls ? tls_conn_recv_token (c->tls) : &c->rx_c,
                        0);
  io_uring_sqe_set_data (sqe, &c->cancel_c);
  c->cancel_pending = true;
}

/* Leaves RX_STALLED, and so the worker's stalled list. */
static void
unstall (struct conn *c)
{
  if (c->rx == RX_STALLED) {
    TAILQ_REMOVE (&c->w->conns.stalled, c, stall_link);
    c->rx = RX_HEADER;
  }
}

/* Hangs up: CONN_DEAD.  The caller must not touch c afterwards. */
static void
conn_abort (struct conn *c, const char *why)
{
  if (c->phase == CONN_DEAD)
    return;
  /* The refusal itself is a reply, not an end: only a client that goes
   * away without TLS was turned away, and the operator should hear of it
   * once (a client that retries with STARTTLS is fine). */
  if (c->phase == CONN_HANDSHAKE && c->hs && c->hs->refused)
    worker_log (c->w, PDIO_LOG_WARNING, "connection %d: refused: %s",
                c->fd, c->hs->refused);
  worker_log (c->w, PDIO_LOG_DEBUG, "connection %d: closing: %s", c->fd, why);
  unstall (c);
  if (c->tx == TX_QUEUED) {
    TAILQ_REMOVE (&c->w->conns.to_send, c, send_link);
    c->tx = TX_IDLE;
  }
  c->phase = CONN_DEAD;
  /* Wakes a pending receive or send at once, on unix and TCP sockets. */
  shutdown (c->fd, SHUT_RDWR);
  cancel_recv (c);
  maybe_end (c);
}

/* The soft end (NBD_CMD_DISC, a server stop): CONN_DRAINING.  The caller
 * must not touch c afterwards.
 */
static void
drain (struct conn *c)
{
  unstall (c);
  c->phase = CONN_DRAINING;
  /* What it brings is not served (on_recv). */
  cancel_recv (c);
  drop_rx_cmd (c);
  maybe_end (c);
}

/* The server hands its connections over: CONN_HANDING_OVER.  The caller
 * must not touch c afterwards.
 */
static void
hand_over (struct conn *c)
{
  if (c->rx == RX_STALLED) {
    /* Parsed, not started: handed over as the client sent it. */
    unstall (c);
    nbd_request_bytes (c->hdr, &c->pending);
    c->hdr_got = NBD_REQUEST_LEN;
  }
  c->phase = CONN_HANDING_OVER;
  /* A streamed WRITE's payload keeps coming (rx_next): this server
   * finishes it.  Otherwise what the receive brings is kept (on_recv); a
   * receive cancelled part way through reports the bytes it did receive.
   */
  if (!receiving_stream (c))
    cancel_recv (c);
  maybe_end (c);
}

/* --- sending ------------------------------------------------------------------ */
static void
queue_reply (struct conn *c, struct nbd_cmd *cmd)
{
  STAILQ_INSERT_TAIL (&c->replies, cmd, link);
  /* Sent when this round of completions is dispatched (conn_list_send_all),
   * so the replies of requests that finish together share one sendmsg.
   */
  if (c->tx == TX_IDLE) {
    c->tx = TX_QUEUED;
    TAILQ_INSERT_TAIL (&c->w->conns.to_send, c, send_link);
  }
}

static void
reply (struct conn *c, struct nbd_cmd *cmd)
{
  /* An error reply carries no data: the memory can go now. */
  if (cmd->error)
    release_buf (c, cmd);
  nbd_cmd_reply (cmd, c->s.structured);
  queue_reply (c, cmd);
}

/* Sends what of the queued replies fits one sendmsg.  The caller must not
 * touch c afterwards (a failure hangs up).
 */
static void
tx_kick (struct conn *c)
{
  size_t n = 0, skip = c->tx_off;
  struct nbd_cmd *cmd;

  if (c->tx == TX_SENDING || STAILQ_EMPTY (&c->replies))
    return;
  for (cmd = STAILQ_FIRST (&c->replies); cmd && n + 2 <= CONN_IOV;
       cmd = STAILQ_NEXT (cmd, link)) {
    /* A streamed READ's next piece, if it has been read. */
    if (cmd->stream && cmd->hdr_len + cmd->payload_len == 0 &&
        !nbd_stream_piece (cmd, c->s.structured))
      break;
    const struct { const void *p; size_t len; } seg[2] = {
      { cmd->hdr, cmd->hdr_len }, { cmd->payload, cmd->payload_len },
    };

    for (int i = 0; i < 2; i++) {
      if (skip >= seg[i].len) {
        skip -= seg[i].len;
        continue;
      }
      c->iov[n].iov_base = (uint8_t *) seg[i].p + skip;
      c->iov[n].iov_len = seg[i].len - skip;
      skip = 0;
      n++;
    }
    /* Nothing may come between its pieces. */
    if (cmd->stream)
      break;
  }
  if (n == 0)
    return;                     /* conn_stream_ready queues it again */
  c->tx_progress = c->w->now;
  if (!submit_send (c, n))
    conn_abort (c, "cannot queue a send");
}

static void
sent_transmission (struct conn *c, size_t bytes)
{
  struct nbd_cmd *cmd;

  while (bytes && (cmd = STAILQ_FIRST (&c->replies)) != NULL) {
    size_t left = cmd->hdr_len + cmd->payload_len - c->tx_off;

    if (bytes < left) {
      c->tx_off += bytes;
      break;
    }
    bytes -= left;
    c->tx_off = 0;
    if (cmd->stream) {
      if (!nbd_stream_sent (cmd))
        break;                  /* more of it to come, nothing else first */
      devstats_replied (c->w, cmd);
      STAILQ_REMOVE_HEAD (&c->replies, link);
      stream_let_go (c, cmd);
      continue;
    }
    devstats_replied (c->w, cmd);
    STAILQ_REMOVE_HEAD (&c->replies, link);
    nbd_cmd_free (c, cmd);
  }
}

static void
on_send (struct pdio_completion *pc, int res, uint32_t flags)
{
  struct conn *c = container_of (pc, struct conn, tx_c);

  (void) flags;
  c->tx = TX_IDLE;
  if (c->phase == CONN_DEAD) {
    maybe_end (c);
    return;
  }
  if (res <= 0) {
    conn_abort (c, res == 0 ? "send made no progress" : "send failed");
    return;
  }
  c->tx_progress = c->w->now;
  if (c->phase == CONN_HANDSHAKE) {
    c->hs_sent += res;
    hs_step (c);
    return;
  }
  sent_transmission (c, res);
  if (STAILQ_EMPTY (&c->replies))
    maybe_end (c);
  else
    tx_kick (c);
}

/* --- the handshake ----------------------------------------------------------- */
static void
on_tls_handshake (void *opaque, const char *why)
{
  struct conn *c = opaque;

  if (c->phase == CONN_DEAD) {
    maybe_end (c);
    return;
  }
  if (why) {
    worker_log (c->w, PDIO_LOG_WARNING, "connection %d: %s", c->fd, why);
    conn_abort (c, why);
    return;
  }
  worker_log (c->w, PDIO_LOG_DEBUG, "connection %d: TLS on%s%s", c->fd,
              tls_conn_peer (c->tls) ? ", peer " : "",
              tls_conn_peer (c->tls) ? tls_conn_peer (c->tls) : "");
  nbd_hs_tls_started (c->hs);
  hs_step (c);
}

static void
on_tls_settled (void *opaque)
{
  maybe_end (opaque);
}

/* The NBD handshake is over and the client waits for nothing: nothing of
 * TLS is buffered or on its way, so the kernel can take the session from
 * here (tls.c's tls_conn_to_kernel); where it cannot, TLS stays in user
 * space.  false if the connection was aborted.
 */
static bool
tls_to_kernel (struct conn *c)
{
  static atomic_bool told;
  char why[256];
  int r = tls_conn_to_kernel (c->tls, why, sizeof why);

  if (r == 0) {
    worker_log (c->w, PDIO_LOG_DEBUG, "connection %d: TLS in the kernel: %s",
                c->fd, why);
    tls_conn_free (c->tls);
    c->tls = NULL;
    c->ktls = true;
    return true;
  }
  if (r == -2) {
    worker_log (c->w, PDIO_LOG_ERROR, "connection %d: %s", c->fd, why);
    conn_abort (c, why);
    return false;
  }
  /* Once per server: the reason is the same for every connection. */
  if (!atomic_exchange (&told, true))
    worker_log (c->w, PDIO_LOG_WARNING, "TLS stays in user space (GnuTLS), "
                "not in the kernel: %s", why);
  worker_log (c->w, PDIO_LOG_DEBUG, "connection %d: TLS in user space "
              "(GnuTLS): %s", c->fd, why);
  return true;
}

/* With kTLS, a record that is not data (an alert, a TLS 1.3 KeyUpdate or
 * ticket) fails a plain receive with EIO and waits: read it with room for
 * its type, to say what ended the connection.
 */
static const char *
ktls_record (struct conn *c, char *why, size_t len)
{
  unsigned char buf[64], cbuf[CMSG_SPACE (sizeof (unsigned char))];
  struct iovec iov = { .iov_base = buf, .iov_len = sizeof buf };
  struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1,
                      .msg_control = cbuf, .msg_controllen = sizeof cbuf };
  struct cmsghdr *cm;
  unsigned type = 0;
  ssize_t r = recvmsg (c->fd, &m, MSG_DONTWAIT);

  if (r <= 0) {
    snprintf (why, len, "kTLS receive failed: %s",
              r == 0 ? "end of stream" : strerror (errno));
    return why;
  }
  cm = CMSG_FIRSTHDR (&m);
  if (cm && cm->cmsg_level == SOL_TLS && cm->cmsg_type == TLS_GET_RECORD_TYPE)
    type = *CMSG_DATA (cm);
  if (type == 21 && r >= 2 && buf[1] == 0)
    snprintf (why, len, "the client closed TLS (close_notify)");
  else if (type == 21 && r >= 2)
    snprintf (why, len, "TLS alert %u from the client", buf[1]);
  else if (type == 22 && buf[0] == 24) {
    /* Only a new key for the kernel would do, and Linux 6.1's kTLS
     * cannot be given one: a session's keys are set once.
     */
    snprintf (why, len, "the client sent a TLS KeyUpdate, which kTLS "
              "cannot follow on this kernel (its keys are set once)");
    worker_log (c->w, PDIO_LOG_WARNING, "connection %d: %s", c->fd, why);
  }
  else
    snprintf (why, len, "a TLS record of type %u (%u) from the client after "
              "the handshake", type, buf[0]);
  return why;
}

/* STARTTLS was answered: the TLS handshake, on_tls_handshake at its end. */
static void
start_tls (struct conn *c)
{
  const char *why;

  c->tls = tls_conn_new (c->w->ctx->tls, thr (c), c->fd, on_tls_handshake,
                         on_tls_settled, c, &why);
  if (c->tls == NULL) {
    conn_abort (c, why);
    return;
  }
  tls_conn_handshake (c->tls);
}

static void
hs_step (struct conn *c)
{
  void *buf;
  size_t len;

  switch (nbd_hs_next (c->hs, &buf, &len)) {
  case NBD_HS_SEND:
    if (c->hs_sent == len) {
      c->hs_sent = 0;
      nbd_hs_sent (c->hs);
      hs_step (c);
      return;
    }
    c->iov[0] = (struct iovec) { (uint8_t *) buf + c->hs_sent,
                                 len - c->hs_sent };
    if (!submit_send (c, 1))
      conn_abort (c, "cannot queue a send");
    return;
  case NBD_HS_RECV:
    if (!submit_recv (c, buf, len))
      conn_abort (c, "cannot queue a receive");
    return;
  case NBD_HS_CLOSE:
    conn_abort (c, c->hs->why ? c->hs->why : "handshake ended");
    return;
  case NBD_HS_STARTTLS:
    start_tls (c);
    return;
  case NBD_HS_DONE:
    c->s = c->hs->session;
    free (c->hs);
    c->hs = NULL;
    c->phase = CONN_TRANSMISSION;
    c->rx = RX_HEADER;
    worker_log (c->w, PDIO_LOG_DEBUG,
                "connection %d: transmission (flags 0x%x%s%s)",
                c->fd, c->s.eflags, c->s.structured ? ", structured" : "",
                c->s.meta_base_allocation ? ", base:allocation" : "");
    if (c->tls && !tls_to_kernel (c))
      return;
    if (c->w->stopping)
      drain (c);
    else
      rx_next (c);
    return;
  }
}

/* --- receiving --------------------------------------------------------------- */
/* n more bytes of the streamed WRITE's payload are in its buffer. */
static void
stream_received (struct conn *c, size_t n)
{
  struct nbd_cmd *cmd = c->rx_cmd;

  c->payload_got += n;
  nbd_stream_received (cmd, n);
  if (c->payload_got == cmd->nbd.count) {
    c->rx = RX_HEADER;
    c->rx_cmd = NULL;
    nbd_stream_rx_end (cmd);
  }
}

/* The predecessor's bytes of the streamed WRITE's payload, into the
 * buffer a receive would fill.
 */
static void
take_stream_bytes (struct conn *c, uint8_t *buf, size_t len)
{
  size_t n = len < c->taken_left ? len : c->taken_left;

  memcpy (buf, c->taken_payload + c->payload_got, n);
  c->taken_left -= n;
  if (c->taken_left == 0) {
    free (c->taken_payload);
    c->taken_payload = NULL;
  }
  stream_received (c, n);
}

/* The receive into iov made now, when the last one left bytes behind
 * (see RX_INLINE_MAX): true if it was made (received has run), false if
 * it is the ring's to make.  Only plain sockets in transmission: TLS
 * reads records, and the other phases' receives are few.
 */
static bool
recv_inline (struct conn *c, struct iovec *iov, int iovcnt)
{
  struct msghdr msg = { .msg_iov = iov, .msg_iovlen = iovcnt };
  size_t want = 0;
  ssize_t n;
  int i;

  if (!c->rx_more || c->tls || c->phase != CONN_TRANSMISSION ||
      c->rx_inline >= RX_INLINE_MAX)
    return false;
  n = recvmsg (c->fd, &msg, MSG_DONTWAIT);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
    c->rx_more = false;
    return false;
  }
  for (i = 0; i < iovcnt; i++)
    want += iov[i].iov_len;
  /* Filled: more is likely queued behind (a short one emptied it). */
  c->rx_more = n > 0 && (size_t) n == want;
  c->rx_inline++;
  c->rx_iov[0] = iov[0];
  c->rx_iov[1] = iovcnt > 1 ? iov[1] : (struct iovec) { 0 };
  c->rx_iovcnt = iovcnt;
  received (c, n < 0 ? -errno : (int) n);
  return true;
}

/* Queues the receive rx asks for, or makes it at once (recv_inline).  The
 * caller must not touch c afterwards (a failure hangs up).
 */
static void
rx_next (struct conn *c)
{
  bool ok = true;
  struct iovec iov[2];

  if (c->rx_pending)
    return;
  if (c->phase != CONN_TRANSMISSION &&
      !(c->phase == CONN_HANDING_OVER && receiving_stream (c)))
    return;
  switch (c->rx) {
  case RX_HEADER:
    iov[0] = (struct iovec) { c->hdr + c->hdr_got,
                              NBD_REQUEST_LEN - c->hdr_got };
    if (recv_inline (c, iov, 1))
      return;
    ok = submit_recv (c, c->hdr + c->hdr_got, NBD_REQUEST_LEN - c->hdr_got);
    break;
  case RX_PAYLOAD:
    if (c->rx_cmd->stream) {
      size_t len;
      uint8_t *buf = nbd_stream_rx_buf (c->rx_cmd, &len);

      /* None: every piece is on the disk (conn_stream_progress). */
      if (buf == NULL)
        break;
      if (c->taken_left) {
        take_stream_bytes (c, buf, len);
        rx_next (c);
        return;
      }
      ok = submit_recv (c, buf, len);
    }
    else if (c->rx_cmd->nbd.count - c->payload_got <= RX_COMBINED_MAX) {
      iov[0] = (struct iovec) {
        (uint8_t *) c->rx_cmd->buf + c->payload_got,
        c->rx_cmd->nbd.count - c->payload_got,
      };
      iov[1] = (struct iovec) { c->hdr, NBD_REQUEST_LEN };
      if (recv_inline (c, iov, 2))
        return;
      ok = submit_recv_payload_and_header (c);
    }
    else
      ok = submit_recv (c, (uint8_t *) c->rx_cmd->buf + c->payload_got,
                        c->rx_cmd->nbd.count - c->payload_got);
    break;
  case RX_DISCARD:
    ok = submit_recv (c, c->w->discard,
                      c->discard_left < WORKER_DISCARD_BYTES
                      ? c->discard_left : WORKER_DISCARD_BYTES);
    break;
  case RX_STALLED:
    break;
  }
  if (!ok)
    conn_abort (c, "cannot queue a receive");
}

static void
stall (struct conn *c)
{
  c->rx = RX_STALLED;
  TAILQ_INSERT_TAIL (&c->w->conns.stalled, c, stall_link);
}

/* Hands cmd to cmd.c: it comes back in conn_cmd_done. */
static void
start_cmd (struct conn *c, struct nbd_cmd *cmd)
{
  c->n_running++;
  nbd_cmd_start (cmd);
}

void
conn_cmd_done (struct nbd_cmd *cmd)
{
  struct conn *c = cmd->c;

  c->n_running--;
  /* A write's data is on disk (or failed): its memory can go now, and a
   * streamed one's reply is a plain one.
   */
  if (cmd->nbd.type == NBD_CMD_WRITE) {
    release_buf (c, cmd);
    stream_free (c, cmd);
  }
  if (c->phase == CONN_DEAD) {
    nbd_cmd_free (c, cmd);
    maybe_end (c);
    return;
  }
  reply (c, cmd);
}

/* The header taken over (conn_adopt) is being started, and the old server
 * had received taken_got bytes of its payload: they count as received.
 * false if they cannot be used (the connection is then hung up).
 */
static bool
use_taken_payload (struct conn *c, struct nbd_cmd *cmd,
                   const struct nbd_verdict *v)
{
  uint32_t got = c->taken_got;

  c->taken_got = 0;
  if (!v->error && c->taken_payload == NULL) {
    /* The old server refused this WRITE and dropped its data. */
    nbd_cmd_free (c, cmd);
    conn_abort (c, "handed over without the payload of a WRITE this "
                "server would serve");
    return false;
  }
  if (cmd->stream) {
    /* Its buffers hold a few pieces: rx_next takes the bytes as they
     * come free.
     */
    c->taken_left = got;
    return true;
  }
  if (!v->error)
    memcpy (cmd->buf, c->taken_payload, got);
  free (c->taken_payload);
  c->taken_payload = NULL;
  c->payload_got = got;
  return true;
}

void
conn_stream_progress (struct nbd_cmd *cmd)
{
  struct conn *c = cmd->c;

  if ((c->phase == CONN_TRANSMISSION || c->phase == CONN_HANDING_OVER) &&
      c->rx_cmd == cmd && !c->rx_pending)
    rx_next (c);
  else if (c->phase != CONN_TRANSMISSION)
    maybe_end (c);
}

void
conn_stream_ready (struct nbd_cmd *cmd)
{
  struct conn *c = cmd->c;

  if (c->phase == CONN_DEAD) {
    /* Not queued (drop_queue lets go of those): nobody else will. */
    if (!cmd->stream->started) {
      stream_let_go (c, cmd);
      maybe_end (c);
    }
    return;
  }
  if (nbd_stream_broken (cmd, c->s.structured)) {
    conn_abort (c, "a read failed after its simple reply's header was "
                "sent: the client cannot be told, so it is hung up on");
    return;
  }
  if (!cmd->stream->started) {
    if (nbd_stream_piece (cmd, c->s.structured))
      queue_reply (c, cmd);
  }
  else if (c->tx == TX_IDLE) {
    c->tx = TX_QUEUED;
    TAILQ_INSERT_TAIL (&c->w->conns.to_send, c, send_link);
  }
}

void
conn_stream_end (struct nbd_cmd *cmd)
{
  struct conn *c = cmd->c;

  c->n_running--;
  nbd_cmd_free (c, cmd);
  maybe_end (c);
}

/* A request's state could not be allocated: the pending header waits,
 * as for pool memory, and is tried again after the next round of
 * completions (or the worker's tick), when memory may be back.  Hanging
 * up would lose the client's requests in flight; waiting costs nothing.
 */
static void
no_memory (struct conn *c)
{
  worker_log (c->w, PDIO_LOG_DEBUG, "connection %d: no memory for a "
              "request's state: it waits", c->fd);
  stall (c);
}

/* The pending header: refuse it, or get what it needs and start it; or
 * stall until that is available.  The caller must not touch c afterwards.
 */
static void
start_request (struct conn *c)
{
  const struct nbd_request *r = &c->pending;
  struct nbd_verdict v;
  size_t need;
  void *buf = NULL;
  struct nbd_cmd *cmd;

  /* The kernel's connections outlive a resize: a request is judged
   * against the size served now, not the one its handshake offered, and
   * the engine checks all of it against that same size (cmd->size).
   */
  c->s.size = pdio_size (c->w->ctx->img);
  v = nbd_check_request (r, &c->s);
  need = v.error ? 0 : nbd_cmd_buf_len (r);

  if (r->type == NBD_CMD_DISC && v.error == 0) {
    drain (c);
    return;
  }
  if (c->n_cmds >= CONN_MAX_REQUESTS) {
    stall (c);
    return;
  }
  if (need) {
    if (c->pool_held &&
        c->pool_held + pdio_buf_cost (need) > CONN_MAX_POOL_BYTES) {
      stall (c);
      return;
    }
    buf = pdio_buf_get (thr (c), need);
    if (buf == NULL) {
      stall (c);
      return;
    }
  }
  cmd = nbd_cmd_new (c);
  if (cmd == NULL) {
    if (buf)
      pdio_buf_put (thr (c), buf, need);
    no_memory (c);
    return;
  }
  cmd->nbd = *r;
  cmd->arrived = c->pending_round;
  cmd->size = c->s.size;
  cmd->buf = buf;
  cmd->buf_len = need;
  devstats_received (c->w, cmd, c->pending_ns);
  c->pool_held += need ? pdio_buf_cost (need) : 0;
  if (v.error == 0 && nbd_cmd_streamed (r) &&
      (cmd->stream = stream_new (c)) == NULL) {
    nbd_cmd_free (c, cmd);
    no_memory (c);
    return;
  }

  if (c->taken_got && !use_taken_payload (c, cmd, &v))
    return;
  if (v.error) {
    cmd->error = v.error;
    worker_log (c->w, PDIO_LOG_DEBUG, "connection %d: refused command %u "
                "(%u bytes at %" PRIu64 ", flags 0x%x): error %u", c->fd,
                r->type, r->count, r->offset, r->flags, v.error);
    if (v.discard) {
      /* Answered once its payload is all in: clients (libnbd) take a
       * reply to a request they are still sending as a broken server.
       */
      if (c->payload_got == v.discard) {
        reply (c, cmd);
        rx_next (c);
        return;
      }
      c->rx = RX_DISCARD;
      c->rx_cmd = cmd;
      c->discard_left = v.discard - c->payload_got;
      c->rx_progress = c->w->now;
    }
    else
      reply (c, cmd);
  }
  else if (r->type == NBD_CMD_WRITE && !cmd->stream &&
           c->payload_got == r->count)
    start_cmd (c, cmd);         /* all of it came with a hand-over */
  else if (r->type == NBD_CMD_WRITE) {
    c->rx_cmd = cmd;
    c->rx = RX_PAYLOAD;
    c->rx_progress = c->w->now;
    /* Its range is locked now; its pieces are written as they come. */
    if (cmd->stream)
      start_cmd (c, cmd);
  }
  else
    start_cmd (c, cmd);
  rx_next (c);
}

/* A whole header is in hdr: start its request.  The caller must not
 * touch c afterwards.
 */
static void
header_complete (struct conn *c)
{
  c->hdr_got = 0;
  c->payload_got = 0;
  c->pending_round = pdio_thread_round (thr (c));
  c->pending_ns = devstats_clock (c->w);
  if (!nbd_parse_request (c->hdr, &c->pending)) {
    conn_abort (c, "bad request magic");
    return;
  }
  start_request (c);
}

static void
on_recv (struct pdio_completion *pc, int res, uint32_t flags)
{
  struct conn *c = container_of (pc, struct conn, rx_c);

  vg_kernel_wrote_iov (c->rx_iov, c->rx_iovcnt, res);
  c->rx_pending = false;
  c->rx_more = res > 0 && (flags & IORING_CQE_F_SOCK_NONEMPTY);
  c->rx_inline = 0;
  received (c, res);
}

/* res bytes came into rx_iov (or the receive failed: -errno, or 0 for
 * the client's end), from the ring or from recv_inline.  The caller must
 * not touch c afterwards.
 */
static void
received (struct conn *c, int res)
{
  switch (c->phase) {
  case CONN_DEAD:
    maybe_end (c);
    return;
  case CONN_DRAINING:
    /* Whatever arrived is not served. */
    drop_rx_cmd (c);
    maybe_end (c);
    return;
  case CONN_HANDSHAKE:
    if (res <= 0) {
      conn_abort (c, res == 0 ? "client hung up in the handshake"
                              : "receive failed in the handshake");
      return;
    }
    c->rx_progress = c->w->now;
    nbd_hs_received (c->hs, res);
    hs_step (c);
    return;
  case CONN_HANDING_OVER:
    /* The cancel came first: nothing arrived. */
    if (res == -ECANCELED) {
      maybe_end (c);
      return;
    }
    break;
  case CONN_TRANSMISSION:
    break;
  }
  if (res <= 0) {
    char why[256];

    if (c->ktls && res == -EIO) {
      conn_abort (c, ktls_record (c, why, sizeof why));
      return;
    }
    conn_abort (c, res == 0 ? "client hung up" : "receive failed");
    return;
  }
  c->rx_progress = c->w->now;
  switch (c->rx) {
  case RX_HEADER:
    c->hdr_got += res;
    if (c->hdr_got < NBD_REQUEST_LEN || c->phase == CONN_HANDING_OVER)
      break;
    header_complete (c);
    return;
  case RX_PAYLOAD: {
    if (c->rx_cmd->stream) {
      stream_received (c, res);
      break;
    }
    size_t want = c->rx_cmd->nbd.count - c->payload_got;
    size_t got = (size_t) res < want ? (size_t) res : want;

    c->payload_got += got;
    /* Past the payload: the start of the next header (combined receive). */
    c->hdr_got = res - got;
    if (c->payload_got < c->rx_cmd->nbd.count)
      break;
    /* A WRITE read before a hand-over began is served by this server. */
    c->rx = RX_HEADER;
    start_cmd (c, c->rx_cmd);
    c->rx_cmd = NULL;
    if (c->hdr_got == NBD_REQUEST_LEN && c->phase == CONN_TRANSMISSION) {
      header_complete (c);
      return;
    }
    break;
  }
  case RX_DISCARD:
    c->discard_left -= res;
    if (c->discard_left == 0) {
      c->rx = RX_HEADER;
      reply (c, c->rx_cmd);
      c->rx_cmd = NULL;
    }
    break;
  case RX_STALLED:
    break;
  }
  if (c->phase == CONN_HANDING_OVER && !receiving_stream (c))
    maybe_end (c);
  else
    rx_next (c);
}

/* A connection that made no progress for too long. */
static void
watchdog (struct conn *c)
{
  time_t now = c->w->now;
  time_t limit = c->w->stopping ? CONN_STALL_SECS_STOPPING : CONN_STALL_SECS;
  bool replies_wait = !STAILQ_EMPTY (&c->replies) || c->tx == TX_SENDING;
  bool mid_request = c->rx == RX_PAYLOAD || c->rx == RX_DISCARD ||
                     (c->rx == RX_HEADER && c->hdr_got);

  switch (c->phase) {
  case CONN_HANDSHAKE:
    if (now - c->started >= (time_t) c->w->ctx->handshake_secs)
      conn_abort (c, "handshake took too long");
    return;
  case CONN_TRANSMISSION:
  case CONN_DRAINING:
  case CONN_HANDING_OVER:
    if (replies_wait && now - c->tx_progress > limit)
      conn_abort (c, "the client does not read its replies");
    else if ((c->phase == CONN_TRANSMISSION ? mid_request
              : c->phase == CONN_HANDING_OVER && receiving_stream (c)) &&
             now - c->rx_progress > limit)
      conn_abort (c, "the client stopped in the middle of a request");
    return;
  case CONN_DEAD:
    return;
  }
}

/* The server is stopping. */
static void
stop (struct conn *c)
{
  switch (c->phase) {
  case CONN_HANDSHAKE:
    conn_abort (c, "the server is stopping");
    return;
  case CONN_TRANSMISSION:
    drain (c);
    return;
  case CONN_DRAINING:
  case CONN_HANDING_OVER:
  case CONN_DEAD:
    return;
  }
}

/* The server hands its connections to a successor. */
static void
hand_over_or_stop (struct conn *c)
{
  switch (c->phase) {
  case CONN_HANDSHAKE:
    conn_abort (c, "the server hands over to a successor");
    return;
  case CONN_TRANSMISSION:
    /* A TLS session's state (keys, sequence numbers) is this process's:
     * the successor could not continue it.  Its requests are answered
     * and it is closed, as at a stop; its client reconnects.  With kTLS
     * the kernel holds it and the socket alone could go, but the
     * successor would not know it for a kTLS socket: closed the same.
     */
    if (c->tls || c->ktls) {
      worker_log (c->w, PDIO_LOG_DEBUG, "connection %d: TLS, not handed "
                  "over: closed once its replies are sent", c->fd);
      drain (c);
      return;
    }
    hand_over (c);
    return;
  case CONN_DRAINING:
  case CONN_HANDING_OVER:
  case CONN_DEAD:
    return;
  }
}

/* --- what the worker calls ------------------------------------------------------ */
void
conn_list_init (struct worker *w)
{
  LIST_INIT (&w->conns.all);
  TAILQ_INIT (&w->conns.stalled);
  TAILQ_INIT (&w->conns.to_send);
  w->conns.n = 0;
}

static void
conn_init (struct conn *c, struct worker *w, int fd)
{
  c->w = w;
  c->fd = fd;
  c->rx_c.fn = on_recv;
  c->tx_c.fn = on_send;
  c->cancel_c.fn = on_cancel;
  c->rx = RX_HEADER;
  c->tx = TX_IDLE;
  STAILQ_INIT (&c->replies);
  STAILQ_INIT (&c->free_cmds);
  c->started = c->rx_progress = c->tx_progress = w->now;
  LIST_INSERT_HEAD (&w->conns.all, c, link);
  w->conns.n++;
}

/* What the largest request needs, so that requests one at a time never
 * allocate.  false if there is no memory.
 */
static bool
conn_prealloc (struct conn *c)
{
  struct nbd_cmd *cmd = malloc (sizeof *cmd);

  c->free_streams = calloc (1, sizeof *c->free_streams);
  if (cmd)
    STAILQ_INSERT_HEAD (&c->free_cmds, cmd, link);
  return cmd && c->free_streams;
}

void
conn_new (struct worker *w, int fd)
{
  struct conn *c = calloc (1, sizeof *c);

  if (c == NULL || (c->hs = malloc (sizeof *c->hs)) == NULL) {
    worker_log (w, PDIO_LOG_ERROR, "connection refused: out of memory");
    free (c);
    close (fd);
    server_conn_closed (w->ctx);
    return;
  }
  conn_init (c, w, fd);
  if (!conn_prealloc (c)) {
    worker_log (w, PDIO_LOG_ERROR, "connection refused: out of memory");
    c->phase = CONN_DEAD;
    conn_free (c, true);
    return;
  }
  c->phase = CONN_HANDSHAKE;
  /* The size the accept thread read as it took the connection in. */
  c->export = w->ctx->export;
  c->export.size = pdio_size (w->ctx->img);
  nbd_hs_init (c->hs, &c->export, pdio_tls_mode (w->ctx->tls));
  worker_log (w, PDIO_LOG_DEBUG, "connection %d: accepted by worker %u", fd,
              w->id);
  hs_step (c);
}

/* fn may free the connection it is given: the next is taken first
 * (freeing one connection never frees another).
 */
static void
for_each_conn (struct worker *w, void (*fn) (struct conn *c))
{
  struct conn *c, *next;

  for (c = LIST_FIRST (&w->conns.all); c; c = next) {
    next = LIST_NEXT (c, link);
    fn (c);
  }
}

void
conn_adopt (struct worker *w, struct handover_conn *h)
{
  struct conn *c = calloc (1, sizeof *c);

  if (c == NULL) {
    worker_log (w, PDIO_LOG_ERROR, "connection taken over, then lost: out of "
                "memory");
    close (h->fd);
    free (h->payload);
    return;
  }
  /* Counted in as if accepted here (conn_free counts it out). */
  atomic_fetch_add (w->ctx->live, 1);
  conn_init (c, w, h->fd);
  if (!conn_prealloc (c)) {
    worker_log (w, PDIO_LOG_ERROR, "connection taken over, then lost: out of "
                "memory");
    free (h->payload);
    c->phase = CONN_DEAD;
    conn_free (c, true);
    return;
  }
  c->phase = CONN_TRANSMISSION;
  c->s = h->s;
  memcpy (c->hdr, h->hdr, NBD_REQUEST_LEN);
  c->hdr_got = h->hdr_got;
  c->taken_got = h->payload_got;
  c->taken_payload = h->payload;
  worker_log (w, PDIO_LOG_DEBUG, "connection %d: taken over by worker %u with "
              "%zu header and %u payload bytes of a request", c->fd, w->id,
              c->hdr_got, c->taken_got);
  if (c->hdr_got == NBD_REQUEST_LEN)
    header_complete (c);
  else
    rx_next (c);
}

void
conn_list_stop_all (struct worker *w)
{
  for_each_conn (w, stop);
}

void
conn_list_hand_over_all (struct worker *w)
{
  for_each_conn (w, hand_over_or_stop);
}

void
conn_list_watchdog (struct worker *w)
{
  for_each_conn (w, watchdog);
}

void
conn_list_resume_stalled (struct worker *w)
{
  struct conn_queue batch = TAILQ_HEAD_INITIALIZER (batch);
  struct conn *c;

  /* One try each this round: one that stalls again goes back onto
   * w->conns.stalled, for the next.
   */
  TAILQ_CONCAT (&batch, &w->conns.stalled, stall_link);
  while ((c = TAILQ_FIRST (&batch)) != NULL) {
    TAILQ_REMOVE (&batch, c, stall_link);
    c->rx = RX_HEADER;
    start_request (c);
  }
}

void
conn_list_send_all (struct worker *w)
{
  struct conn *c;

  /* tx_kick sends or hangs up: neither queues c again. */
  while ((c = TAILQ_FIRST (&w->conns.to_send)) != NULL) {
    TAILQ_REMOVE (&w->conns.to_send, c, send_link);
    c->tx = TX_IDLE;
    tx_kick (c);
  }
}
