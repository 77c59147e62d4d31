/* One client connection: the handshake, then transmission.  Everything
 * runs on the worker's thread, driven by completions on its ring: at most
 * one receive and one send are queued per connection at a time (a stream
 * socket's bytes must go out in order), engine requests as many as the
 * client sends, up to CONN_MAX_REQUESTS.
 *
 * A request's life: its 28-byte header is received into the connection;
 * it is checked (proto.c); a READ or WRITE gets pool memory of its length
 * (pdio_buf_get: page-aligned, so the engine does direct I/O on it), a
 * WRITE's payload is received straight into that memory and handed to the
 * engine as is; the engine's completion queues the reply, and once the
 * round of completions is dispatched, a READ's reply goes out as its
 * header and data in one sendmsg, batched with every other queued reply.  The memory goes back to the pool
 * when the engine is done (WRITE) or the reply is sent (READ).  Replies go
 * out in completion order, not request order.
 *
 * Backpressure: when the pool says no, or the connection holds
 * CONN_MAX_REQUESTS requests or CONN_MAX_POOL_BYTES of memory, it stops
 * receiving (it is "stalled") and the worker retries it after its next
 * round of completions.
 *
 * Ending: conn_abort() hangs up (shutdown, cancel the receive) and frees
 * the connection once nothing of it is in flight: no receive, no send, no
 * engine request (those cannot be cancelled; their completions find the
 * connection dead and just free their memory).  A soft end (NBD_CMD_DISC,
 * server stop) first stops receiving and lets every reply go out.
 */
#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
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
  struct req *next;             /* send queue, or free list */
  struct nbd_request nbd;
  void *buf;                    /* pool memory, or NULL */
  size_t buf_len;
  uint32_t error;               /* the NBD error of the reply */
  uint8_t hdr[NBD_OFFSET_DATA_HEADER_LEN];
  uint8_t hdr_len;
  const void *payload;          /* what follows hdr on the wire */
  size_t payload_len;
  struct nbd_extents extents;   /* BLOCK_STATUS: built in buf */
};

enum rx_state {
  RX_HEADER,                    /* receiving a request header */
  RX_PAYLOAD,                   /* receiving a WRITE's data into rx_req */
  RX_DISCARD,                   /* dropping a refused WRITE's data */
  RX_STALLED,                   /* a header waits for memory or a slot */
  RX_STOPPED,                   /* no more requests will be read */
};

struct conn {
  struct worker *w;
  int fd;
  struct conn *prev, *next;     /* the worker's connections */
  struct conn *stall_next;
  bool on_stall_list;
  struct conn *send_next;       /* the worker's list of replies to send */
  bool on_send_list;

  struct nbd_handshake *hs;     /* during the handshake only */
  size_t hs_sent;
  struct nbd_session s;

  time_t started, rx_progress, tx_progress;

  /* Receiving. */
  enum rx_state rx;
  bool rx_pending;
  struct pdio_completion rx_c;
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
  struct req *tx_head, *tx_tail;
  size_t tx_off;                /* bytes of tx_head already sent */
  bool tx_pending;
  struct pdio_completion tx_c;
  struct msghdr msg;
  struct iovec iov[CONN_IOV];

  /* Requests and memory. */
  struct req *free_reqs;
  unsigned n_reqs;              /* requests between header and freeing */
  unsigned engine_inflight;
  size_t pool_held;

