/* One client connection, driven by completions on its worker's ring:
 * everything runs on the worker's thread and nothing waits.  Its life is
 * one phase (enum conn_phase):
 *
 *   CONN_HANDSHAKE     the negotiation (handshake.c) says what to receive
 *                      and send next; it ends in TRANSMISSION, or DEAD.
 *   CONN_TRANSMISSION  requests are read and answered.  NBD_CMD_DISC or a
 *                      server stop leads to DRAINING; a hang-up, a bad
 *                      request header, a failed send or the watchdog to
 *                      DEAD.
 *   CONN_DRAINING      the soft end: no request is read any more; once
 *                      every request read has its reply sent, DEAD.
 *   CONN_DEAD          the hard end: the socket is shut down, the receive
 *                      cancelled, unsent replies dropped; the connection
 *                      is freed once nothing of it is in flight.
 *
 * In flight, whatever the phase: at most one receive and one send on the
 * ring (a stream socket's bytes must stay in order), the receive's
 * cancel, and the requests started (engine requests cannot be cancelled:
 * their completions find the connection dead and just free their memory).
 * In transmission, rx says what the next receive is for, and tx where the
 * replies are: none, queued until the end of this round of completions,
 * or being sent.
 *
 * A request's life: its 28-byte header is received into the connection;
 * it is checked (nbd_check_request); a READ or WRITE gets pool memory of
 * its length (pdio_buf_get: page-aligned, so the engine does direct I/O
 * on it), a WRITE's payload is received straight into that memory and
 * handed to the engine as is; the engine's completion queues the reply,
 * and once the round of completions is dispatched, a READ's reply goes
 * out as its header and data in one sendmsg, batched with every other
 * queued reply.  The memory goes back to the pool when the engine is done
 * (WRITE) or the reply is sent (READ).  Replies go out in completion
 * order, not request order.
 *
 * Backpressure: when the pool says no, or the connection holds
 * CONN_MAX_REQUESTS requests or CONN_MAX_POOL_BYTES of memory, it stops
 * receiving (RX_STALLED, on its worker's stalled list) and the worker
 * retries it after its next round of completions.
 *
 * The worker's lists of connections (struct conn_lists) are this file's:
 * the worker only calls conn_list_*.
 */
#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "handshake.h"
#include "internal.h"
#include "vg.h"

/* Iovecs per sendmsg: up to 32 replies of header + data in one call. */
#define CONN_IOV 64
/* A BLOCK_STATUS reply is built in one pool page: up to 509 extents. */
#define BLOCK_STATUS_BUF 4096
/* A small WRITE's payload is received together with whatever of the next
 * request's header has arrived behind it, in one receive without
 * MSG_WAITALL: a client that pipelines sends both at once, so one
 * completion (one trip through the ring) serves two steps.  Larger
 * payloads keep MSG_WAITALL, where a partial receive would cost more
 * completions than it saves.
 */
#define RX_COMBINED_MAX (16 * 1024)

struct req {
  struct pdio_req er;           /* the engine's request */
  struct conn *c;
  STAILQ_ENTRY (req) link;      /* the reply queue, or the free list */
  struct nbd_request nbd;
  void *buf;                    /* pool memory, or NULL */
  size_t buf_len;
  uint32_t error;               /* the NBD error of the reply */
  uint8_t hdr[NBD_OFFSET_DATA_HEADER_LEN];
  uint8_t hdr_len;
  const void *payload;          /* what follows hdr on the wire */
  size_t payload_len;
};
STAILQ_HEAD (req_queue, req);

enum conn_phase {
  CONN_HANDSHAKE,
  CONN_TRANSMISSION,
  CONN_DRAINING,
  CONN_DEAD,
};

/* What the next receive of the transmission phase is for. */
enum rx_step {
  RX_HEADER,                    /* a request header */
  RX_PAYLOAD,                   /* a WRITE's data, into rx_req */
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
  LIST_ENTRY (conn) link;            /* w->conns.all */
  TAILQ_ENTRY (conn) stall_link;     /* w->conns.stalled: rx is RX_STALLED */
  TAILQ_ENTRY (conn) send_link;      /* w->conns.to_send: tx is TX_QUEUED */

  struct nbd_handshake *hs;     /* CONN_HANDSHAKE only */
  size_t hs_sent;
  struct nbd_session s;

