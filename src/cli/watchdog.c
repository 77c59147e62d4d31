/* The supervisor's watch on a live server: does it still answer?
 *
 * With one connection pdio gives the kernel a request timeout of 0
 * (pdio.h, DEFAULT_TIMEOUT): the kernel then never gives up on a request
 * its server holds, it only logs "Possible stuck request" each time the
 * request's timer expires and waits on.  A server that stops answering
 * (SIGSTOP, an event loop that blocks, a disk that never completes) would
 * hang the device for good.  So the supervisor keeps one NBD connection of
 * its own to the server and, while the device has requests in flight,
 * reads one block through it every WATCHDOG_PROBE_MS: the path the
 * kernel's requests take (socket, worker, engine, the image with
 * O_DIRECT).  A server that leaves a probe, or a connection attempt,
 * unanswered for WATCHDOG_HUNG_MS is hung: the supervisor kills it and
 * restarts it as if it had died.  An idle device is not probed: nobody
 * waits on its server, and the server gives its idle buffers back
 * (src/server/worker.c) only when no request comes for a few seconds.
 *
 * Nothing here reads the clock: the caller passes the time, so
 * tests/unit/test_watchdog drives the decisions with a clock of its own.
 */
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "pdio.h"
#include "proto.h"

void
watchdog_init (struct watchdog *w)
{
  *w = (struct watchdog) { .fd = -1, .owed_since = -1, .due = 0 };
}

void
watchdog_attach (struct watchdog *w, int fd, uint32_t len, long now)
{
  watchdog_close (w);
  w->fd = fd;
  w->len = len < sizeof w->reply - NBD_SIMPLE_REPLY_LEN
    ? len : sizeof w->reply - NBD_SIMPLE_REPLY_LEN;
  w->sent = false;
  w->due = now;
  /* Connected: the server answered the handshake, it owes nothing. */
  w->owed_since = -1;
  fcntl (fd, F_SETFL, fcntl (fd, F_GETFL) | O_NONBLOCK);
}

void
watchdog_unreachable (struct watchdog *w, long asked)
{
  if (w->owed_since < 0)
    w->owed_since = asked;
  w->due = asked + WATCHDOG_PROBE_MS;
}

/* The connection is of no more use: a server that died, or one that
 * broke the protocol.  A live server gets a new one at the next probe.
 */
static void
lost (struct watchdog *w, long now)
{
  if (w->fd >= 0)
    close (w->fd);
  w->fd = -1;
  w->sent = false;
  w->due = now;
}

void
watchdog_forget (struct watchdog *w)
{
  if (w->fd >= 0)
    close (w->fd);
  watchdog_init (w);
}

/* The bytes of the reply: its header, then the block unless the header
 * says error (an error reply has no payload).
 */
static size_t
reply_len (const struct watchdog *w)
{
  uint32_t error;
  uint64_t cookie;

  if (w->got < NBD_SIMPLE_REPLY_LEN)
    return NBD_SIMPLE_REPLY_LEN;
  nbd_parse_simple_reply (w->reply, &error, &cookie);
  return NBD_SIMPLE_REPLY_LEN + (error ? 0 : w->len);
}

/* Reads what is there of the reply; true once it is whole. */
static bool
read_reply (struct watchdog *w, long now)
{
  while (w->got < reply_len (w)) {
    ssize_t r = recv (w->fd, w->reply + w->got, reply_len (w) - w->got, 0);

    if (r > 0) {
      uint32_t error;
      uint64_t cookie;

      w->got += r;
      if (w->got == NBD_SIMPLE_REPLY_LEN &&
          (!nbd_parse_simple_reply (w->reply, &error, &cookie) ||
           cookie != w->cookie)) {
        lost (w, now);          /* not an answer to our probe */
        return false;
      }
      continue;
    }
    if (r == -1 && (errno == EAGAIN || errno == EINTR))
      return false;
    lost (w, now);              /* EOF or error: the server is gone */
    return false;
  }
  /* An error reply is an answer too: the server is alive. */
  return true;
}

static void
send_probe (struct watchdog *w, long now)
{
  struct nbd_request probe = {
    .type = NBD_CMD_READ, .cookie = ++w->cookie, .offset = 0, .count = w->len,
  };
  uint8_t req[NBD_REQUEST_LEN];
  ssize_t r;

  nbd_request_bytes (req, &probe);
  /* 28 bytes into an idle socket's buffer: all or nothing in practice;
   * anything else is a connection not worth keeping.
   */
  r = send (w->fd, req, sizeof req, MSG_NOSIGNAL | MSG_DONTWAIT);
  if (r != (ssize_t) sizeof req) {
    lost (w, now);
    return;
  }
  w->sent = true;
  w->got = 0;
  w->owed_since = now;
}

enum watchdog_verdict
watchdog_run (struct watchdog *w, long now, bool busy)
{
  if (w->fd >= 0 && w->sent && read_reply (w, now)) {
    w->sent = false;
    w->owed_since = -1;
    w->due = now + WATCHDOG_PROBE_MS;
  }
  if (w->fd >= 0 && !w->sent && now >= w->due) {
    if (busy)
      send_probe (w, now);
    else
      w->due = now + WATCHDOG_PROBE_MS;         /* look again then */
  }
  if (w->owed_since >= 0 && now - w->owed_since >= WATCHDOG_HUNG_MS)
    return WATCHDOG_HUNG;
  return WATCHDOG_OK;
}

long
watchdog_wait_ms (const struct watchdog *w, long now)
{
  long t = WATCHDOG_PROBE_MS;

  if (!w->sent && w->due - now < t)
    t = w->due - now;
  if (w->owed_since >= 0 && w->owed_since + WATCHDOG_HUNG_MS - now < t)
    t = w->owed_since + WATCHDOG_HUNG_MS - now;
  return t < 0 ? 0 : t;
}

long
watchdog_owed_ms (const struct watchdog *w, long now)
{
  return w->owed_since < 0 ? 0 : now - w->owed_since;
}

void
watchdog_close (struct watchdog *w)
{
  if (w->fd >= 0 && w->sent) {
    /* Debian 12's nbdkit aborts when a client hangs up with a reply
     * queued (field notes): let the outstanding one arrive first.
     */
    struct pollfd p = { .fd = w->fd, .events = POLLIN };

    for (int i = 0; i < 10 && w->fd >= 0 && !read_reply (w, 0); i++)
      poll (&p, 1, 100);
  }
  if (w->fd >= 0) {
    struct nbd_request disc = { .type = NBD_CMD_DISC };
    uint8_t req[NBD_REQUEST_LEN];

    nbd_request_bytes (req, &disc);
    (void) send (w->fd, req, sizeof req, MSG_NOSIGNAL | MSG_DONTWAIT);
    close (w->fd);
  }
  w->fd = -1;
  w->sent = false;
  w->owed_since = -1;
}
