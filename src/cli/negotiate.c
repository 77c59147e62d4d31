/* SPDX-License-Identifier: BSD-3-Clause */
/* The client side of the NBD handshake (the NBD project's doc/proto.md,
 * in the wire format of src/protocol/include/proto.h, which pdio's server
 * speaks too), for two uses:
 *  - the kernel takes sockets that are already in the transmission phase,
 *    so pdio negotiates them itself: NBD_OPT_GO;
 *  - attach and serve --nbdkit ask a running server what it offers:
 *    NBD_OPT_INFO, then NBD_OPT_ABORT, so the server never starts serving
 *    the connection.
 * Fixed newstyle, the default export (""), asking for NBD_INFO_BLOCK_SIZE:
 * the preferred block size is pdio's direct-I/O alignment, the kernel's
 * logical block size.  No structured replies: the kernel's client does not
 * speak them.
 */
#include <config.h>

#include <errno.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include "pdio.h"
#include "proto.h"

/* The handshake of a local server takes milliseconds; a server that
 * accepts and then says nothing must not hang attach or the supervisor.
 */
#define HANDSHAKE_TIMEOUT_S 10

/* A socket, and the TLS session on it once NBD_OPT_STARTTLS is done. */
struct chan {
  int fd;
  struct tls_client *tls;
};

/* Moves all n bytes through fd, reading (rx) or sending; send only
 * reads buf.
 */
static bool
transfer_fd (int fd, void *buf, size_t n, bool rx)
{
  for (char *p = buf; n; ) {
    /* A server that hangs up must not kill the supervisor with SIGPIPE. */
    ssize_t r = rx ? read (fd, p, n) : send (fd, p, n, MSG_NOSIGNAL);

    if (r == 0 && rx) {
      errno = ECONNRESET;
      return false;
    }
    if (r == -1) {
      if (errno == EINTR)
        continue;
      return false;
    }
    p += r;
    n -= r;
  }
  return true;
}

static bool
xread (const struct chan *c, void *buf, size_t n)
{
  return c->tls ? tls_client_read (c->tls, buf, n) :
    transfer_fd (c->fd, buf, n, true);
}

static bool
xwrite (const struct chan *c, const void *buf, size_t n)
{
  return c->tls ? tls_client_write (c->tls, buf, n) :
    transfer_fd (c->fd, (void *) buf, n, false);
}