  bool cancel_pending;
  struct pdio_completion cancel_c;
  bool draining;                /* soft end: answer what is in, then close */
  bool dead;                    /* hard end: free once nothing is in flight */
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

/* What pdio_buf_get (len) takes from the pool: a power-of-two number of
 * 4 KiB pages (engine.h).  Connections account for this, so their bound
 * is in real pool memory.
 */
static size_t
pool_cost (size_t len)
{
  size_t pages = (len + 4095) / 4096, p = 1;

  while (p < pages)
    p <<= 1;
  return p * 4096;
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
  c->tx_pending = true;
  return true;
}

/* --- requests ------------------------------------------------------------------ */
static struct req *
req_new (struct conn *c)
{
  struct req *q = c->free_reqs;

  if (q)
    c->free_reqs = q->next;
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
    c->pool_held -= pool_cost (q->buf_len);
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
  q->next = c->free_reqs;
  c->free_reqs = q;
}

/* --- freeing ------------------------------------------------------------------ */
static void
unlink_stalled (struct conn *c)
{
  struct conn **p = &c->w->stalled;

  if (!c->on_stall_list)
    return;
  while (*p && *p != c)
    p = &(*p)->stall_next;
  if (*p)
    *p = c->stall_next;
  c->on_stall_list = false;
}

static void
unlink_send (struct conn *c)
{
  struct conn **p = &c->w->to_send;

  if (!c->on_send_list)
    return;
  while (*p && *p != c)
    p = &(*p)->send_next;
  if (*p)
    *p = c->send_next;
  c->on_send_list = false;
}

/* Drops the replies not being sent right now. */
static void
drop_queue (struct conn *c)
{
  while (c->tx_head && !c->tx_pending) {
    struct req *q = c->tx_head;

    c->tx_head = q->next;
    req_free (q);
  }
  if (c->tx_head == NULL)
    c->tx_tail = NULL;
}

static void
maybe_free (struct conn *c)
{
  struct worker *w = c->w;

  if (!c->dead || c->rx_pending || c->tx_pending || c->cancel_pending ||
      c->engine_inflight)
    return;
  drop_queue (c);
  if (c->rx_req)
    req_free (c->rx_req);
  while (c->free_reqs) {
    struct req *q = c->free_reqs;

    c->free_reqs = q->next;
    free (q);
  }
  unlink_stalled (c);
  unlink_send (c);
  if (w->ctx->log.debug) {
    /* As the plugin does at each close: the tests read these. */
    struct pdio_stats st;
    char buf[512];

    pdio_get_stats (w->ctx->img, &st);
    pdio_format_stats (&st, buf, sizeof buf);
    worker_log (w, LOG_DEBUG, "connection %d: stats: %s", c->fd, buf);
  }
  close (c->fd);
  if (c->prev)
    c->prev->next = c->next;
  else
    w->conns = c->next;
  if (c->next)
    c->next->prev = c->prev;
  w->n_conns--;
  free (c->hs);
  free (c);
}

static void
on_cancel (struct pdio_completion *pc, int res, uint32_t flags)
{
  struct conn *c = container_of (pc, struct conn, cancel_c);

  (void) res;                   /* 0, -ENOENT, -EALREADY: all fine */
  (void) flags;
  c->cancel_pending = false;
  maybe_free (c);
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

/* Hangs up.  The caller must not touch c afterwards: it may be freed. */
static void
conn_abort (struct conn *c, const char *why)
{
  if (c->dead)
    return;
  worker_log (c->w, LOG_DEBUG, "connection %d: closing: %s", c->fd, why);
  c->dead = true;
  /* Wakes a pending receive or send at once, on unix and TCP sockets. */
  shutdown (c->fd, SHUT_RDWR);
  cancel_recv (c);
  drop_queue (c);
  maybe_free (c);
}

/* A soft end is complete once every request got its reply. */
static void
maybe_close (struct conn *c)
{
  if (c->draining && !c->dead && !c->rx_pending && c->engine_inflight == 0 &&
      c->tx_head == NULL && !c->tx_pending && c->rx_req == NULL)
    conn_abort (c, "all replies sent");
}

/* --- sending ------------------------------------------------------------------ */
static void
queue_reply (struct conn *c, struct req *q)
{
  q->next = NULL;
  if (c->tx_tail)
    c->tx_tail->next = q;
  else
    c->tx_head = q;
  c->tx_tail = q;
  /* Sent when this round of completions is dispatched (conn_send), so
   * the replies of requests that finish together share one sendmsg.
   */
  if (!c->on_send_list && !c->tx_pending) {
    c->send_next = c->w->to_send;
    c->w->to_send = c;
    c->on_send_list = true;
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

static void
tx_kick (struct conn *c)
{
  size_t n = 0, skip = c->tx_off;

  if (c->tx_pending || c->tx_head == NULL || c->dead)
    return;
  for (struct req *q = c->tx_head; q && n + 2 <= CONN_IOV; q = q->next) {
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
  while (bytes && c->tx_head) {
    struct req *q = c->tx_head;
    size_t left = q->hdr_len + q->payload_len - c->tx_off;

    if (bytes < left) {
      c->tx_off += bytes;
      break;
    }
    bytes -= left;
    c->tx_off = 0;
    c->tx_head = q->next;
    if (c->tx_head == NULL)
      c->tx_tail = NULL;
    req_free (q);
  }
}

static void
on_send (struct pdio_completion *pc, int res, uint32_t flags)
{
  struct conn *c = container_of (pc, struct conn, tx_c);

  (void) flags;
  c->tx_pending = false;
  if (c->dead) {
    maybe_free (c);
    return;
  }
  if (res <= 0) {
    conn_abort (c, res == 0 ? "send made no progress" : "send failed");
    return;
  }
  c->tx_progress = c->w->now;
  if (c->hs) {
    c->hs_sent += res;
    hs_step (c);
    return;
  }
  sent_transmission (c, res);
  tx_kick (c);
  maybe_close (c);
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
    c->rx = c->w->stopping ? RX_STOPPED : RX_HEADER;
    c->draining = c->w->stopping;
    worker_log (c->w, LOG_DEBUG, "connection %d: transmission (flags 0x%x%s%s)",
                c->fd, c->s.eflags, c->s.structured ? ", structured" : "",
                c->s.meta_base_allocation ? ", base:allocation" : "");
    rx_next (c);
    maybe_close (c);
    return;
  }
}

/* --- receiving --------------------------------------------------------------- */
static void
rx_next (struct conn *c)
{
  bool ok = true;

  if (c->dead || c->draining || c->rx_pending)
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
  case RX_STOPPED:
    break;
  }
  if (!ok)
    conn_abort (c, "cannot queue a receive");
}

static void
stall (struct conn *c)
{
  c->rx = RX_STALLED;
  if (!c->on_stall_list) {
    c->stall_next = c->w->stalled;
    c->w->stalled = c;
    c->on_stall_list = true;
  }
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
  if (c->dead) {
    req_free (q);
    maybe_free (c);
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
  struct req *q = opaque;

  (void) offset;
  return nbd_extents_add (&q->extents, length,
                          hole ? NBD_STATE_HOLE | NBD_STATE_ZERO : 0) ? 0 : 1;
}

static void
extents_reply (struct conn *c, struct req *q, int err)
{
  if (err < 0)
    q->error = nbd_error_of_errno (err);
  else {
    /* No information is "data": always a safe answer. */
    if (q->extents.n == 0)
      nbd_extents_add (&q->extents, q->nbd.count, 0);
    q->payload = q->buf;
    q->payload_len = nbd_extents_finish (&q->extents, q->nbd.cookie);
  }
  reply (c, q);
}

static void
on_extents_done (struct pdio_req *er, int err)
{
  struct req *q = container_of (er, struct req, er);
  struct conn *c = q->c;

  c->engine_inflight--;
  if (err < 0)
    worker_log (c->w, LOG_ERROR, "extents: %" PRIu32 " bytes at %" PRIu64
                ": %s", q->nbd.count, q->nbd.offset, strerror (-err));
  if (c->dead) {
    req_free (q);
    maybe_free (c);
    return;
  }
  extents_reply (c, q, err);
}

/* SEEK_DATA/SEEK_HOLE may block (FUSE, NFS): the engine runs them off
 * this thread and the reply goes out from the completion.
 */
static void
block_status (struct conn *c, struct req *q)
{
  const struct server_ctx *ctx = c->w->ctx;
  const struct nbd_request *r = &q->nbd;
  bool one = r->flags & NBD_CMD_FLAG_REQ_ONE;

  nbd_extents_init (&q->extents, q->buf,
                    one ? 1 : (q->buf_len - NBD_BLOCK_STATUS_LEN (0)) / 8,
                    r->count);
  if (!ctx->can_extents) {
    extents_reply (c, q, 0);
    return;
  }
  q->er = (struct pdio_req) {
    .op = PDIO_OP_EXTENTS, .flags = one ? PDIO_REQ_ONE : 0,
    .offset = r->offset, .count = r->count, .extent = add_extent,
    .opaque = q, .done = on_extents_done,
  };
  c->engine_inflight++;
  pdio_submit (thr (c), &q->er);
}

/* The pending header: refuse it, or get what it needs and start it; or
 * stall until that is available.
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
    c->rx = RX_STOPPED;
    c->draining = true;
    maybe_close (c);
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
    if (c->pool_held && c->pool_held + pool_cost (need) > CONN_MAX_POOL_BYTES) {
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
  c->pool_held += need ? pool_cost (need) : 0;
  c->rx = RX_HEADER;

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

/* A whole header is in hdr: start its request.  c may be freed after. */
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
  if (c->dead) {
    maybe_free (c);
    return;
  }
  if (c->hs) {
    if (res <= 0) {
      conn_abort (c, res == 0 ? "client hung up in the handshake"
                              : "receive failed in the handshake");
      return;
    }
    c->rx_progress = c->w->now;
    nbd_hs_received (c->hs, res);
    hs_step (c);
    return;
  }
  if (c->draining) {
    /* Stopping: whatever arrived is not served. */
    if (c->rx_req) {
      req_free (c->rx_req);
      c->rx_req = NULL;
    }
    c->rx = RX_STOPPED;
    maybe_close (c);
    return;
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
  case RX_STOPPED:
    break;
  }
  rx_next (c);
}

/* --- what the worker calls ------------------------------------------------------ */
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
  c->rx_c.fn = on_recv;
  c->tx_c.fn = on_send;
  c->cancel_c.fn = on_cancel;
  c->started = c->rx_progress = c->tx_progress = w->now;
  c->next = w->conns;
  if (w->conns)
    w->conns->prev = c;
  w->conns = c;
  w->n_conns++;
  nbd_hs_init (c->hs, &w->ctx->export);
  worker_log (w, LOG_DEBUG, "connection %d: accepted by worker %u", fd, w->id);
  hs_step (c);
}

void
conn_stop (struct conn *c)
{
  if (c->dead)
    return;
  if (c->hs) {
    conn_abort (c, "the server is stopping");
    return;
  }
  unlink_stalled (c);
  c->draining = true;
  if (c->rx_pending)
    cancel_recv (c);
  else {
    c->rx = RX_STOPPED;
    maybe_close (c);
  }
}

void
conn_send (struct conn *c)
{
  c->on_send_list = false;
  tx_kick (c);
}

void
conn_resume (struct conn *c)
{
  c->on_stall_list = false;
  if (c->dead || c->draining || c->rx != RX_STALLED)
    return;
  c->rx = RX_HEADER;
  start_request (c);
}

void
conn_watchdog (struct conn *c)
{
  time_t now = c->w->now;
  time_t limit = c->w->stopping ? CONN_STALL_SECS_STOPPING : CONN_STALL_SECS;
  bool mid_request = c->rx == RX_PAYLOAD || c->rx == RX_DISCARD ||
                     (c->rx == RX_HEADER && c->hdr_got);

  if (c->dead)
    return;
  if (c->hs && now - c->started > CONN_HANDSHAKE_SECS)
    conn_abort (c, "handshake took too long");
  else if ((c->tx_head || c->tx_pending) && now - c->tx_progress > limit)
    conn_abort (c, "the client does not read its replies");
  else if (!c->hs && mid_request && now - c->rx_progress > limit)
    conn_abort (c, "the client stopped in the middle of a request");
}

struct conn *
conn_next (const struct conn *c)
{
  return c->next;
}

struct conn *
conn_next_stalled (const struct conn *c)
{
  return c->stall_next;
}

struct conn *
conn_next_to_send (const struct conn *c)
{
  return c->send_next;
}
