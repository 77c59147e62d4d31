/* The server as a whole: the listening socket, the workers, the accept
 * loop that hands each new connection to the next worker in turn, and
 * the orderly stop on a signal (stop accepting, let every worker finish
 * the requests it has, join them).
 */
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "internal.h"


int
pdio_server_listen_unix (const char *path, const struct pdio_log *log)
{
  struct sockaddr_un sa = { .sun_family = AF_UNIX };
  struct stat st;
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
  if (fd == -1 || bind (fd, (struct sockaddr *) &sa, sizeof sa) == -1 ||
      listen (fd, SOMAXCONN) == -1) {
    err = -errno;
    pdio_log_msg (log->error, "%s: cannot listen: %s", path, strerror (-err));
    if (fd >= 0)
      close (fd);
    return err;
  }
  return fd;
}

int
pdio_server_listen_tcp (const char *port, const struct pdio_log *log)
{
  const struct addrinfo hints = {
    .ai_family = AF_INET6, .ai_socktype = SOCK_STREAM,
    .ai_flags = AI_PASSIVE | AI_NUMERICSERV,
  };
  struct addrinfo *ai = NULL;
  const int on = 1, off = 0;
  int fd = -1, err, r;

  /* One IPv6 socket that also takes IPv4; IPv4 alone if there is no v6. */
  r = getaddrinfo (NULL, port, &hints, &ai);
  if (r == 0)
    fd = socket (AF_INET6, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd >= 0) {
    setsockopt (fd, IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof off);
    setsockopt (fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
    if (bind (fd, ai->ai_addr, ai->ai_addrlen) == -1) {
      close (fd);
      fd = -1;
    }
  }
  if (ai)
    freeaddrinfo (ai);
  if (fd == -1) {
    struct sockaddr_in sin = { .sin_family = AF_INET };
    char *end;
    unsigned long p = strtoul (port, &end, 10);

    if (*end || p == 0 || p > 65535) {
      pdio_log_msg (log->error, "port %s: not a port number", port);
      return -EINVAL;
    }
    sin.sin_port = htons (p);
    fd = socket (AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd >= 0) {
      setsockopt (fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
      if (bind (fd, (struct sockaddr *) &sin, sizeof sin) == -1) {
        err = -errno;
        close (fd);
        pdio_log_msg (log->error, "port %s: cannot bind: %s", port, strerror (-err));
        return err;
      }
    }
  }
  if (fd == -1 || listen (fd, SOMAXCONN) == -1) {
    err = -errno;
    pdio_log_msg (log->error, "port %s: cannot listen: %s", port, strerror (-err));
    if (fd >= 0)
      close (fd);
    return err;
  }
  return fd;
}

/* Accepts until a stop signal; false if the signals cannot be waited on. */
static void
accept_loop (const struct server_ctx *ctx, int listen_fd, int sig_fd,
             struct worker *workers, unsigned n)
{
  unsigned next = 0;

  for (;;) {
    struct pollfd p[2] = {
      { .fd = sig_fd, .events = POLLIN }, { .fd = listen_fd, .events = POLLIN },
    };
    int fd;

    if (poll (p, 2, -1) == -1) {
      if (errno == EINTR)
        continue;
      pdio_log_msg (ctx->log.error, "poll: %s: stopping", strerror (errno));
      return;
    }
    if (p[0].revents) {
      struct signalfd_siginfo si;

      if (read (sig_fd, &si, sizeof si) == sizeof si)
        pdio_log_msg (ctx->log.debug, "signal %u: stopping", si.ssi_signo);
      return;
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
    {
      const int on = 1;

      /* Replies are whole messages: do not hold them back (TCP only; a
       * unix socket refuses the option, which is fine).
       */
      setsockopt (fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof on);
    }
    worker_hand_over (&workers[next], fd);
    next = (next + 1) % n;
  }
}

int
pdio_server_run (const struct pdio_server_config *cfg, int listen_fd,
                 const sigset_t *stop_signals, void (*ready) (void *opaque),
                 void *opaque)
{
  struct server_ctx ctx = { .img = cfg->img, .log = cfg->log,
                            .pool_bytes = cfg->pool_bytes };
  struct pdio_info info;
  struct worker *workers;
  unsigned n = cfg->threads;
  int sig_fd, err = 0;

  pdio_get_info (cfg->img, &info);
  ctx.export = (struct nbd_export) {
    .size = info.size, .readonly = info.readonly,
    .block_min = info.block_min, .block_preferred = info.block_preferred,
    .block_max = info.block_max < NBD_MAX_PAYLOAD ? info.block_max
                                                  : NBD_MAX_PAYLOAD,
    .description = cfg->description,
  };
  ctx.can_extents = info.can_extents;
  if (n == 0) {
    long cpus = sysconf (_SC_NPROCESSORS_ONLN);

    n = cpus > 0 ? cpus : 1;
  }
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
      for (unsigned j = 0; j < i; j++)
        worker_request_stop (&workers[j]);
      for (unsigned j = 0; j < i; j++)
        worker_join (&workers[j]);
      free (workers);
      close (sig_fd);
      return err;
    }
  }
  pdio_log_msg (cfg->log.debug, "serving with %u worker threads", n);
  if (ready)
    ready (opaque);

  accept_loop (&ctx, listen_fd, sig_fd, workers, n);

  /* Refuse new connections at once, then let the workers drain. */
  close (listen_fd);
  for (unsigned i = 0; i < n; i++)
    worker_request_stop (&workers[i]);
  for (unsigned i = 0; i < n; i++)
    worker_join (&workers[i]);
  free (workers);
  close (sig_fd);
  return 0;
}