  time_t started, rx_progress, tx_progress;

  /* Receiving. */
  bool rx_pending;              /* a receive is on the ring */
  bool cancel_pending;          /* and a cancel of it */
  struct pdio_completion rx_c, cancel_c;
  enum rx_step rx;
  uint8_t hdr[NBD_REQUEST_LEN];
  size_t hdr_got;
  struct nbd_request pending;   /* the parsed header being started */
  struct req *rx_req;           /* RX_PAYLOAD, RX_DISCARD (its reply) */
  size_t payload_got;
  uint32_t discard_left;        /* RX_DISCARD */
  struct msghdr rx_msg;         /* a payload and the next header */
  struct iovec rx_iov[2];       /* where the pending receive goes */
  int rx_iovcnt;

  /* Sending. */
  enum tx_state tx;
  struct req_queue replies;     /* in the order they go out */
  size_t tx_off;                /* bytes of the first reply already sent */
  struct pdio_completion tx_c;
  struct msghdr msg;
  struct iovec iov[CONN_IOV];

  /* Requests and memory. */
  struct req_queue free_reqs;
  unsigned n_reqs;              /* requests between header and freeing */
  unsigned engine_inflight;
  size_t pool_held;             /* pdio_buf_cost of their memory */
};

static void hs_step (struct conn *c);
static void rx_next (struct conn *c);
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
    worker_log (c->w, LOG_ERROR, "io_uring submission failed");
  return sqe;
}

static bool
submit_recv (struct conn *c, void *buf, size_t len)
{
  struct io_uring_sqe *sqe = get_sqe (c);

  if (sqe == NULL)
    return false;
  /* For valgrind, which cannot see into the ring (vg.h): the kernel
   * writes buf now, and on_recv marks what it wrote.
   */
  c->rx_iov[0] = (struct iovec) { .iov_base = buf, .iov_len = len };
  c->rx_iovcnt = 1;
  vg_kernel_owns_iov (c->rx_iov, 1);
  /* MSG_WAITALL: one completion for a whole header or payload. */
  io_uring_prep_recv (sqe, c->fd, buf, len, MSG_WAITALL);
  io_uring_sqe_set_data (sqe, &c->rx_c);
  c->rx_pending = true;
  return true;
}

/* The rest of rx_req's payload, then into hdr (empty: hdr_got is 0 while
 * a payload is received) what of the next header is there already.
 */
static bool
submit_recv_payload_and_header (struct conn *c)
{
  struct io_uring_sqe *sqe = get_sqe (c);

  if (sqe == NULL)
    return false;
  c->rx_iov[0] = (struct iovec) {
    .iov_base = (uint8_t *) c->rx_req->buf + c->payload_got,
    .iov_len = c->rx_req->nbd.count - c->payload_got,
  };
  c->rx_iov[1] = (struct iovec) { .iov_base = c->hdr,
                                  .iov_len = NBD_REQUEST_LEN };
  c->rx_iovcnt = 2;
  c->rx_msg = (struct msghdr) { .msg_iov = c->rx_iov, .msg_iovlen = 2 };
  vg_kernel_owns_iov (c->rx_iov, 2);
  io_uring_prep_recvmsg (sqe, c->fd, &c->rx_msg, 0);
  io_uring_sqe_set_data (sqe, &c->rx_c);
  c->rx_pending = true;
  return true;
}

static bool
submit_send (struct conn *c, size_t iovcnt)
{
  struct io_uring_sqe *sqe = get_sqe (c);

  if (sqe == NULL)
    return false;
  /* What valgrind checks for sendmsg(2), which it cannot see here. */
  vg_check_iov (c->iov, iovcnt);
  c->msg = (struct msghdr) { .msg_iov = c->iov, .msg_iovlen = iovcnt };
  io_uring_prep_sendmsg (sqe, c->fd, &c->msg, MSG_NOSIGNAL);
  io_uring_sqe_set_data (sqe, &c->tx_c);
  c->tx = TX_SENDING;
  return true;
}

/* --- requests ------------------------------------------------------------------ */
static struct req *
req_new (struct conn *c)
{
  struct req *q = STAILQ_FIRST (&c->free_reqs);

  if (q)
    STAILQ_REMOVE_HEAD (&c->free_reqs, link);
  else if ((q = malloc (sizeof *q)) == NULL)
    return NULL;
  memset (q, 0, sizeof *q);
  q->c = c;
  c->n_reqs++;
  return q;
}

