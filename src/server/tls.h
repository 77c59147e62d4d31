/* SPDX-License-Identifier: BSD-3-Clause */
/* TLS for pdio's own server (GnuTLS): the credentials, loaded once by
 * pdio serve, and each connection's TLS session after NBD_OPT_STARTTLS.
 *
 * The record layer runs on the worker's ring like the rest of the
 * connection: GnuTLS reads and writes through push and pull functions over
 * two buffers of the connection's own, which io_uring receives fill and
 * sends drain.  Nothing blocks and no thread is added: when GnuTLS wants
 * bytes that have not come, a receive is queued and the step is retried
 * from its completion.  Without TLS none of this runs: conn.c's receives
 * and sends go straight to the socket, as before; and with kTLS, once the
 * NBD handshake is over, neither does it: the kernel then holds the keys
 * and conn.c's plain receives and sends carry the records.
 *
 * No GnuTLS type appears here, so pdio(1) needs no GnuTLS headers.
 */
#ifndef PDIO_SERVER_TLS_H
#define PDIO_SERVER_TLS_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/uio.h>

/* The credentials (pdio_tls_new...) are pdio(1)'s to load: server.h. */
#include "server.h"

/* --- one connection's session (conn.c) ----------------------------------- */
struct tls_conn;

/* handshake_done (opaque, why) runs once the TLS handshake is over: why
 * is NULL if the client is in (the handshake succeeded, the peer was
 * verified and authorized), else what went wrong.  settled (opaque) runs
 * when the last of the session's own ring operations completes with no
 * receive or send of the connection's to answer (so that a dead
 * connection can be freed).  Each is the last thing a completion does.
 * NULL with *why set if the session cannot be made.
 */
extern struct tls_conn *tls_conn_new (const struct pdio_tls *tls,
                                      struct pdio_thread *t, int fd,
                                      void (*handshake_done) (void *opaque,
                                                              const char *why),
                                      void (*settled) (void *opaque),
                                      void *opaque, const char **why);
/* Only once tls_conn_busy is false. */
extern void tls_conn_free (struct tls_conn *tc);
/* Starts the TLS handshake (handshake_done may run before it returns, if
 * the ring refuses what it needs).
 */
extern void tls_conn_handshake (struct tls_conn *tc);
/* Something of it is on the ring: the connection must outlive it. */
extern bool tls_conn_busy (const struct tls_conn *tc);
/* Who the client is (certificate DN or PSK identity), once in. */
extern const char *tls_conn_peer (const struct tls_conn *tc);

/* Like an io_uring recv (waitall: MSG_WAITALL) or recvmsg into iov, and
 * a sendmsg of iov: done->fn (done, res, 0) runs later from a completion
 * with the plaintext bytes received or sent (a send may take fewer than
 * offered; a receive without waitall returns what there is), 0 at the
 * end of the stream, or -errno.  At most one of each at a time.  false if
 * the ring refused it.
 */
extern bool tls_conn_recv (struct tls_conn *tc, const struct iovec *iov,
                           int iovcnt, bool waitall,
                           struct pdio_completion *done);
extern bool tls_conn_send (struct tls_conn *tc, const struct iovec *iov,
                           int iovcnt, struct pdio_completion *done);
/* Hands the session to the kernel (kTLS, proto.h's pdio_ktls_enable),
 * between messages: nothing of the session in flight or buffered.  0:
 * plain receives and sends on the socket carry TLS from now on, and tc
 * is only to be freed.  -1: the session goes on here, as before.  -2:
 * the socket can carry neither.  why says what happened in each case.
 */
extern int tls_conn_to_kernel (struct tls_conn *tc, char *why, size_t len);
/* What to cancel for a pending tls_conn_recv (io_uring_prep_cancel). */
extern void *tls_conn_recv_token (struct tls_conn *tc);

#endif /* PDIO_SERVER_TLS_H */
