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
  /* The device's counters (below): the file they are kept in,
   * created if need be, or NULL to count nothing.
   */
  const char *stats_path;
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

/* --- a device's counters (devstats.c) ---------------------------------- */
/* What pdio serve --stats FILE keeps: the one layout that the server
 * writes, the supervisor adds its restarts to and pdio stats reads.  The file is small, in the run directory (a tmpfs),
 * mapped MAP_SHARED by all of them, so the counters outlive any server
 * that wrote them (a restart, a crash, a hand-over) and reading them asks
 * no process anything.
 *
 * Each worker thread owns one slot and is its only writer: an update is a
 * few relaxed 64-bit stores into memory that thread alone touches, no
 * system call, no lock, no cache line shared with another writer.  A
 * reader sums the slots.  The header's counters have one writer too (the
 * supervisor), except server_starts, which each server adds to under the
 * file's flock when it maps it.
 *
 * A reader checks magic, version and the sizes before anything else, and
 * refuses a layout it was not built for.  Any change to the layout bumps
 * the version.
 */
/* The file starts "PDIOSTA1" (a little-endian machine's bytes). */
#define PDIO_DEVSTATS_MAGIC UINT64_C (0x314154534f494450)
#define PDIO_DEVSTATS_VERSION 1

/* The operations counted apart.  NBD_CMD_CACHE and commands the server
 * does not know are refused, and counted as "other".
 */
enum pdio_devstats_opk {
  PDIO_OPK_READ, PDIO_OPK_WRITE, PDIO_OPK_FLUSH, PDIO_OPK_TRIM,
  PDIO_OPK_ZERO, PDIO_OPK_BLOCK_STATUS, PDIO_OPK_OTHER,
  PDIO_DEVSTATS_OPS
};

/* The errnos an NBD reply can carry (the spec's list), and the rest. */
enum pdio_devstats_err {
  PDIO_ERRK_EPERM, PDIO_ERRK_EIO, PDIO_ERRK_ENOMEM, PDIO_ERRK_EINVAL,
  PDIO_ERRK_ENOSPC, PDIO_ERRK_EOVERFLOW, PDIO_ERRK_ENOTSUP,
  PDIO_ERRK_ESHUTDOWN, PDIO_ERRK_OTHER,
  PDIO_DEVSTATS_ERRS
};

/* The latency histogram: four buckets per power of two from 1 us.  Bucket
 * i < PDIO_DEVSTATS_FINITE counts latencies up to 1 us * 2^(i/4) (bucket
 * 0 everything up to 1 us); the last finite bound, 2^26 us = 67.1 s, is
 * past 60 s, and the one bucket after it counts the rest.  Neighbouring
 * bounds are 19 % apart, so a percentile read from the buckets is within
 * 19 % of the true one.
 */
#define PDIO_DEVSTATS_FINITE 105
#define PDIO_DEVSTATS_BUCKETS (PDIO_DEVSTATS_FINITE + 1)

/* One operation's counters in one slot.  A request counts once its reply
 * is sent: requests, then bytes (of a request that succeeded: its length,
 * as the client asked; 0 for a flush) or errors[], latency_sum_ns and one
 * bucket.  started and finished count every request from its header to
 * its reply sent, or to its end without a reply (dropped: the connection
 * died first, or the server that started it was killed); in flight =
 * started - finished.  max_in_flight is the most this slot's worker held
 * at once.
 */
struct pdio_devstats_op {
  uint64_t requests;
  uint64_t bytes;
  uint64_t errors[PDIO_DEVSTATS_ERRS];
  uint64_t started, finished, dropped;
  uint64_t max_in_flight;
  uint64_t latency_sum_ns;
  uint64_t buckets[PDIO_DEVSTATS_BUCKETS];
};

struct pdio_devstats_slot {
  _Alignas (64) struct pdio_devstats_op op[PDIO_DEVSTATS_OPS];
};

/* The file: this header, then n_slots slots at header_size. */
struct pdio_devstats {
  _Alignas (64) uint64_t magic;
  uint32_t version;
  uint32_t header_size, slot_size;
  uint32_t n_ops, n_errs, n_buckets;
  uint32_t n_slots;             /* grows (never shrinks) with the workers */
  uint32_t reserved;
  uint64_t created;             /* CLOCK_REALTIME ns */
  uint64_t server_starts;       /* servers that mapped the file */
  /* The supervisor's: server deaths it brought back from (a crash, a hang,
   * pdio restart without a hand-over), hand-overs (pdio restart), fresh
   * connections to a server that lives, and the longest and last time the
   * device waited for a server: from the death to the new server's
   * connections handed to the kernel.
   */
  uint64_t restarts;
  uint64_t handovers;
  uint64_t reconnects;
  uint64_t longest_pause_ns;
  uint64_t last_pause_ns;
};

/* Bound of bucket i < PDIO_DEVSTATS_FINITE, in ns: 1000 * 2^(i/4). */
static inline uint64_t
pdio_devstats_le_ns (unsigned i)
{
  /* 2^(j/4) in 20-bit fixed point. */
  static const uint64_t frac[4] = { 1048576, 1246974, 1482910, 1763488 };

  return ((UINT64_C (1000) << (i / 4)) * frac[i % 4] + (1 << 19)) >> 20;
}

/* The bucket a latency of ns falls in. */
static inline unsigned
pdio_devstats_bucket (uint64_t ns)
{
  uint64_t us = ns / 1000;
  unsigned i;

  if (ns <= 1000)
    return 0;
  /* From the power of two below: at most four steps. */
  i = 4 * (63 - __builtin_clzll (us));
  if (i >= PDIO_DEVSTATS_FINITE)
    return PDIO_DEVSTATS_FINITE;
  while (i < PDIO_DEVSTATS_FINITE && ns > pdio_devstats_le_ns (i))
    i++;
  return i;
}

/* A mapped file. */
struct pdio_devstats_map {
  int fd;
  struct pdio_devstats *h;
  size_t len;
};

/* Opens (creating it if need be, mode 0644) and maps the file at path for
 * writing, with at least n_slots slots: 0, or -errno with the reason
 * logged through log's error.  A server passes its worker count and
 * counts itself in server_starts; with fresh set (a server that takes
 * over from none: any earlier one is dead) the requests left in flight
 * are counted as dropped.  The supervisor passes 0 slots.
 */
extern int pdio_devstats_open (const char *path, unsigned n_slots,
                               bool server, bool fresh,
                               const struct pdio_log *log,
                               struct pdio_devstats_map *m);
/* Read only, for pdio stats: 0, or -errno with why set (the layout is
 * refused with -EPROTO).
 */
extern int pdio_devstats_open_ro (const char *path,
                                  struct pdio_devstats_map *m,
                                  char *why, size_t len);
extern void pdio_devstats_close (struct pdio_devstats_map *m);
/* The slots, summed (max_in_flight: the largest of them). */
extern void pdio_devstats_sum (const struct pdio_devstats_map *m,
                               struct pdio_devstats_op out[PDIO_DEVSTATS_OPS]);
/* One of the header's counters, read or written by its single writer. */
static inline uint64_t
pdio_devstats_get (const uint64_t *p)
{
  return __atomic_load_n (p, __ATOMIC_RELAXED);
}
static inline void
pdio_devstats_set (uint64_t *p, uint64_t v)
{
  __atomic_store_n (p, v, __ATOMIC_RELAXED);
}

#endif /* PDIO_SERVER_SERVER_H */