static void
set_timeouts (int fd, unsigned s)
{
  struct timeval tv = { .tv_sec = s };

  setsockopt (fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt (fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

static int
connect_unix (const char *path, char *why, size_t len)
{
  struct sockaddr_un sa = { .sun_family = AF_UNIX };
  int fd;

  if (strlen (path) >= sizeof sa.sun_path) {
    snprintf (why, len, "%s: socket path too long", path);
    return -1;
  }
  strcpy (sa.sun_path, path);
  fd = socket (AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd == -1 || connect (fd, (struct sockaddr *) &sa, sizeof sa) == -1) {
    snprintf (why, len, "connect %s: %m", path);
    if (fd >= 0)
      close (fd);
    return -1;
  }
  return fd;
}

/* localhost:port, as nbd_connect_tcp did: every address localhost has,
 * in getaddrinfo's order (pdio serve --port listens on both families).
 */
static int
connect_tcp (const char *port, char *why, size_t len)
{
  const struct addrinfo hints = { .ai_socktype = SOCK_STREAM };
  struct addrinfo *ai, *a;
  int fd = -1, r;

  r = getaddrinfo ("localhost", port, &hints, &ai);
  if (r != 0) {
    snprintf (why, len, "localhost:%s: %s", port, gai_strerror (r));
    return -1;
  }
  for (a = ai; a && fd == -1; a = a->ai_next) {
    fd = socket (a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd >= 0 && connect (fd, a->ai_addr, a->ai_addrlen) == -1) {
      snprintf (why, len, "connect localhost:%s: %m", port);
      close (fd);
      fd = -1;
    }
    else if (fd == -1)
      snprintf (why, len, "socket: %m");
  }
  freeaddrinfo (ai);
  return fd;
}

static bool
send_option (const struct chan *c, uint32_t opt, const void *data,
             uint32_t n)
{
  uint8_t h[NBD_OPTION_HEADER_LEN];

  nbd_option_header (h, opt, n);
  return xwrite (c, h, sizeof h) && (n == 0 || xwrite (c, data, n));
}

static const char *
option_name (uint32_t opt)
{
  return opt == NBD_OPT_GO ? "NBD_OPT_GO" : "NBD_OPT_INFO";
}

/* Reads the replies to NBD_OPT_GO or NBD_OPT_INFO until NBD_REP_ACK,
 * filling o; a reply longer than max is refused (a name or description
 * takes up to 4 KiB; block sizes 14 bytes).
 */
static bool
read_info_replies (const struct chan *c, uint32_t want, size_t max, struct nbd_offer *o,
                   char *why, size_t len)
{
  const char *name = option_name (want);
  bool have_export = false;

  for (;;) {
    uint8_t r[NBD_OPTION_REPLY_LEN], data[4 + 4096 + 64];
    uint32_t opt, type, n;
    struct nbd_info info;

    if (!xread (c, r, sizeof r)) {
      snprintf (why, len, "reading the reply to %s: %m", name);
      return false;
    }
    if (!nbd_parse_option_reply (r, &opt, &type, &n)) {
      snprintf (why, len, "bad reply to %s: not an option reply", name);
      return false;
    }
    if (opt != want || n > max || n > sizeof data) {
      snprintf (why, len, "bad reply to %s (option %u, length %u)", name,
                opt, n);
      return false;
    }
    if (!xread (c, data, n)) {
      snprintf (why, len, "reading the reply to %s: %m", name);
      return false;
    }
    if (type == NBD_REP_ERR_TLS_REQD) {
      snprintf (why, len, "the server requires TLS (NBD_REP_ERR_TLS_REQD): "
                "attach nbds://... with its credentials");
      return false;
    }
    if (type & NBD_REP_ERR_BIT) {
      snprintf (why, len, "the server refused %s (error %#x)%s%.*s",
                name, type, n ? ": " : "", (int) n, (char *) data);
      return false;
    }
    if (type == NBD_REP_ACK) {
      if (!have_export)
        snprintf (why, len, "the server sent no NBD_INFO_EXPORT");
      return have_export;
    }
    if (type != NBD_REP_INFO)
      continue;                 /* other replies may be ignored */
    if (!nbd_parse_info (data, n, &info)) {
      snprintf (why, len, "bad reply to %s: a malformed NBD_REP_INFO "
                "(%u bytes)", name, n);
      return false;
    }
    switch (info.type) {
    case NBD_INFO_EXPORT:
      o->size = info.size;
      o->eflags = info.eflags;
      have_export = true;
      break;
    case NBD_INFO_BLOCK_SIZE:
      o->block_min = info.block_min;
      o->block_preferred = info.block_preferred;
      o->block_max = info.block_max;
      break;
    case NBD_INFO_NAME:
    case NBD_INFO_DESCRIPTION: {
      char *to = info.type == NBD_INFO_NAME ? o->name : o->description;
      size_t cut = info.string_len < NBD_OFFER_STRING - 1
        ? info.string_len : NBD_OFFER_STRING - 1;

      memcpy (to, info.string, cut);
      to[cut] = '\0';
      if (info.type == NBD_INFO_NAME)
        o->has_name = true;
      else
        o->has_description = true;
      break;
    }
    }
  }
}

/* NBD_OPT_STARTTLS, then the TLS handshake with u's credentials: the
 * rest of the handshake runs in c->tls.
 */
static bool
start_tls (struct chan *c, const struct nbd_uri *u, char *why, size_t len)
{
  uint8_t r[NBD_OPTION_REPLY_LEN], data[256];
  uint32_t opt, type, n;

  if (!send_option (c, NBD_OPT_STARTTLS, NULL, 0)) {
    snprintf (why, len, "sending NBD_OPT_STARTTLS: %m");
    return false;
  }
  if (!xread (c, r, sizeof r)) {
    snprintf (why, len, "reading the reply to NBD_OPT_STARTTLS: %m");
    return false;
  }
  if (!nbd_parse_option_reply (r, &opt, &type, &n) ||
      opt != NBD_OPT_STARTTLS || n > sizeof data) {
    snprintf (why, len, "bad reply to NBD_OPT_STARTTLS");
    return false;
  }
  if (!xread (c, data, n)) {
    snprintf (why, len, "reading the reply to NBD_OPT_STARTTLS: %m");
    return false;
  }
  if (type != NBD_REP_ACK || test_break ("no-starttls")) {
    snprintf (why, len, "the server does not offer TLS: it answered "
              "NBD_OPT_STARTTLS with %s%s%.*s (attach nbd://... if it "
              "serves in clear)",
              type == NBD_REP_ERR_UNSUP ? "NBD_REP_ERR_UNSUP"
              : type == NBD_REP_ERR_POLICY ? "NBD_REP_ERR_POLICY"
              : type == NBD_REP_ACK ? "NBD_REP_ACK (refused by a test break)"
              : "an error", n ? ": " : "", (int) n, (char *) data);
    return false;
  }
  c->tls = tls_client_new (u, c->fd, why, len);
  return c->tls && tls_client_handshake (c->tls, u, why, len);
}

/* The greeting, then opt (NBD_OPT_GO or NBD_OPT_INFO) for the export
 * named export (NULL: the default one, asking for the block sizes only;
 * else its name and description too, which identify a remote export),
 * with its replies; where names the server in messages.  With tls (an
 * nbds:// URI), inside a TLS session begun first: a NewSessionTicket the
 * server sends after its handshake is read (and dropped) by GnuTLS on
 * the way to the replies.
 */
static bool
negotiate (struct chan *c, const char *where, uint32_t opt,
           const char *export, const struct nbd_uri *tls,
           struct nbd_offer *o, char *why, size_t len)
{
  static const uint16_t want[] = {
    NBD_INFO_BLOCK_SIZE, NBD_INFO_NAME, NBD_INFO_DESCRIPTION,
  };
  uint16_t nwant = export ? 3 : 1;
  size_t elen = export ? strlen (export) : 0;
  uint8_t hello[NBD_GREETING_LEN], cflags[NBD_CLIENT_FLAGS_LEN];
  uint8_t info[NBD_INFO_REQUEST_LEN (4096, 3)];
  uint16_t sflags;
  size_t n;
  char reason[1024];

  *o = (struct nbd_offer) { .size = 0 };
  if (elen > 4096) {
    snprintf (why, len, "%s: an export name of more than 4096 bytes", where);
    return false;
  }
  if (!xread (c, hello, sizeof hello)) {
    snprintf (why, len, "%s: reading the server's greeting: %m", where);
    return false;
  }
  if (!nbd_parse_greeting (hello, &sflags) ||
      !(sflags & NBD_FLAG_FIXED_NEWSTYLE)) {
    snprintf (why, len, "%s: not a fixed-newstyle NBD server", where);
    return false;
  }
  nbd_client_flags (cflags, NBD_FLAG_C_FIXED_NEWSTYLE |
                    (sflags & NBD_FLAG_NO_ZEROES ? NBD_FLAG_C_NO_ZEROES : 0));
  if (!xwrite (c, cflags, sizeof cflags)) {
    snprintf (why, len, "%s: sending the client flags: %m", where);
    return false;
  }
  if (tls && !start_tls (c, tls, reason, sizeof reason)) {
    snprintf (why, len, "%s: %s", where, reason);
    return false;
  }
  n = nbd_info_request (info, export ? export : "", elen, want, nwant);
  if (!send_option (c, opt, info, n)) {
    snprintf (why, len, "%s: sending %s: %m", where, option_name (opt));
    return false;
  }
  if (!read_info_replies (c, opt, export ? 4 + 4096 + 64 : 1024, o, reason,
                          sizeof reason)) {
    snprintf (why, len, "%s: %s", where, reason);
    return false;
  }
  return true;
}

int
nbd_handshake (const char *socket, struct nbd_offer *o, char *why,
               size_t len)
{
  int fd = connect_unix (socket, why, len);
  struct chan c = { .fd = fd };

  if (fd == -1)
    return -1;
  set_timeouts (fd, HANDSHAKE_TIMEOUT_S);
  if (!negotiate (&c, socket, NBD_OPT_GO, NULL, NULL, o, why, len)) {
    close (fd);
    return -1;
  }
  /* The kernel reads and writes this socket with its own timeouts. */
  set_timeouts (fd, 0);
  return fd;
}

bool
nbd_query (const char *socket, const char *port, struct nbd_offer *o,
           char *why, size_t len)
{
  char where[PATH_MAX + 16];
  int fd = socket ? connect_unix (socket, why, len)
                  : connect_tcp (port, why, len);
  struct chan c = { .fd = fd };
  bool ok;

  if (fd == -1)
    return false;
  if (socket)
    snprintf (where, sizeof where, "%s", socket);
  else
    snprintf (where, sizeof where, "localhost:%s", port);
  set_timeouts (fd, HANDSHAKE_TIMEOUT_S);
  ok = negotiate (&c, where, NBD_OPT_INFO, NULL, NULL, o, why, len);
  if (ok) {
    uint8_t ack[NBD_OPTION_REPLY_LEN];

    /* Waiting for the server's ACK lets it close first: it never writes
     * to a socket we already closed, so it has nothing to complain of.
     */
    if (send_option (&c, NBD_OPT_ABORT, NULL, 0))
      (void) xread (&c, ack, sizeof ack);
  }
  close (fd);
  return ok;
}

bool
nbd_handshake_n (const char *socket, unsigned n, int *fds,
                 struct nbd_offer *o, char *why, size_t len)
{
  struct nbd_offer other;

  for (unsigned i = 0; i < n; i++) {
    fds[i] = nbd_handshake (socket, i ? &other : o, why, len);
    if (fds[i] >= 0 && i &&
        (other.size != o->size || other.eflags != o->eflags)) {
      snprintf (why, len, "%s: connections disagree on size or flags",
                socket);
      close (fds[i]);
      fds[i] = -1;
    }
    if (fds[i] == -1) {
      while (i--)
        close (fds[i]);
      return false;
    }
  }
  return true;
}

/* host:port within ms: every address the name has, in getaddrinfo's
 * order, each given what is left of the time.  A peer that is down (the
 * link cut, no RST) must not hold the supervisor longer than that.
 */
static int
connect_host (const char *host, const char *port, unsigned ms, char *why,
              size_t len)
{
  const struct addrinfo hints = { .ai_socktype = SOCK_STREAM };
  struct addrinfo *ai, *a;
  int fd = -1, r;

  r = getaddrinfo (host, port, &hints, &ai);
  if (r != 0) {
    snprintf (why, len, "%s:%s: %s", host, port, gai_strerror (r));
    return -1;
  }
  for (a = ai; a && fd == -1; a = a->ai_next) {
    struct pollfd p;
    int err = 0;
    socklen_t elen = sizeof err;

    fd = socket (a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK,
                 a->ai_protocol);
    if (fd == -1) {
      snprintf (why, len, "socket: %m");
      continue;
    }
    if (connect (fd, a->ai_addr, a->ai_addrlen) == -1) {
      if (errno != EINPROGRESS)
        err = errno;
      else {
        p = (struct pollfd) { .fd = fd, .events = POLLOUT };
        r = poll (&p, 1, ms);
        if (r == 0)
          err = ETIMEDOUT;
        else if (r == -1)
          err = errno;
        else
          getsockopt (fd, SOL_SOCKET, SO_ERROR, &err, &elen);
      }
    }
    if (err) {
      snprintf (why, len, "connect %s:%s: %s", host, port, strerror (err));
      close (fd);
      fd = -1;
    }
  }
  freeaddrinfo (ai);
  if (fd >= 0) {
    int one = 1;

    fcntl (fd, F_SETFL, fcntl (fd, F_GETFL) & ~O_NONBLOCK);
    /* As nbd-client: requests go out at once, and the kernel's keepalive
     * notices a peer that vanished while the device is idle.
     */
    setsockopt (fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt (fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
  }
  return fd;
}

int
nbd_handshake_uri (const struct nbd_uri *u, unsigned connect_ms,
                   struct nbd_offer *o, struct tls_client **tls, char *why,
                   size_t len)
{
  char where[sizeof u->host + 16];
  struct chan c;

  if (tls)
    *tls = NULL;
  if (u->tls && tls == NULL) {
    snprintf (why, len, "TLS is not spoken here");
    return -1;
  }
  if (u->unix_socket) {
    c.fd = connect_unix (u->socket, why, len);
    snprintf (where, sizeof where, "%.*s", (int) sizeof where - 1,
              u->socket);
  }
  else {
    c.fd = connect_host (u->host, u->port, connect_ms, why, len);
    snprintf (where, sizeof where, strchr (u->host, ':') ? "[%s]:%s"
                                                         : "%s:%s",
              u->host, u->port);
  }
  c.tls = NULL;
  if (c.fd == -1)
    return -1;
  set_timeouts (c.fd, HANDSHAKE_TIMEOUT_S);
  if (!negotiate (&c, where, NBD_OPT_GO, u->export_name, u->tls ? u : NULL,
                  o, why, len)) {
    tls_client_free (c.tls);
    close (c.fd);
    return -1;
  }
  set_timeouts (c.fd, 0);
  if (tls)
    *tls = c.tls;
  return c.fd;
}
