/* SPDX-License-Identifier: BSD-3-Clause */
/* The server as a whole: the listening socket, the workers, the accept
 * loop that hands each new connection to the next worker in turn, and
 * the two ends: the orderly stop on a signal (stop accepting, let every
 * worker finish the requests it has, join them), and the hand-over to a
 * successor that connected to the hand-over socket (stop accepting, let
 * every worker finish what it started and give up its connections, join
 * them, and return them for handover_send).  A server that takes over
 * starts with its predecessor's connections spread over its workers.
 */
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "internal.h"


int
pdio_server_listen_unix (const char *path, mode_t mode, gid_t gid,
                         const struct pdio_log *log)
{
  struct sockaddr_un sa = { .sun_family = AF_UNIX };
  struct stat st;
  mode_t old_umask;
  int fd, err;

  if (strlen (path) >= sizeof sa.sun_path) {
    pdio_log_msg (log->error, "%s: socket path too long (at most %zu bytes)",
             path, sizeof sa.sun_path - 1);
    return -ENAMETOOLONG;
  }
  strcpy (sa.sun_path, path);
  /* A socket left by a server that died is in the way; anything else at
   * that path is not ours to remove.
   */
  if (lstat (path, &st) == 0 && S_ISSOCK (st.st_mode))
    unlink (path);
  fd = socket (AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd == -1) {
    err = -errno;
    pdio_log_msg (log->error, "%s: socket: %s", path, strerror (-err));
    return err;
  }
  /* Whoever can connect can read and write the image: the socket is born
   * 0600 whatever the caller's umask (bind applies it), and is only
   * widened on request.  One thread runs here, so the umask can be
   * borrowed.
   */
  old_umask = umask (0177);
  err = bind (fd, (struct sockaddr *) &sa, sizeof sa) == -1 ? -errno : 0;
  umask (old_umask);
  if (err) {
    pdio_log_msg (log->error, "%s: cannot listen: %s", path, strerror (-err));
    close (fd);
    return err;
  }
  if ((gid != (gid_t) -1 && chown (path, (uid_t) -1, gid) == -1) ||
      (mode && chmod (path, mode) == -1)) {
    err = -errno;
    pdio_log_msg (log->error, "%s: cannot set the socket's %s: %s", path,
                  gid != (gid_t) -1 ? "group or mode" : "mode",
                  strerror (-err));
    unlink (path);
    close (fd);
    return err;
  }
  if (listen (fd, SOMAXCONN) == -1) {
    err = -errno;
    pdio_log_msg (log->error, "%s: cannot listen: %s", path, strerror (-err));
    unlink (path);
    close (fd);
    return err;
  }
  return fd;
}