static void
release_buf (struct req *q)
{
  struct conn *c = q->c;

  if (q->buf) {
    pdio_buf_put (thr (c), q->buf, q->buf_len);
    c->pool_held -= pdio_buf_cost (q->buf_len);
    q->buf = NULL;
    q->payload = NULL;
  }
}

static void
req_free (struct req *q)
{
  struct conn *c = q->c;

  release_buf (q);
  c->n_reqs--;
  STAILQ_INSERT_HEAD (&c->free_reqs, q, link);
}

/* --- the end ------------------------------------------------------------------- */
static bool
in_flight (const struct conn *c)
{
  return c->rx_pending || c->cancel_pending || c->tx == TX_SENDING ||
         c->engine_inflight;
}

/* Drops the replies not being sent right now. */
static void
drop_queue (struct conn *c)
{
  struct req *q;

  if (c->tx == TX_SENDING)
    return;
  while ((q = STAILQ_FIRST (&c->replies)) != NULL) {
    STAILQ_REMOVE_HEAD (&c->replies, link);
    req_free (q);
  }
}

static void
conn_free (struct conn *c)
{
  struct worker *w = c->w;
  struct req *q;

  drop_queue (c);
  if (c->rx_req)
    req_free (c->rx_req);
  while ((q = STAILQ_FIRST (&c->free_reqs)) != NULL) {
    STAILQ_REMOVE_HEAD (&c->free_reqs, link);
    free (q);
  }
  if (w->ctx->log.debug) {
    /* As the plugin does at each close: the tests read these. */
    struct pdio_stats st;
    char buf[512];

    pdio_get_stats (w->ctx->img, &st);
    pdio_format_stats (&st, buf, sizeof buf);
    worker_log (w, LOG_DEBUG, "connection %d: stats: %s", c->fd, buf);
  }
  close (c->fd);
  LIST_REMOVE (c, link);
  w->conns.n--;
  free (c->hs);
  free (c);
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
  case CONN_DEAD:
    if (!in_flight (c))
      conn_free (c);
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
  io_uring_prep_cancel (sqe, &c->rx_c, 0);
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
  worker_log (c->w, LOG_DEBUG, "connection %d: closing: %s", c->fd, why);
  unstall (c);
  if (c->tx == TX_QUEUED) {
    TAILQ_REMOVE (&c->w->conns.to_send, c, send_link);
    c->tx = TX_IDLE;
  }
  c->phase = CONN_DEAD;
  /* Wakes a pending receive or send at once, on unix and TCP sockets. */
  shutdown (c->fd, SHUT_RDWR);
  cancel_recv (c);
  drop_queue (c);
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
  maybe_end (c);
}

/* --- sending ------------------------------------------------------------------ */
static void
queue_reply (struct conn *c, struct req *q)
{
  STAILQ_INSERT_TAIL (&c->replies, q, link);
  /* Sent when this round of completions is dispatched (conn_list_send_all),
   * so the replies of requests that finish together share one sendmsg.
   */
  if (c->tx == TX_IDLE) {
    c->tx = TX_QUEUED;
    TAILQ_INSERT_TAIL (&c->w->conns.to_send, c, send_link);
  }
}

/* The reply's header (and payload) from its error or result.  Structured
 * replies when negotiated for READ and BLOCK_STATUS, which need them, and
 * for errors (an error chunk); the spec allows the shorter simple reply
 * for the other successes.
 */
static void
reply (struct conn *c, struct req *q)
{
  const struct nbd_request *r = &q->nbd;

  if (q->error) {
    release_buf (q);
    q->payload_len = 0;
    q->hdr_len = c->s.structured ? nbd_error_chunk (q->hdr, r->cookie, q->error)
                                 : nbd_simple_reply (q->hdr, r->cookie, q->error);
  }
  else if (r->type == NBD_CMD_READ) {
    q->hdr_len = c->s.structured
      ? nbd_offset_data_header (q->hdr, r->cookie, r->offset, r->count)
      : nbd_simple_reply (q->hdr, r->cookie, 0);
    q->payload = q->buf;
    q->payload_len = r->count;
  }
  else if (r->type == NBD_CMD_BLOCK_STATUS)
    q->hdr_len = 0;             /* the whole chunk is the payload */
  else
    q->hdr_len = nbd_simple_reply (q->hdr, r->cookie, 0);
  queue_reply (c, q);
}

