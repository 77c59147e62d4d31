/* SPDX-License-Identifier: BSD-3-Clause */
/* The hand-over message between two pdio servers, and the unix socket it
 * travels on: handover.h describes the protocol.  Both ends run in their
 * server's control thread and block, each step bounded by
 * HANDOVER_TIMEOUT_MS (SO_RCVTIMEO/SO_SNDTIMEO), so a peer that stops
 * (SIGSTOP, a hang) costs a bounded wait and a clear message.
 */
#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "handover.h"

#define MAGIC_HELLO UINT64_C (0x50444f4848454c4f)   /* "PDOHHELO" */
#define MAGIC_OFFER UINT64_C (0x50444f484f464652)   /* "PDOHOFFR" */
#define MAGIC_CONN  UINT32_C (0x434f4e4e)           /* "CONN" */
#define MAGIC_END   UINT64_C (0x50444f48454e4421)   /* "PDOHEND!" */
#define MAGIC_ACK   UINT64_C (0x50444f4841434b21)   /* "PDOHACK!" */

#define HELLO_LEN 16            /* magic, version, 0 */
#define OFFER_LEN 32            /* magic, version, n, size, flags, pid */
#define CONN_LEN  64            /* see put_conn */
#define END_LEN   8
#define ACK_LEN   8

#define OFFER_READONLY 1u
#define CONN_STRUCTURED 1u
#define CONN_META_BASE_ALLOCATION 2u
#define CONN_PAYLOAD_FOLLOWS 4u
#define CONN_FLAGS (CONN_STRUCTURED | CONN_META_BASE_ALLOCATION | \
                    CONN_PAYLOAD_FOLLOWS)

#define LOG(fn, ...) pdio_log_msg (log->fn, "hand-over: " __VA_ARGS__)

void
handover_init (struct handover *ho)
{
  memset (ho, 0, sizeof *ho);
  ho->sock = ho->nbd_listen_fd = ho->handover_listen_fd = -1;
}

static void
close_fd (int *fd)
{
  if (*fd >= 0)
    close (*fd);
  *fd = -1;
}

void
handover_free (struct handover *ho)
{
  for (size_t i = 0; i < ho->n; i++) {
    close_fd (&ho->conns[i].fd);
    free (ho->conns[i].payload);
  }
  free (ho->conns);
  close_fd (&ho->sock);
  close_fd (&ho->nbd_listen_fd);
  close_fd (&ho->handover_listen_fd);
  handover_init (ho);
}

bool
handover_add (struct handover *ho, const struct handover_conn *c)
{
  if (ho->n == ho->cap) {
    size_t cap = ho->cap ? 2 * ho->cap : 16;
    struct handover_conn *p = realloc (ho->conns, cap * sizeof *p);

    if (p == NULL)
      return false;
    ho->conns = p;
    ho->cap = cap;
  }
  ho->conns[ho->n++] = *c;
  return true;
}

