/* The client side of the NBD handshake (the NBD project's doc/proto.md):
 * the kernel takes sockets that are already in the transmission phase, so
 * pdio negotiates them itself.  Fixed newstyle, NBD_OPT_GO for the default
 * export (""), asking for NBD_INFO_BLOCK_SIZE: the preferred block size is
 * pdio's direct-I/O alignment, the kernel's logical block size.  No
 * structured replies: the kernel's client does not speak them.
 */
#include <config.h>

#include <endian.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include "kernel.h"

#define NBDMAGIC        0x4e42444d41474943ULL   /* "NBDMAGIC" */
#define IHAVEOPT        0x49484156454f5054ULL   /* "IHAVEOPT" */
#define REPLY_MAGIC     0x0003e889045565a9ULL
#define FLAG_FIXED_NEWSTYLE 1
#define FLAG_NO_ZEROES      2
#define OPT_GO          7
#define REP_ACK         1
#define REP_INFO        3
#define REP_ERR_BIT     0x80000000U
#define INFO_EXPORT     0
#define INFO_BLOCK_SIZE 3
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
  struct {
    uint64_t magic;
    uint32_t opt, len;
  } __attribute__ ((packed)) h = {
    htobe64 (IHAVEOPT), htobe32 (opt), htobe32 (n)
  };

  return xwrite (fd, &h, sizeof h) && (n == 0 || xwrite (fd, data, n));
}

/* Reads replies to NBD_OPT_GO until NBD_REP_ACK, filling e. */
static bool
read_go_replies (int fd, struct nbd_export *e, char *why, size_t len)
{
  bool have_export = false;

  for (;;) {
    struct {
      uint64_t magic;
      uint32_t opt, type, len;
    } __attribute__ ((packed)) r;
    unsigned char data[1024];
    uint32_t n;

    if (!xread (fd, &r, sizeof r)) {
      snprintf (why, len, "reading the reply to NBD_OPT_GO: %m");
      return false;
    }
    n = be32toh (r.len);
    if (be64toh (r.magic) != REPLY_MAGIC || be32toh (r.opt) != OPT_GO ||
        n > sizeof data) {
      snprintf (why, len, "bad reply to NBD_OPT_GO (magic %#llx, option %u, "
                "length %u)", (unsigned long long) be64toh (r.magic),
                be32toh (r.opt), n);
      return false;
    }
    if (!xread (fd, data, n)) {
      snprintf (why, len, "reading the reply to NBD_OPT_GO: %m");
      return false;
    }
    r.type = be32toh (r.type);
    if (r.type & REP_ERR_BIT) {
      snprintf (why, len, "the server refused NBD_OPT_GO (error %#x)%s%.*s",
                r.type, n ? ": " : "", (int) n, (char *) data);
      return false;
    }
    if (r.type == REP_ACK) {
      if (!have_export)
        snprintf (why, len, "the server sent no NBD_INFO_EXPORT");
      return have_export;
    }
    if (r.type != REP_INFO || n < 2)
      continue;                 /* other replies may be ignored */
    switch (be16toh (*(uint16_t *) data)) {
    case INFO_EXPORT:
      if (n >= 12) {
        uint64_t size;
        uint16_t flags;

        memcpy (&size, data + 2, 8);
        memcpy (&flags, data + 10, 2);
        e->size = be64toh (size);
        e->flags = be16toh (flags);
        have_export = true;
      }
      break;
    case INFO_BLOCK_SIZE:
      if (n >= 14) {
        uint32_t v[3];

        memcpy (v, data + 2, 12);
        e->block_min = be32toh (v[0]);
        e->block_pref = be32toh (v[1]);
        e->block_max = be32toh (v[2]);
      }
      break;
    }
  }
}

int
nbd_handshake (const char *socket, struct nbd_export *e, char *why,
               size_t len)
{
  struct {
    uint64_t magic, opt;
    uint16_t flags;
  } __attribute__ ((packed)) hello;
  unsigned char go[4 + 2 + 2];  /* name length 0, "", 1 request */
  uint32_t cflags;
  int fd = connect_unix (socket, why, len);

  if (fd == -1)
    return -1;
  *e = (struct nbd_export) { .size = 0 };
  set_timeouts (fd, HANDSHAKE_TIMEOUT_S);
  if (!xread (fd, &hello, sizeof hello)) {
    snprintf (why, len, "%s: reading the server's greeting: %m", socket);
    goto fail;
  }
  hello.flags = be16toh (hello.flags);
  if (be64toh (hello.magic) != NBDMAGIC || be64toh (hello.opt) != IHAVEOPT ||
      !(hello.flags & FLAG_FIXED_NEWSTYLE)) {
    snprintf (why, len, "%s: not a fixed-newstyle NBD server", socket);
    goto fail;
  }
  cflags = htobe32 (FLAG_FIXED_NEWSTYLE |
                    (hello.flags & FLAG_NO_ZEROES ? FLAG_NO_ZEROES : 0));
  memset (go, 0, sizeof go);
  go[5] = 1;                    /* one information request ... */
  go[7] = INFO_BLOCK_SIZE;      /* ... for the block sizes */
  if (!xwrite (fd, &cflags, sizeof cflags) ||
      !send_option (fd, OPT_GO, go, sizeof go)) {
    snprintf (why, len, "%s: sending NBD_OPT_GO: %m", socket);
    goto fail;
  }
  if (!read_go_replies (fd, e, why, len))
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
                 struct nbd_export *e, char *why, size_t len)
{
  struct nbd_export other;

  for (unsigned i = 0; i < n; i++) {
    fds[i] = nbd_handshake (socket, i ? &other : e, why, len);
    if (fds[i] >= 0 && i &&
        (other.size != e->size || other.flags != e->flags)) {
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