/* Sends what of the queued replies fits one sendmsg.  The caller must not
 * touch c afterwards (a failure hangs up).
 */
static void
tx_kick (struct conn *c)
{
  size_t n = 0, skip = c->tx_off;
  struct req *q;

  if (c->tx == TX_SENDING || STAILQ_EMPTY (&c->replies))
    return;
  for (q = STAILQ_FIRST (&c->replies); q && n + 2 <= CONN_IOV;
       q = STAILQ_NEXT (q, link)) {
    const struct { const void *p; size_t len; } seg[2] = {
      { q->hdr, q->hdr_len }, { q->payload, q->payload_len },
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
  }
  c->tx_progress = c->w->now;
  if (!submit_send (c, n))
    conn_abort (c, "cannot queue a send");
}

static void
sent_transmission (struct conn *c, size_t bytes)
{
  struct req *q;

  while (bytes && (q = STAILQ_FIRST (&c->replies)) != NULL) {
    size_t left = q->hdr_len + q->payload_len - c->tx_off;

    if (bytes < left) {
      c->tx_off += bytes;
      break;
    }
    bytes -= left;
    c->tx_off = 0;
    STAILQ_REMOVE_HEAD (&c->replies, link);
    req_free (q);
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
  case NBD_HS_DONE:
    c->s = c->hs->session;
    free (c->hs);
    c->hs = NULL;
    c->phase = CONN_TRANSMISSION;
    c->rx = RX_HEADER;
    worker_log (c->w, LOG_DEBUG, "connection %d: transmission (flags 0x%x%s%s)",
                c->fd, c->s.eflags, c->s.structured ? ", structured" : "",
                c->s.meta_base_allocation ? ", base:allocation" : "");
    if (c->w->stopping)
      drain (c);
    else
      rx_next (c);
    return;
  }
}

/* --- receiving --------------------------------------------------------------- */
/* Queues the receive rx asks for.  The caller must not touch c afterwards
 * (a failure hangs up).
 */
static void
rx_next (struct conn *c)
{
  bool ok = true;

  if (c->phase != CONN_TRANSMISSION || c->rx_pending)
    return;
  switch (c->rx) {
  case RX_HEADER:
    ok = submit_recv (c, c->hdr + c->hdr_got, NBD_REQUEST_LEN - c->hdr_got);
    break;
  case RX_PAYLOAD:
    if (c->rx_req->nbd.count - c->payload_got <= RX_COMBINED_MAX)
      ok = submit_recv_payload_and_header (c);
    else
      ok = submit_recv (c, (uint8_t *) c->rx_req->buf + c->payload_got,
                        c->rx_req->nbd.count - c->payload_got);
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

static void
on_engine_done (struct pdio_req *er, int err)
{
  struct req *q = container_of (er, struct req, er);
  struct conn *c = q->c;
  const struct nbd_request *r = &q->nbd;

  c->engine_inflight--;
  q->error = nbd_error_of_errno (err);
  /* Named as the plugin names them, so both front ends log alike.  A
   * fast zero that would be slow is an answer, not a failure.
   */
  if (err)
    worker_log (c->w, err == -ENOTSUP ? LOG_DEBUG : LOG_ERROR,
                "%s: %" PRIu32 " bytes at %" PRIu64 ": %s",
                r->type == NBD_CMD_READ ? "pread" :
                r->type == NBD_CMD_WRITE ? "pwrite" :
                r->type == NBD_CMD_WRITE_ZEROES ? "zero" :
                r->type == NBD_CMD_TRIM ? "trim" : "flush",
                r->count, r->offset, strerror (-err));
  /* A write's data is on disk (or failed): its memory can go now. */
  if (r->type == NBD_CMD_WRITE)
    release_buf (q);
  if (c->phase == CONN_DEAD) {
    req_free (q);
    maybe_end (c);
    return;
  }
  reply (c, q);
}

static void
submit_engine (struct conn *c, struct req *q)
{
  const struct nbd_request *r = &q->nbd;
  unsigned flags = (r->flags & NBD_CMD_FLAG_FUA) ? PDIO_FUA : 0;
  enum pdio_op op;

  switch (r->type) {
  case NBD_CMD_READ: op = PDIO_OP_READ; flags = 0; break;
  case NBD_CMD_WRITE: op = PDIO_OP_WRITE; break;
  case NBD_CMD_TRIM: op = PDIO_OP_TRIM; break;
  case NBD_CMD_WRITE_ZEROES:
    op = PDIO_OP_ZERO;
    if (!(r->flags & NBD_CMD_FLAG_NO_HOLE))
      flags |= PDIO_MAY_TRIM;
    if (r->flags & NBD_CMD_FLAG_FAST_ZERO)
      flags |= PDIO_FAST_ZERO;
    break;
  default: op = PDIO_OP_FLUSH; flags = 0; break;
  }
  q->er = (struct pdio_req) {
    .op = op, .flags = flags, .offset = r->offset, .count = r->count,
    .buf = q->buf, .done = on_engine_done,
  };
  c->engine_inflight++;
  pdio_submit (thr (c), &q->er);
}

static int
add_extent (void *opaque, uint64_t offset, uint64_t length, bool hole)
{
  (void) offset;
  return nbd_extents_add (opaque, length,
                          hole ? NBD_STATE_HOLE | NBD_STATE_ZERO : 0) ? 0 : 1;
}

/* Extents need no device I/O (SEEK_DATA/SEEK_HOLE): answered at once. */
static void
block_status (struct conn *c, struct req *q)
{
  const struct server_ctx *ctx = c->w->ctx;
  const struct nbd_request *r = &q->nbd;
  bool one = r->flags & NBD_CMD_FLAG_REQ_ONE;
  struct nbd_extents x;
  int err = 0;

  nbd_extents_init (&x, q->buf,
                    one ? 1 : (q->buf_len - NBD_BLOCK_STATUS_LEN (0)) / 8,
                    r->count);
  if (ctx->can_extents)
    err = pdio_extents (ctx->img, r->count, r->offset, one, add_extent, &x);
  if (err < 0)
    q->error = nbd_error_of_errno (err);
  else {
    /* No information is "data": always a safe answer. */
    if (x.n == 0)
      nbd_extents_add (&x, r->count, 0);
    q->payload = q->buf;
    q->payload_len = nbd_extents_finish (&x, r->cookie);
  }
  reply (c, q);
}

/* The pending header: refuse it, or get what it needs and start it; or
 * stall until that is available.  The caller must not touch c afterwards.
 */
static void
start_request (struct conn *c)
{
  const struct nbd_request *r = &c->pending;
  struct nbd_verdict v = nbd_check_request (r, &c->s);
  size_t need = 0;
  void *buf = NULL;
  struct req *q;

  if (r->type == NBD_CMD_DISC && v.error == 0) {
    drain (c);
    return;
  }
  if (c->n_reqs >= CONN_MAX_REQUESTS) {
    stall (c);
    return;
  }
  if (v.error == 0) {
    if (r->type == NBD_CMD_READ || r->type == NBD_CMD_WRITE)
      need = r->count;
    else if (r->type == NBD_CMD_BLOCK_STATUS)
      need = BLOCK_STATUS_BUF;
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
  q = req_new (c);
  if (q == NULL) {
    if (buf)
      pdio_buf_put (thr (c), buf, need);
    conn_abort (c, "out of memory");
    return;
  }
  q->nbd = *r;
  q->buf = buf;
  q->buf_len = need;
  c->pool_held += need ? pdio_buf_cost (need) : 0;

  if (v.error) {
    q->error = v.error;
    worker_log (c->w, LOG_DEBUG, "connection %d: refused command %u "
                "(%u bytes at %" PRIu64 ", flags 0x%x): error %u", c->fd,
                r->type, r->count, r->offset, r->flags, v.error);
    if (v.discard) {
      /* Answered once its payload is all in: clients (libnbd) take a
       * reply to a request they are still sending as a broken server.
       */
      c->rx = RX_DISCARD;
      c->rx_req = q;
      c->discard_left = v.discard;
      c->rx_progress = c->w->now;
    }
    else
      reply (c, q);
  }
  else if (r->type == NBD_CMD_WRITE) {
    c->rx_req = q;
    c->payload_got = 0;
    c->rx = RX_PAYLOAD;
    c->rx_progress = c->w->now;
  }
  else if (r->type == NBD_CMD_BLOCK_STATUS)
    block_status (c, q);
  else
    submit_engine (c, q);
  rx_next (c);
}

/* A whole header is in hdr: start its request.  The caller must not
 * touch c afterwards.
 */
static void
header_complete (struct conn *c)
{
  c->hdr_got = 0;
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

  (void) flags;
  vg_kernel_wrote_iov (c->rx_iov, c->rx_iovcnt, res);
  c->rx_pending = false;
  switch (c->phase) {
  case CONN_DEAD:
    maybe_end (c);
    return;
  case CONN_DRAINING:
    /* Whatever arrived is not served. */
    if (c->rx_req) {
      req_free (c->rx_req);
      c->rx_req = NULL;
    }
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
  case CONN_TRANSMISSION:
    break;
  }
  if (res <= 0) {
    conn_abort (c, res == 0 ? "client hung up" : "receive failed");
    return;
  }
  c->rx_progress = c->w->now;
  switch (c->rx) {
  case RX_HEADER:
    c->hdr_got += res;
    if (c->hdr_got < NBD_REQUEST_LEN)
      break;
    header_complete (c);
    return;
  case RX_PAYLOAD: {
    size_t want = c->rx_req->nbd.count - c->payload_got;
    size_t got = (size_t) res < want ? (size_t) res : want;

    c->payload_got += got;
    /* Past the payload: the start of the next header (combined receive). */
    c->hdr_got = res - got;
    if (c->payload_got < c->rx_req->nbd.count)
      break;
    c->rx = RX_HEADER;
    submit_engine (c, c->rx_req);
    c->rx_req = NULL;
    if (c->hdr_got == NBD_REQUEST_LEN) {
      header_complete (c);
      return;
    }
    break;
  }
  case RX_DISCARD:
    c->discard_left -= res;
    if (c->discard_left == 0) {
      c->rx = RX_HEADER;
      reply (c, c->rx_req);
      c->rx_req = NULL;
    }
    break;
  case RX_STALLED:
    break;
  }
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
    if (now - c->started > CONN_HANDSHAKE_SECS)
      conn_abort (c, "handshake took too long");
    return;
  case CONN_TRANSMISSION:
  case CONN_DRAINING:
    if (replies_wait && now - c->tx_progress > limit)
      conn_abort (c, "the client does not read its replies");
    else if (c->phase == CONN_TRANSMISSION && mid_request &&
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

void
conn_new (struct worker *w, int fd)
{
  struct conn *c = calloc (1, sizeof *c);

  if (c == NULL || (c->hs = malloc (sizeof *c->hs)) == NULL) {
    worker_log (w, LOG_ERROR, "connection refused: out of memory");
    free (c);
    close (fd);
    return;
  }
  c->w = w;
  c->fd = fd;
  c->phase = CONN_HANDSHAKE;
  c->rx_c.fn = on_recv;
  c->tx_c.fn = on_send;
  c->cancel_c.fn = on_cancel;
  c->rx = RX_HEADER;
  c->tx = TX_IDLE;
  STAILQ_INIT (&c->replies);
  STAILQ_INIT (&c->free_reqs);
  c->started = c->rx_progress = c->tx_progress = w->now;
  LIST_INSERT_HEAD (&w->conns.all, c, link);
  w->conns.n++;
  nbd_hs_init (c->hs, &w->ctx->export);
  worker_log (w, LOG_DEBUG, "connection %d: accepted by worker %u", fd, w->id);
  hs_step (c);
}

/* Each of these may free the connection it is at: the next is taken
 * first (freeing one connection never frees another).
 */
void
conn_list_stop_all (struct worker *w)
{
  struct conn *c, *next;

  for (c = LIST_FIRST (&w->conns.all); c; c = next) {
    next = LIST_NEXT (c, link);
    stop (c);
  }
}

void
conn_list_watchdog (struct worker *w)
{
  struct conn *c, *next;

  for (c = LIST_FIRST (&w->conns.all); c; c = next) {
    next = LIST_NEXT (c, link);
    watchdog (c);
  }
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