/* --- the socket ----------------------------------------------------------- */
static void
set_timeouts (int fd)
{
  const struct timeval tv = {
    .tv_sec = HANDOVER_TIMEOUT_MS / 1000,
    .tv_usec = HANDOVER_TIMEOUT_MS % 1000 * 1000,
  };

  setsockopt (fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt (fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

/* The peer of a connected unix socket must be a process of our own user:
 * the listening socket is 0600, but the run directory may not be ours
 * alone.  (For the side that connected, the peer's credentials are those
 * of whoever made the listening socket.)
 */
static bool
peer_is_ours (int fd, pid_t *pid, const struct pdio_log *log)
{
  struct ucred cr;
  socklen_t len = sizeof cr;

  if (getsockopt (fd, SOL_SOCKET, SO_PEERCRED, &cr, &len) == -1) {
    LOG (error, "SO_PEERCRED: %s", strerror (errno));
    return false;
  }
  if (cr.uid != geteuid ()) {
    LOG (error, "refused: the peer, pid %d, runs as uid %u, not %u",
         (int) cr.pid, (unsigned) cr.uid, (unsigned) geteuid ());
    return false;
  }
  *pid = cr.pid;
  return true;
}

/* Sends all of buf, the fds (if any) with its first byte. */
static bool
send_all (int sock, const void *buf, size_t len, const int *fds, size_t nfds,
          const char *what, const struct pdio_log *log)
{
  const uint8_t *p = buf;

  while (len) {
    union {
      char buf[CMSG_SPACE (2 * sizeof (int))];
      struct cmsghdr align;
    } u;
    struct iovec iov = { .iov_base = (void *) p, .iov_len = len };
    struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1 };
    ssize_t r;

    if (nfds) {
      struct cmsghdr *cm;

      msg.msg_control = u.buf;
      msg.msg_controllen = CMSG_SPACE (nfds * sizeof (int));
      cm = CMSG_FIRSTHDR (&msg);
      cm->cmsg_level = SOL_SOCKET;
      cm->cmsg_type = SCM_RIGHTS;
      cm->cmsg_len = CMSG_LEN (nfds * sizeof (int));
      memcpy (CMSG_DATA (cm), fds, nfds * sizeof (int));
    }
    r = sendmsg (sock, &msg, MSG_NOSIGNAL);
    if (r == -1 && errno == EINTR)
      continue;
    if (r <= 0) {
      LOG (error, "sending %s: %s", what,
           r == 0 || errno == EAGAIN ? "timed out" : strerror (errno));
      return false;
    }
    p += r;
    len -= r;
    nfds = 0;                   /* they went with the first byte */
  }
  return true;
}

/* Receives exactly len bytes.  With want_fds, exactly that many fds must
 * come with the first byte and none after; they are stored in fds (closed
 * again on any failure).
 */
static bool
recv_all (int sock, void *buf, size_t len, int *fds, size_t want_fds,
          const char *what, const struct pdio_log *log)
{
  uint8_t *p = buf;
  size_t got_fds = 0;
  bool first = true;

  while (len) {
    union {
      char buf[CMSG_SPACE (4 * sizeof (int))];
      struct cmsghdr align;
    } u;
    struct iovec iov = { .iov_base = p, .iov_len = len };
    struct msghdr msg = {
      .msg_iov = &iov, .msg_iovlen = 1,
      .msg_control = u.buf, .msg_controllen = sizeof u.buf,
    };
    struct cmsghdr *cm;
    ssize_t r = recvmsg (sock, &msg, MSG_CMSG_CLOEXEC);

    if (r == -1 && errno == EINTR)
      continue;
    if (r <= 0) {
      LOG (error, "receiving %s: %s", what,
           r == 0 ? "the other server closed the socket"
           : errno == EAGAIN ? "timed out" : strerror (errno));
      goto fail;
    }
    for (cm = CMSG_FIRSTHDR (&msg); cm; cm = CMSG_NXTHDR (&msg, cm)) {
      size_t n;

      if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
        continue;
      n = (cm->cmsg_len - CMSG_LEN (0)) / sizeof (int);
      for (size_t i = 0; i < n; i++) {
        int fd;

        memcpy (&fd, CMSG_DATA (cm) + i * sizeof (int), sizeof fd);
        if (first && got_fds < want_fds)
          fds[got_fds++] = fd;
        else {
          close (fd);
          got_fds = want_fds + 1;       /* one too many: refused below */
        }
      }
    }
    if (msg.msg_flags & MSG_CTRUNC) {
      LOG (error, "receiving %s: more descriptors than expected", what);
      goto fail;
    }
    if (got_fds > want_fds) {
      LOG (error, "receiving %s: descriptors where none belong", what);
      goto fail;
    }
    if (got_fds < want_fds) {
      LOG (error, "receiving %s: %zu descriptors instead of %zu", what,
           got_fds, want_fds);
      goto fail;
    }
    first = false;
    p += r;
    len -= r;
  }
  return true;

 fail:
  for (size_t i = 0; i < got_fds && i < want_fds; i++)
    close (fds[i]);
  return false;
}

/* Is fd a stream socket, listening or not as expected? */
static bool
is_stream_socket (int fd, bool listening, const char *what,
                  const struct pdio_log *log)
{
  int type = 0, acc = 0;
  socklen_t len = sizeof type, alen = sizeof acc;
  struct stat st;

  if (fstat (fd, &st) == -1 || !S_ISSOCK (st.st_mode) ||
      getsockopt (fd, SOL_SOCKET, SO_TYPE, &type, &len) == -1 ||
      type != SOCK_STREAM ||
      getsockopt (fd, SOL_SOCKET, SO_ACCEPTCONN, &acc, &alen) == -1 ||
      !acc != !listening) {
    LOG (error, "%s is not a %s stream socket", what,
         listening ? "listening" : "connected");
    return false;
  }
  return true;
}

/* --- the old server ------------------------------------------------------- */
int
handover_listen (const char *path, const struct pdio_log *log)
{
  /* The NBD socket's listener, left at its 0600 (never widened): whoever
   * connects can take every connection.
   */
  return pdio_server_listen_unix (path, 0, (gid_t) -1, log);
}

int
handover_accept (int listen_fd, const struct pdio_log *log, pid_t *peer)
{
  uint8_t hello[HELLO_LEN];
  int fd = accept4 (listen_fd, NULL, NULL, SOCK_CLOEXEC);

  if (fd == -1)
    return -1;                  /* EAGAIN, ECONNABORTED...: not a peer */
  set_timeouts (fd);
  if (!peer_is_ours (fd, peer, log) ||
      !recv_all (fd, hello, sizeof hello, NULL, 0, "the hello", log))
    goto refuse;
  if (nbd_get64 (hello) != MAGIC_HELLO) {
    LOG (error, "refused pid %d: not a pdio server's hello", (int) *peer);
    goto refuse;
  }
  if (nbd_get32 (hello + 8) != HANDOVER_VERSION) {
    LOG (error, "refused pid %d: it speaks hand-over version %u, this "
         "server %u", (int) *peer, nbd_get32 (hello + 8), HANDOVER_VERSION);
    goto refuse;
  }
  return fd;

 refuse:
  close (fd);
  return -1;
}

/* A CONN record: magic, flags, size, eflags, 0, block_max, hdr_got,
 * hdr[28], payload_got, 0.
 */
static void
put_conn (uint8_t *b, const struct handover_conn *c)
{
  uint32_t flags = (c->s.structured ? CONN_STRUCTURED : 0) |
    (c->s.meta_base_allocation ? CONN_META_BASE_ALLOCATION : 0) |
    (c->payload ? CONN_PAYLOAD_FOLLOWS : 0);

  memset (b, 0, CONN_LEN);
  nbd_put32 (b, MAGIC_CONN);
  nbd_put32 (b + 4, flags);
  nbd_put64 (b + 8, c->s.size);
  nbd_put16 (b + 16, c->s.eflags);
  nbd_put32 (b + 20, c->s.block_max);
  nbd_put32 (b + 24, c->hdr_got);
  memcpy (b + 28, c->hdr, NBD_REQUEST_LEN);
  nbd_put32 (b + 56, c->payload_got);
}

int
handover_send (struct handover *ho, const struct pdio_log *log)
{
  uint8_t b[CONN_LEN > OFFER_LEN ? CONN_LEN : OFFER_LEN];
  const int listeners[2] = { ho->nbd_listen_fd, ho->handover_listen_fd };

  memset (b, 0, OFFER_LEN);
  nbd_put64 (b, MAGIC_OFFER);
  nbd_put32 (b + 8, HANDOVER_VERSION);
  nbd_put32 (b + 12, ho->n);
  nbd_put64 (b + 16, ho->size);
  nbd_put32 (b + 24, ho->readonly ? OFFER_READONLY : 0);
  nbd_put32 (b + 28, getpid ());
  if (!send_all (ho->sock, b, OFFER_LEN, listeners, 2, "the offer", log))
    return -1;
  for (size_t i = 0; i < ho->n; i++) {
    const struct handover_conn *c = &ho->conns[i];

    put_conn (b, c);
    if (!send_all (ho->sock, b, CONN_LEN, &c->fd, 1, "a connection", log) ||
        (c->payload && !send_all (ho->sock, c->payload, c->payload_got,
                                  NULL, 0, "a WRITE's payload", log)))
      return -1;
  }
  nbd_put64 (b, MAGIC_END);
  return send_all (ho->sock, b, END_LEN, NULL, 0, "the end", log) ? 0 : -1;
}

bool
handover_wait_ack (struct handover *ho, const struct pdio_log *log)
{
  uint8_t b[ACK_LEN];

  if (!recv_all (ho->sock, b, sizeof b, NULL, 0, "the acknowledgement", log))
    return false;
  if (nbd_get64 (b) != MAGIC_ACK) {
    LOG (error, "pid %d sent something else than its acknowledgement",
         (int) ho->peer);
    return false;
  }
  return true;
}

/* --- the successor -------------------------------------------------------- */
/* A CONN record, checked: false with the reason logged. */
static bool
get_conn (const uint8_t *b, const struct handover *ho,
          struct handover_conn *c, bool *payload_follows,
          const struct pdio_log *log)
{
  uint32_t flags = nbd_get32 (b + 4);
  struct nbd_request r;

  if (nbd_get32 (b) != MAGIC_CONN) {
    LOG (error, "a connection record has a bad magic");
    return false;
  }
  if (flags & ~CONN_FLAGS) {
    LOG (error, "a connection record has unknown flags 0x%x", flags);
    return false;
  }
  c->s = (struct nbd_session) {
    .size = nbd_get64 (b + 8), .eflags = nbd_get16 (b + 16),
    .block_max = nbd_get32 (b + 20),
    .structured = flags & CONN_STRUCTURED,
    .meta_base_allocation = flags & CONN_META_BASE_ALLOCATION,
  };
  c->hdr_got = nbd_get32 (b + 24);
  memcpy (c->hdr, b + 28, NBD_REQUEST_LEN);
  c->payload_got = nbd_get32 (b + 56);
  *payload_follows = flags & CONN_PAYLOAD_FOLLOWS;
  if (c->s.size != ho->size || !(c->s.eflags & NBD_FLAG_HAS_FLAGS) ||
      c->s.block_max == 0 || c->s.block_max > NBD_MAX_PAYLOAD) {
    LOG (error, "a connection record does not describe the export offered "
         "(size %" PRIu64 " of %" PRIu64 ", flags 0x%x, maximum block %u)",
         c->s.size, ho->size, c->s.eflags, c->s.block_max);
    return false;
  }
  if (c->hdr_got > NBD_REQUEST_LEN) {
    LOG (error, "a connection record claims %u bytes of a %d-byte header",
         c->hdr_got, NBD_REQUEST_LEN);
    return false;
  }
  if (c->payload_got == 0 && !*payload_follows)
    return true;
  /* Payload bytes belong to a whole WRITE header. */
  if (c->hdr_got != NBD_REQUEST_LEN || !nbd_parse_request (c->hdr, &r) ||
      r.type != NBD_CMD_WRITE || c->payload_got > r.count ||
      (*payload_follows && (c->payload_got == 0 ||
                            c->payload_got > NBD_MAX_PAYLOAD))) {
    LOG (error, "a connection record's %u payload bytes do not belong to "
         "the WRITE header it holds", c->payload_got);
    return false;
  }
  return true;
}

int
handover_receive (const char *path, struct handover *ho,
                  const struct pdio_log *log)
{
  struct sockaddr_un sa = { .sun_family = AF_UNIX };
  uint8_t b[CONN_LEN > OFFER_LEN ? CONN_LEN : OFFER_LEN];
  int listeners[2];
  uint32_t n;

  handover_init (ho);
  if (strlen (path) >= sizeof sa.sun_path) {
    LOG (error, "%s: socket path too long", path);
    return -1;
  }
  strcpy (sa.sun_path, path);
  ho->sock = socket (AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (ho->sock == -1) {
    LOG (error, "socket: %s", strerror (errno));
    return -1;
  }
  set_timeouts (ho->sock);
  if (connect (ho->sock, (struct sockaddr *) &sa, sizeof sa) == -1) {
    LOG (error, "%s: no server to take over from: %s", path,
         strerror (errno));
    goto fail;
  }
  if (!peer_is_ours (ho->sock, &ho->peer, log))
    goto fail;
  memset (b, 0, HELLO_LEN);
  nbd_put64 (b, MAGIC_HELLO);
  nbd_put32 (b + 8, HANDOVER_VERSION);
  if (!send_all (ho->sock, b, HELLO_LEN, NULL, 0, "the hello", log))
    goto fail;

  /* The old server answers once its requests in flight are answered. */
  if (!recv_all (ho->sock, b, OFFER_LEN, listeners, 2, "the offer", log))
    goto fail;
  ho->nbd_listen_fd = listeners[0];
  ho->handover_listen_fd = listeners[1];
  n = nbd_get32 (b + 12);
  ho->size = nbd_get64 (b + 16);
  ho->readonly = nbd_get32 (b + 24) & OFFER_READONLY;
  /* The peer's credentials are the listening socket's, which may have
   * been handed down from an older server: the offer names the sender.
   */
  ho->peer = nbd_get32 (b + 28);
  if (nbd_get64 (b) != MAGIC_OFFER || nbd_get32 (b + 8) != HANDOVER_VERSION) {
    LOG (error, "pid %d sent no offer of version %u", (int) ho->peer,
         HANDOVER_VERSION);
    goto fail;
  }
  if (n > HANDOVER_MAX_CONNS || (nbd_get32 (b + 24) & ~OFFER_READONLY)) {
    LOG (error, "pid %d offers %u connections (at most %u) with flags 0x%x",
         (int) ho->peer, n, HANDOVER_MAX_CONNS, nbd_get32 (b + 24));
    goto fail;
  }
  if (!is_stream_socket (ho->nbd_listen_fd, true, "the NBD socket", log) ||
      !is_stream_socket (ho->handover_listen_fd, true, "the hand-over "
                         "socket", log))
    goto fail;

  for (uint32_t i = 0; i < n; i++) {
    struct handover_conn c = { .fd = -1 };
    bool follows;

    if (!recv_all (ho->sock, b, CONN_LEN, &c.fd, 1, "a connection", log))
      goto fail;
    if (!get_conn (b, ho, &c, &follows, log) ||
        !is_stream_socket (c.fd, false, "a connection", log)) {
      close (c.fd);
      goto fail;
    }
    if (follows) {
      c.payload = malloc (c.payload_got);
      if (c.payload == NULL ||
          !recv_all (ho->sock, c.payload, c.payload_got, NULL, 0,
                     "a WRITE's payload", log)) {
        if (c.payload == NULL)
          LOG (error, "out of memory");
        close (c.fd);
        free (c.payload);
        goto fail;
      }
    }
    if (!handover_add (ho, &c)) {
      LOG (error, "out of memory");
      close (c.fd);
      free (c.payload);
      goto fail;
    }
  }
  if (!recv_all (ho->sock, b, END_LEN, NULL, 0, "the end", log))
    goto fail;
  if (nbd_get64 (b) != MAGIC_END) {
    LOG (error, "pid %d did not end its message", (int) ho->peer);
    goto fail;
  }
  return 0;

 fail:
  handover_free (ho);
  return -1;
}

void
handover_ack (struct handover *ho, const struct pdio_log *log)
{
  uint8_t b[ACK_LEN];

  nbd_put64 (b, MAGIC_ACK);
  send_all (ho->sock, b, sizeof b, NULL, 0, "the acknowledgement", log);
  close_fd (&ho->sock);
}