int
pdio_server_listen_tcp (const char *addr, const char *port,
                        const struct pdio_log *log)
{
  const struct addrinfo hints = {
    .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
    .ai_flags = AI_PASSIVE | AI_NUMERICSERV,
  };
  struct addrinfo *ai = NULL, *a;
  const int on = 1, off = 0;
  int fd = -1, err = -EADDRNOTAVAIL, r;

  /* Loopback unless told otherwise: an NBD export is the whole image,
   * readable and writable by whoever connects.
   */
  if (addr == NULL)
    addr = "127.0.0.1";
  r = getaddrinfo (addr, port, &hints, &ai);
  if (r != 0) {
    pdio_log_msg (log->error, "%s port %s: %s", addr, port,
                  r == EAI_SYSTEM ? strerror (errno) : gai_strerror (r));
    return -EINVAL;
  }
  /* The first address that binds. */
  for (a = ai; a && fd == -1; a = a->ai_next) {
    fd = socket (a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK,
                 a->ai_protocol);
    if (fd == -1) {
      err = -errno;
      continue;
    }
    /* "::" takes IPv4 too. */
    if (a->ai_family == AF_INET6)
      setsockopt (fd, IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof off);
    setsockopt (fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
    if (bind (fd, a->ai_addr, a->ai_addrlen) == -1 ||
        listen (fd, SOMAXCONN) == -1) {
      err = -errno;
      close (fd);
      fd = -1;
    }
  }
  freeaddrinfo (ai);
  if (fd == -1) {
    pdio_log_msg (log->error, "%s port %s: cannot listen: %s", addr, port,
                  strerror (-err));
    return err;
  }
  return fd;
}

bool
pdio_server_is_loopback (int fd)
{
  struct sockaddr_storage ss;
  socklen_t len = sizeof ss;

  if (getsockname (fd, (struct sockaddr *) &ss, &len) == -1)
    return false;
  if (ss.ss_family == AF_INET) {
    const struct sockaddr_in *sin = (const struct sockaddr_in *) &ss;

    return (ntohl (sin->sin_addr.s_addr) >> 24) == 127;
  }
  if (ss.ss_family == AF_INET6) {
    const struct in6_addr *a = &((const struct sockaddr_in6 *) &ss)->sin6_addr;

    return IN6_IS_ADDR_LOOPBACK (a) ||
           (IN6_IS_ADDR_V4MAPPED (a) && a->s6_addr[12] == 127);
  }
  return ss.ss_family == AF_UNIX;
}

void
server_conn_closed (const struct server_ctx *ctx)
{
  atomic_fetch_sub (ctx->live, 1);
}

/* Accepts until a stop signal (-1) or a successor's hello on handover_fd
 * (its socket).
 */
static int
accept_loop (const struct server_ctx *ctx, int listen_fd, int handover_fd,
             int sig_fd, struct worker *workers, unsigned n, pid_t *peer)
{
  unsigned next = 0;
  bool warned = false;

  for (;;) {
    struct pollfd p[3] = {
      { .fd = sig_fd, .events = POLLIN }, { .fd = listen_fd, .events = POLLIN },
      { .fd = handover_fd, .events = POLLIN },
    };
    int fd;

    if (poll (p, 3, -1) == -1) {
      if (errno == EINTR)
        continue;
      pdio_log_msg (ctx->log.error, "poll: %s: stopping", strerror (errno));
      return -1;
    }
    if (p[0].revents) {
      struct signalfd_siginfo si;

      if (read (sig_fd, &si, sizeof si) == sizeof si)
        pdio_log_msg (ctx->log.debug, "signal %u: stopping", si.ssi_signo);
      return -1;
    }
    if (p[2].revents) {
      /* Blocks for the hello, bounded: a successor sends it at once. */
      fd = handover_accept (handover_fd, &ctx->log, peer);
      if (fd >= 0)
        return fd;
    }
    if (!p[1].revents)
      continue;
    fd = accept4 (listen_fd, NULL, NULL, SOCK_CLOEXEC);
    if (fd == -1) {
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS ||
          errno == ENOMEM) {
        /* Out of descriptors: back off instead of spinning on poll. */
        pdio_log_msg (ctx->log.warning, "accept: %s", strerror (errno));
        usleep (50000);
      }
      continue;                 /* EAGAIN, ECONNABORTED, EINTR...: next */
    }
    if (atomic_load (ctx->live) >= ctx->max_connections) {
      /* Closed before the greeting: a client sees the connection end
       * at once rather than hang, and nothing of the export is touched.
       */
      if (!warned)
        pdio_log_msg (ctx->log.warning, "a connection refused: %u are open "
                      "(--max-connections); later refusals are not logged",
                      ctx->max_connections);
      warned = true;
      close (fd);
      continue;
    }
    atomic_fetch_add (ctx->live, 1);
    {
      const int on = 1;

      /* Replies are whole messages: do not hold them back (TCP only; a
       * unix socket refuses the option, which is fine).
       */
      setsockopt (fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof on);
    }
    {
      uint64_t size;

      /* A new connection is offered the image's size as it is now, read
       * afresh: after the image grows, the next connection sees it, and
       * that is how pdio resize gets the server to serve the new size
       * (and learns that it does) without a channel of its own.  Here,
       * not on the worker, whose ring the fstat would hold up.
       */
      if (pdio_refresh_size (ctx->img, &size) < 0)
        pdio_log_msg (ctx->log.debug, "cannot read the image's size (%s): "
                      "offering %" PRIu64, strerror (errno),
                      pdio_size (ctx->img));
    }
    worker_hand_over (&workers[next], fd);
    next = (next + 1) % n;
  }
}

/* The predecessor's connections must be ones this server can serve: the
 * same export, with the flags they negotiated.
 */
