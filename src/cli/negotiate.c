/* The client side of the NBD handshake (the NBD project's doc/proto.md,
 * in the wire format of src/protocol/proto.h, which pdio's server speaks
 * too): the kernel takes sockets that are already in the transmission
 * phase, so pdio negotiates them itself.  Fixed newstyle, NBD_OPT_GO for the default
 * export (""), asking for NBD_INFO_BLOCK_SIZE: the preferred block size is
 * pdio's direct-I/O alignment, the kernel's logical block size.  No
 * structured replies: the kernel's client does not speak them.
 */
#include <config.h>

#include <errno.h>
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

static bool
xread (int fd, void *buf, size_t n)
{
  for (char *p = buf; n; ) {
    ssize_t r = read (fd, p, n);

    if (r == 0)
      errno = ECONNRESET;
    if (r <= 0) {
      if (r == -1 && errno == EINTR)
        continue;
      return false;
    }
    p += r;
    n -= r;
  }
  return true;
}

static bool
xwrite (int fd, const void *buf, size_t n)
{
  for (const char *p = buf; n; ) {
    /* A server that hangs up must not kill the supervisor with SIGPIPE. */
    ssize_t r = send (fd, p, n, MSG_NOSIGNAL);

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

static bool
send_option (int fd, uint32_t opt, const void *data, uint32_t n)
{
  uint8_t h[NBD_OPTION_HEADER_LEN];

  nbd_option_header (h, opt, n);
  return xwrite (fd, h, sizeof h) && (n == 0 || xwrite (fd, data, n));
}

/* Reads replies to NBD_OPT_GO until NBD_REP_ACK, filling o. */
static bool
read_go_replies (int fd, struct nbd_offer *o, char *why, size_t len)
{
  bool have_export = false;

  for (;;) {
    uint8_t r[NBD_OPTION_REPLY_LEN], data[1024];
    uint32_t opt, type, n;

    if (!xread (fd, r, sizeof r)) {
      snprintf (why, len, "reading the reply to NBD_OPT_GO: %m");
      return false;
    }
    if (!nbd_parse_option_reply (r, &opt, &type, &n) ||
        opt != NBD_OPT_GO || n > sizeof data) {
      snprintf (why, len, "bad reply to NBD_OPT_GO (magic %#llx, option %u, "
                "length %u)", (unsigned long long) nbd_get64 (r), opt, n);
      return false;
    }
    if (!xread (fd, data, n)) {
      snprintf (why, len, "reading the reply to NBD_OPT_GO: %m");
      return false;
    }
    if (type & NBD_REP_ERR_BIT) {
      snprintf (why, len, "the server refused NBD_OPT_GO (error %#x)%s%.*s",
                type, n ? ": " : "", (int) n, (char *) data);
      return false;
    }
    if (type == NBD_REP_ACK) {
      if (!have_export)
        snprintf (why, len, "the server sent no NBD_INFO_EXPORT");
      return have_export;
    }
    if (type != NBD_REP_INFO || n < 2)
      continue;                 /* other replies may be ignored */
    switch (nbd_get16 (data)) {
    case NBD_INFO_EXPORT:
      if (n >= 12) {
        o->size = nbd_get64 (data + 2);
        o->eflags = nbd_get16 (data + 10);
        have_export = true;
      }
      break;
    case NBD_INFO_BLOCK_SIZE:
      if (n >= 14) {
        o->block_min = nbd_get32 (data + 2);
        o->block_preferred = nbd_get32 (data + 6);
        o->block_max = nbd_get32 (data + 10);
      }
      break;
    }
  }
}

int
nbd_handshake (const char *socket, struct nbd_offer *o, char *why,
               size_t len)
{
  uint8_t hello[18], cflags[4];
  uint8_t go[4 + 2 + 2];        /* name length 0, "", 1 request */
  uint16_t sflags;
  int fd = connect_unix (socket, why, len);

  if (fd == -1)
    return -1;
  *o = (struct nbd_offer) { .size = 0 };
  set_timeouts (fd, HANDSHAKE_TIMEOUT_S);
  if (!xread (fd, hello, sizeof hello)) {
    snprintf (why, len, "%s: reading the server's greeting: %m", socket);
    goto fail;
  }
  sflags = nbd_get16 (hello + 16);
  if (nbd_get64 (hello) != NBD_MAGIC || nbd_get64 (hello + 8) != NBD_IHAVEOPT ||
      !(sflags & NBD_FLAG_FIXED_NEWSTYLE)) {
    snprintf (why, len, "%s: not a fixed-newstyle NBD server", socket);
    goto fail;
  }
  nbd_put32 (cflags, NBD_FLAG_C_FIXED_NEWSTYLE |
                     (sflags & NBD_FLAG_NO_ZEROES ? NBD_FLAG_C_NO_ZEROES : 0));
  memset (go, 0, sizeof go);
  nbd_put16 (go + 4, 1);        /* one information request ... */
  nbd_put16 (go + 6, NBD_INFO_BLOCK_SIZE);      /* ... for the block sizes */
  if (!xwrite (fd, cflags, sizeof cflags) ||
      !send_option (fd, NBD_OPT_GO, go, sizeof go)) {
    snprintf (why, len, "%s: sending NBD_OPT_GO: %m", socket);
    goto fail;
  }
  if (!read_go_replies (fd, o, why, len))
    goto fail;
  /* The kernel reads and writes this socket with its own timeouts. */
  set_timeouts (fd, 0);
  return fd;

 fail:
  close (fd);
  return -1;
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
