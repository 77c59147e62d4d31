/* SPDX-License-Identifier: BSD-3-Clause */
/* What the server's files share: the worker (worker.c) and the
 * connection (conn.c) interfaces.  Not for pdio(1): see server.h.
 */
#ifndef PDIO_SERVER_INTERNAL_H
#define PDIO_SERVER_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/queue.h>
#include <time.h>
#include <liburing.h>

#include "engine.h"
#include "handover.h"
#include "proto.h"
#include "server.h"

/* A connection may hold at most this many requests between reading their
 * header and finishing their reply, and at most this much of its
 * worker's pool (a request takes at most NBD_CMD_BUF_MAX, however long:
 * cmd.h): beyond either, it stops reading requests until replies go out.
 */
#define CONN_MAX_REQUESTS 64
#define CONN_MAX_POOL_BYTES ((size_t) NBD_MAX_PAYLOAD)
/* A connection whose replies or payload make no progress for this long
 * (seconds) is dropped: a client that stops reading must not keep pool
 * memory its worker's other connections need.  While the server stops,
 * the limit is shorter.  The handshake, TLS included, has to finish
 * within server_ctx.handshake_secs of the accept, progress or not: a
 * client that trickles bytes must not hold a connection slot forever.
 */
#define CONN_STALL_SECS 30
#define CONN_STALL_SECS_STOPPING 5
/* Payload bytes of refused WRITEs are read into a per-worker scratch
 * buffer of this size and dropped.
 */
#define WORKER_DISCARD_BYTES (64 * 1024)
/* Pool memory unused this long (seconds) goes back to the kernel, and
 * out of the ring's pinned buffers.  Long enough that a client's pauses
 * (a think time, a flush, the gap between two jobs) do not make a chunk
 * go and come back -- each return costs a registration and 2 MiB of
 * zeroing -- and short enough that a server left idle is small within
 * seconds.
 */
#define WORKER_IDLE_SECS 5

struct conn;

/* A worker's connections as conn.c keeps them: the worker holds them,
 * reads n and calls conn_list_*; only conn.c walks or changes them.
 */
TAILQ_HEAD (conn_queue, conn);
struct conn_lists {
  LIST_HEAD (, conn) all;       /* every live connection */
  struct conn_queue stalled;    /* a header waits for pool memory or a slot */
  struct conn_queue to_send;    /* replies queued, no send in flight */
  unsigned n;                   /* connections in all */
};

/* What every worker shares, read-only once the workers run. */
struct server_ctx {
  struct pdio_image *img;
  struct nbd_export export;
  bool can_extents;
  struct pdio_log log;
  size_t pool_bytes;
  unsigned reserve_chunks;      /* pdio_thread_config.reserve_chunks */
  unsigned handshake_secs;
  const struct pdio_tls *tls;   /* NULL: STARTTLS is refused */
  /* Connections accepted and not yet closed, against max_connections:
   * the accept thread counts them in, conn.c out (server_conn_closed).
   */
  atomic_uint *live;
  unsigned max_connections;
  bool rings_at_start;          /* every worker makes its ring at start */
  bool keep_memory;             /* never trim the pools (--swap) */
  struct pdio_devstats *stats;  /* the counters, slot i worker i's; or NULL */
};

/* A connection handed to a worker is closed (server.c). */
extern void server_conn_closed (const struct server_ctx *ctx);

struct worker {
  const struct server_ctx *ctx;
  unsigned id;
  pthread_t thread;
  struct pdio_thread *t;
  uint8_t *discard;             /* WORKER_DISCARD_BYTES of scratch */

  /* The accept thread hands connections over here (under lock) and
   * wakes the worker through event_fd: new ones, and ones taken over from
   * a predecessor; stop, or hand over to a successor, is asked the same
   * way.
   */
  pthread_mutex_t lock;
  int *incoming;
  size_t n_incoming, cap_incoming;
  struct handover adopt;        /* only its conns are used */
  bool stop_requested;
  bool hand_over_requested;     /* with stop_requested */
  bool ended;                   /* its connections are gone: no request
                                   runs any more, handed is complete */
  pthread_cond_t ended_cond;
  int event_fd;
  uint64_t event_value;
  struct pdio_completion event_c;

  /* The worker thread's own. */
  struct conn_lists conns;
  bool stopping;
  /* Connections handed over, for the accept thread once joined (only
   * its conns are used).
   */
  struct handover handed;
  time_t now;                   /* CLOCK_MONOTONIC seconds, per loop */
};

/* worker.c */
extern void worker_log (const struct worker *w, enum pdio_log_level level,
                        const char *fmt, ...)
  __attribute__ ((format (printf, 3, 4)));
extern int worker_start (struct worker *w, const struct server_ctx *ctx,
                         unsigned id);
/* From the accept thread. */
extern void worker_hand_over (struct worker *w, int fd);
extern void worker_adopt (struct worker *w, const struct handover_conn *c);
extern void worker_request_stop (struct worker *w);
/* Stop, handing every connection in transmission to a successor: they
 * are in w->handed once joined.
 */
extern void worker_request_hand_over (struct worker *w);
extern void worker_join (struct worker *w);
/* Waits until the worker's connections are gone (it may still be
 * tearing down its ring): its handed list is then the caller's to read.
 */
extern void worker_wait_ended (struct worker *w);
/* From conn.c: c (its fd and payload) goes to the successor.  false if
 * it cannot be kept (out of memory): c stays the caller's.
 */
extern bool worker_handed (struct worker *w, const struct handover_conn *c);

/* devstats.c, on the worker's thread: the time a header came in (0 when
 * nothing is counted); cmd counted in flight from then; its reply sent;
 * it ends without one (dropped: lost, not handed to a successor).
 */
struct nbd_cmd;
extern uint64_t devstats_clock (const struct worker *w);
extern void devstats_received (struct worker *w, struct nbd_cmd *cmd,
                               uint64_t at);
extern void devstats_replied (struct worker *w, struct nbd_cmd *cmd);
extern void devstats_gone (struct worker *w, struct nbd_cmd *cmd,
                           bool dropped);

/* conn.c, all on the worker's thread. */
extern void conn_list_init (struct worker *w);
extern void conn_new (struct worker *w, int fd);
/* A connection taken over from the predecessor (its fd and payload are
 * the connection's now), in the transmission phase.
 */
extern void conn_adopt (struct worker *w, struct handover_conn *c);
/* The server is stopping: hang up on the handshakes, drain the rest. */
extern void conn_list_stop_all (struct worker *w);
/* The server hands over: hang up on the handshakes, hand the rest over
 * once their replies are sent (draining ones just end).
 */
extern void conn_list_hand_over_all (struct worker *w);
/* Retry the headers that waited for memory or a slot. */
extern void conn_list_resume_stalled (struct worker *w);
/* Send the replies this round of completions queued. */
extern void conn_list_send_all (struct worker *w);
/* Drop the connections that stopped making progress. */
extern void conn_list_watchdog (struct worker *w);

#endif /* PDIO_SERVER_INTERNAL_H */