static bool
can_adopt (const struct server_ctx *ctx, const struct handover *ho)
{
  for (size_t i = 0; i < ho->n; i++) {
    const struct nbd_session *s = &ho->conns[i].s;
    uint16_t eflags = nbd_export_flags (&ctx->export, s->structured);

    if (s->size != ctx->export.size || s->eflags != eflags ||
        s->block_max > ctx->export.block_max ||
        (s->meta_base_allocation && !ctx->can_extents)) {
      pdio_log_msg (ctx->log.error, "cannot take over: a connection "
                    "negotiated %" PRIu64 " bytes, flags 0x%x, blocks up to "
                    "%u%s; this server offers %" PRIu64 " bytes, flags 0x%x, "
                    "blocks up to %u%s", s->size, s->eflags, s->block_max,
                    s->meta_base_allocation ? ", base:allocation" : "",
                    ctx->export.size, eflags, ctx->export.block_max,
                    ctx->can_extents ? "" : ", no extents");
      return false;
    }
  }
  return true;
}

/* The listening socket taken over is the one path names. */
static bool
same_socket (int fd, const char *path)
{
  struct sockaddr_un sa;
  socklen_t len = sizeof sa;

  if (getsockname (fd, (struct sockaddr *) &sa, &len) == -1 ||
      sa.sun_family != AF_UNIX)
    return false;
  return len > offsetof (struct sockaddr_un, sun_path) &&
    strncmp (sa.sun_path, path, sizeof sa.sun_path) == 0;
}

/* The workers are up: the old server's connections and listening
 * sockets, then the image's lock, which it has let go of.  0, or -errno
 * with the reason logged (the connections are then lost, closed as if
 * the old server had died).
 */
static int
take_over (const struct pdio_server_config *cfg, const struct server_ctx *ctx,
           struct worker *workers, unsigned n, int *listen_fd,
           int *handover_fd)
{
  struct handover *ho = cfg->taken;

  if (handover_receive (cfg->take_over, ho, &ctx->log) < 0) {
    pdio_log_msg (ctx->log.error, "cannot take over from the server on %s",
                  cfg->take_over);
    return -EIO;
  }
  if (cfg->listen_path && !same_socket (ho->nbd_listen_fd, cfg->listen_path)) {
    pdio_log_msg (ctx->log.error, "cannot take over from the server on %s: "
                  "it does not listen on %s", cfg->take_over,
                  cfg->listen_path);
    goto lost;
  }
  if (pdio_lock_image (ctx->img) < 0 || !can_adopt (ctx, ho))
    goto lost;
  *listen_fd = ho->nbd_listen_fd;
  *handover_fd = ho->handover_listen_fd;
  ho->nbd_listen_fd = ho->handover_listen_fd = -1;
  pdio_log_msg (ctx->log.debug, "taking over %zu connections from pid %d",
                ho->n, (int) ho->peer);
  for (size_t i = 0; i < ho->n; i++) {
    worker_adopt (&workers[i % n], &ho->conns[i]);
    /* The worker's now; ho keeps the count for messages. */
    ho->conns[i] = (struct handover_conn) { .fd = -1 };
  }
  handover_ack (ho, &ctx->log);
  return 0;

 lost:
  pdio_log_msg (ctx->log.error, "the %zu connections taken over from pid %d "
                "are lost", ho->n, (int) ho->peer);
  handover_free (ho);
  return -EIO;
}

/* Gathers what the workers gave up, once each has ended its
 * connections (its ring may still be going).
 */
/* The end of pdio_server_run, however it ends: the n workers started
 * are told to stop (unless they are already handing over), and each is
 * waited for.
 */
static void
end_workers (struct worker *workers, unsigned n, bool stop, int sig_fd)
{
  if (stop)
    for (unsigned i = 0; i < n; i++)
      worker_request_stop (&workers[i]);
  for (unsigned i = 0; i < n; i++)
    worker_join (&workers[i]);
  free (workers);
  close (sig_fd);
}

static void
gather (struct worker *workers, unsigned n, struct handover *out)
{
  for (unsigned i = 0; i < n; i++) {
    struct handover *h = &workers[i].handed;

    worker_wait_ended (&workers[i]);
    for (size_t j = 0; j < h->n; j++)
      if (handover_add (out, &h->conns[j]))
        h->conns[j] = (struct handover_conn) { .fd = -1 };
    handover_free (h);          /* closes what could not be kept */
  }
}

static unsigned
worker_count (const struct pdio_server_config *cfg)
{
  long cpus;

  if (cfg->threads)
    return cfg->threads;
  cpus = sysconf (_SC_NPROCESSORS_ONLN);
  return cpus > 0 ? cpus : 1;
}

