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
#include <sys/types.h>

#include "tls.h"

#include "engine.h"

struct pdio_server_config {
  struct pdio_image *img;       /* opened by the caller, closed by it */
  unsigned threads;             /* workers; 0: one per online CPU */
  size_t pool_bytes;            /* each worker's buffer pool; 0: default */
  const char *description;      /* NBD_INFO_DESCRIPTION, or NULL */
  struct pdio_log log;          /* error, warning, debug: any may be NULL */
  unsigned max_connections;     /* more are accepted and closed; 0: default */
  unsigned handshake_secs;      /* to finish the handshake; 0: default */
  const struct pdio_tls *tls;   /* NULL: no TLS (STARTTLS refused) */
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

/* Serves on listen_fd until one of stop_signals arrives (the caller
 * blocks them in every thread first, so they queue for this call): then
 * it stops accepting and reading requests, finishes and answers every
 * request in flight, closes the connections and returns 0.  -errno if the
 * workers could not start.  ready(), if set, runs once the workers are up.
 */
extern int pdio_server_run (const struct pdio_server_config *cfg,
                            int listen_fd, const sigset_t *stop_signals,
                            void (*ready) (void *opaque), void *opaque);

#endif /* PDIO_SERVER_SERVER_H */
