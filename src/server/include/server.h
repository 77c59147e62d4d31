/* SPDX-License-Identifier: BSD-3-Clause */
/* pdio's own NBD server: the entry points pdio(1) uses.  The server runs
 * in the calling process: one worker thread per CPU (or as configured),
 * each with one io_uring carrying its connections' sockets and the file
 * I/O, and the calling thread accepting connections and handing them out
 * round-robin.  docs/design.md ("The native server") explains the
 * memory bounds and who owns which buffer when.
 */
#ifndef PDIO_SERVER_SERVER_H
#define PDIO_SERVER_SERVER_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "engine.h"

/* --- TLS (tls.c): the credentials pdio serve loads ---------------------- */
enum pdio_tls_mode {
  PDIO_TLS_OFF,                 /* STARTTLS gets NBD_REP_ERR_POLICY */
  PDIO_TLS_ON,                  /* offered; plain clients served too */
  PDIO_TLS_REQUIRE,             /* nothing but STARTTLS and ABORT before TLS */
};

/* What pdio serve's --tls* options say.  One of certificates (a directory
 * with ca-cert.pem, server-cert.pem and server-key.pem, as nbdkit and qemu
 * name them) and psk_file (psktool's "identity:hex-key" lines) is set
 * unless mode is PDIO_TLS_OFF.
 */
struct pdio_tls_config {
  enum pdio_tls_mode mode;
  const char *certificates;
  const char *psk_file;
  bool verify_peer;             /* x509: a client certificate signed by
                                   ca-cert.pem, valid now, is required */
  const char *const *authz;     /* if n_authz: the only client certificate
                                   DNs (RFC 4514, as certtool -i prints
                                   "Subject:") or PSK identities let in */
  size_t n_authz;
  bool no_ktls;                 /* keep the records in user space, even
                                   where the kernel could take them */
};

/* The loaded credentials, shared read-only by every worker. */
struct pdio_tls;

/* 0, or -errno with the reason (the file, what is wrong) logged. */
extern int pdio_tls_new (const struct pdio_tls_config *cfg,
                         const struct pdio_log *log, struct pdio_tls **out);
extern void pdio_tls_free (struct pdio_tls *tls);
extern enum pdio_tls_mode pdio_tls_mode (const struct pdio_tls *tls);

/* --- the hand-over to a successor (handover.c): what pdio serve drives --- */
struct handover {
  int sock;                     /* to the other server, or -1 */
  pid_t peer;                   /* its pid (as it says, for messages) */
  int nbd_listen_fd;            /* the listening sockets, or -1 */
  int handover_listen_fd;
  uint64_t size;                /* the export as the old server served it */
  bool readonly;
  struct handover_conn *conns;  /* handover.h */
  size_t n, cap;
};

/* An empty hand-over: no fds, no connections. */
extern void handover_init (struct handover *ho);
/* Closes every fd it still holds and frees the payloads. */
extern void handover_free (struct handover *ho);
/* The old server's side: a listening unix socket at path, mode 0600 (a
 * stale socket there is replaced): the fd, or -errno with the reason
 * logged.  Call it before any thread starts (it sets the umask).
 */
extern int handover_listen (const char *path, const struct pdio_log *log);
/* Waits for the successor's ACK: true once it serves the connections. */
extern bool handover_wait_ack (struct handover *ho,
                               const struct pdio_log *log);

/* --- the server ---------------------------------------------------------- */
struct pdio_server_config {
  struct pdio_image *img;       /* opened by the caller, closed by it */
  unsigned threads;             /* workers; 0: one per online CPU */
  size_t pool_bytes;            /* each worker's buffer pool; 0: default */
  unsigned reserve_chunks;      /* of each worker's pool, kept resident and
                                   locked (pdio_thread_config); 0: none */
  const char *description;      /* NBD_INFO_DESCRIPTION, or NULL */
  struct pdio_log log;          /* error, warning, debug: any may be NULL */
  unsigned max_connections;     /* more are accepted and closed; 0: default */
  unsigned handshake_secs;      /* to finish the handshake; 0: default */
  const struct pdio_tls *tls;   /* NULL: no TLS (STARTTLS refused) */
  int handover_fd;              /* listening for a successor (handover_listen),
                                   or -1 */
  /* Take over from the server listening for a successor at take_over,
   * or NULL.  Then listen_fd and handover_fd are -1 (both come with the
   * hand-over), img was opened with lock_later (it is locked once the old
   * server has let go of it), and taken gets the hand-over's peer and
   * count, for messages (its connections are the workers').  listen_path
   * is the unix socket the old server must be listening on, or NULL.
   */
  const char *take_over;
  const char *listen_path;
  struct handover *taken;
  /* Never give idle pool memory back (pdio serve --swap, whose memory is
   * locked): a page given back would have to come back while the kernel
   * swaps to the device this server serves.
   */
  bool keep_memory;
};

/* The defaults of the two bounds above. */
#define PDIO_SERVER_MAX_CONNECTIONS 64
#define PDIO_SERVER_HANDSHAKE_SECS 30

/* A listening socket, the fd or -errno with the reason logged through
 * log.  A unix socket at path (a stale socket file there is replaced),
 * created with mode 0600 whatever the umask, then given mode (0: 0600)
 * and group gid ((gid_t) -1: the creator's).  TCP on port at the address
 * addr (a name or a numeric IPv4 or IPv6 address; "::" is every IPv6 and
 * IPv4 address), or on the loopback address 127.0.0.1 if addr is NULL.
 */
extern int pdio_server_listen_unix (const char *path, mode_t mode, gid_t gid,
                                    const struct pdio_log *log);
extern int pdio_server_listen_tcp (const char *addr, const char *port,
                                   const struct pdio_log *log);
/* Is the TCP socket fd bound to a loopback address only (127.0.0.0/8,
 * ::1, or IPv4-mapped 127.0.0.0/8)?
 */
extern bool pdio_server_is_loopback (int fd);

/* With cfg->take_over, first starts every worker, with its ring and
 * pool, and only then asks the old server for its connections: what
 * they wait for is the hand-over itself, not this server's start.
 *
 * Serves on listen_fd until one of stop_signals arrives (the caller
 * blocks them in every thread first, so they queue for this call): then
 * it stops accepting and reading requests, finishes and answers every
 * request in flight, closes the connections and returns 0.
 *
 * Or until a successor says hello on cfg->handover_fd: then it stops
 * reading requests, answers every request it started, lets go of the
 * image's lock, sends the successor both listening sockets and the
 * connections (handover_send), and returns PDIO_SERVER_HANDED_OVER with
 * *handed holding the successor's socket, for handover_wait_ack, and
 * what was sent, to be closed with handover_free (-EPIPE if the sending
 * failed: the connections are lost).
 *
 * -errno if the workers could not start, or the take-over failed (the
 * reason logged).  ready(), if set, runs once the workers are up (and
 * have the connections taken over).
 */
#define PDIO_SERVER_HANDED_OVER 1
extern int pdio_server_run (const struct pdio_server_config *cfg,
                            int listen_fd, const sigset_t *stop_signals,
                            void (*ready) (void *opaque), void *opaque,
                            struct handover *handed);

#endif /* PDIO_SERVER_SERVER_H */