static int
serve (const struct pdio_server_config *cfg, struct pdio_devstats *stats,
       int listen_fd, const sigset_t *stop_signals,
       void (*ready) (void *opaque), void *opaque, struct handover *handed)
{
  atomic_uint live = 0;
  struct server_ctx ctx = {
    .img = cfg->img, .log = cfg->log, .pool_bytes = cfg->pool_bytes,
    .reserve_chunks = cfg->reserve_chunks,
    .handshake_secs = cfg->handshake_secs ? cfg->handshake_secs
                                          : PDIO_SERVER_HANDSHAKE_SECS,
    .tls = cfg->tls, .live = &live,
    .max_connections = cfg->max_connections ? cfg->max_connections
                                            : PDIO_SERVER_MAX_CONNECTIONS,
  };
  struct pdio_info info;
  struct worker *workers;
  unsigned n = worker_count (cfg);
  int sig_fd, succ, hfd = cfg->handover_fd, err = 0;
  pid_t peer = 0;

  pdio_get_info (cfg->img, &info);
  ctx.export = (struct nbd_export) {
    .size = info.size, .readonly = info.readonly,
    .block_min = info.block_min, .block_preferred = info.block_preferred,
    .block_max = info.block_max < NBD_MAX_PAYLOAD ? info.block_max
                                                  : NBD_MAX_PAYLOAD,
    .description = cfg->description,
  };
  ctx.can_extents = info.can_extents;
  ctx.rings_at_start = cfg->take_over != NULL;
  ctx.keep_memory = cfg->keep_memory;
  ctx.stats = stats;
  sig_fd = signalfd (-1, stop_signals, SFD_CLOEXEC);
  if (sig_fd == -1) {
    err = -errno;
    pdio_log_msg (cfg->log.error, "signalfd: %s", strerror (-err));
    return err;
  }
  workers = calloc (n, sizeof *workers);
  if (workers == NULL) {
    close (sig_fd);
    return -ENOMEM;
  }
  for (unsigned i = 0; i < n; i++) {
    err = worker_start (&workers[i], &ctx, i);
    if (err) {
      pdio_log_msg (cfg->log.error, "worker %u: cannot start: %s", i,
               strerror (-err));
      end_workers (workers, i, true, sig_fd);
      return err;
    }
  }
  pdio_log_msg (cfg->log.debug, "serving with %u worker threads", n);
  if (cfg->take_over &&
      (err = take_over (cfg, &ctx, workers, n, &listen_fd, &hfd)) < 0) {
    end_workers (workers, n, true, sig_fd);
    return err;
  }
  if (ready)
    ready (opaque);

  succ = accept_loop (&ctx, listen_fd, hfd, sig_fd, workers, n, &peer);
  if (succ >= 0) {
    /* The successor takes the listening sockets as they are: new clients
     * wait in their backlog meanwhile.
     */
    pdio_log_msg (cfg->log.debug, "handing over to pid %d", (int) peer);
    for (unsigned i = 0; i < n; i++)
      worker_request_hand_over (&workers[i]);
    handover_init (handed);
    gather (workers, n, handed);
    handed->sock = succ;
    handed->peer = peer;
    handed->nbd_listen_fd = listen_fd;
    handed->handover_listen_fd = hfd;
    handed->size = ctx.export.size;
    handed->readonly = ctx.export.readonly;
    /* No request runs any more: the successor may have the image while
     * the workers tear their rings down.
     */
    pdio_unlock_image (cfg->img);
    err = handover_send (handed, &cfg->log);
    end_workers (workers, n, false, sig_fd);
    return err ? -EPIPE : PDIO_SERVER_HANDED_OVER;
  }

  /* Refuse new connections at once, then let the workers drain. */
  close (listen_fd);
  if (hfd >= 0)
    close (hfd);
  end_workers (workers, n, true, sig_fd);
  return 0;
}

int
pdio_server_run (const struct pdio_server_config *cfg, int listen_fd,
                 const sigset_t *stop_signals, void (*ready) (void *opaque),
                 void *opaque, struct handover *handed)
{
  struct pdio_devstats_map m = { .fd = -1 };
  int r;

  /* A successor goes on where its predecessor was; any other server
   * starts after one that died with requests in flight, if any.
   */
  if (cfg->stats_path &&
      (r = pdio_devstats_open (cfg->stats_path, worker_count (cfg), true,
                               cfg->take_over == NULL, &cfg->log, &m)) < 0)
    return r;
  r = serve (cfg, m.h, listen_fd, stop_signals, ready, opaque, handed);
  pdio_devstats_close (&m);
  return r;
}
