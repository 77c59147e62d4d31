/* SPDX-License-Identifier: BSD-3-Clause */
/* Handing live connections from one pdio server to its successor (pdio
 * restart), so that the client -- the kernel -- never sees a close.  The
 * old server listens on a unix socket of its own (pdio serve
 * --handover-socket, root-only 0600 in the run directory); the successor
 * (pdio serve --take-over PATH) connects there and says hello; the old
 * server stops reading requests, answers everything it started, lets go
 * of the image's lock and sends, over that socket:
 *
 *   OFFER    magic, version, number of connections, the export's size
 *            and read-only flag, its pid; with SCM_RIGHTS, its two listening
 *            sockets (NBD and hand-over), so that neither path is ever
 *            unbound;
 *   CONN     one per connection, with the connection's fd (SCM_RIGHTS):
 *            what was negotiated (size, transmission flags, structured
 *            replies, base:allocation, the maximum block size) and the
 *            bytes already received of the first request not started:
 *            0-28 header bytes, then, for a WRITE, how much of its
 *            payload came in and (unless it was a refused WRITE's, read
 *            and dropped) those bytes, which follow the record;
 *   END      magic.
 *
 * The successor answers ACK once it serves them.  Everything is
 * big-endian, as in NBD, and everything received is checked as the input
 * it is: magics, version, counts, lengths, that each fd is a stream
 * socket of the right kind, that the peer is a process of our own user.
 * Both sides block, with a time limit, in their control thread: no worker
 * waits for this.
 */
#ifndef PDIO_SERVER_HANDOVER_H
#define PDIO_SERVER_HANDOVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "proto.h"
#include "server.h"           /* struct handover, and what pdio serve calls */

#define HANDOVER_VERSION 1
/* Most connections one hand-over carries (a server has one per client). */
#define HANDOVER_MAX_CONNS 4096
/* How long either side waits for the other at each step, in ms.  The old
 * server may first have to finish requests in flight on a slow disk.
 */
#define HANDOVER_TIMEOUT_MS 10000

/* One connection, in the transmission phase, between two servers. */
struct handover_conn {
  int fd;
  struct nbd_session s;
  uint8_t hdr[NBD_REQUEST_LEN]; /* the first request not started... */
  uint32_t hdr_got;             /* ...this much of its header (0-28) */
  uint32_t payload_got;         /* a WRITE's payload bytes received */
  uint8_t *payload;             /* those bytes (malloc), or NULL if they
                                   were read and dropped (a refused
                                   WRITE's) or there are none */
};

/* Takes c (its fd and payload) into ho; false (out of memory) leaves it
 * with the caller.
 */
extern bool handover_add (struct handover *ho, const struct handover_conn *c);

/* The old server's side (handover_listen, handover_wait_ack: server.h).
 * A successor connected to listen_fd: accepts it and reads its hello
 * (a peer that stays silent holds the caller up to HANDOVER_TIMEOUT_MS).
 * The connected socket, or -1 (a stranger, a bad hello: logged, and
 * the server carries on).
 */
extern int handover_accept (int listen_fd, const struct pdio_log *log,
                            pid_t *peer);
/* Sends ho (OFFER, CONN..., END) on ho->sock.  0, or -1 with the reason
 * logged.  The fds stay ho's: close them afterwards (handover_free).
 */
extern int handover_send (struct handover *ho, const struct pdio_log *log);
/* The successor's side: connects to the old server at path, says hello
 * and receives everything into ho (empty before).  0, or -1 with the
 * reason logged (ho then holds nothing).
 */
extern int handover_receive (const char *path, struct handover *ho,
                             const struct pdio_log *log);
/* Tells the old server we serve its connections now. */
extern void handover_ack (struct handover *ho, const struct pdio_log *log);

#endif /* PDIO_SERVER_HANDOVER_H */
