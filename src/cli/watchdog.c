/* SPDX-License-Identifier: BSD-3-Clause */
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
 * Under memory pressure a live server can be silent for longer: a thread
 * of it waits in reclaim, or on I/O, in D state.  Before it is called
 * hung, the supervisor reads /proc (pressure.c) and watchdog_stalled
 * judges: stalled, it is given longer, in steps, up to a bound (pdio.h).
 *
 * Nothing here reads the clock or /proc: the caller passes the time and
 * the readings, so tests/cli/test_watchdog drives the decisions with a
 * clock and a /proc of its own.
 */
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "pdio.h"
#include "proto.h"

/* Nothing is owed: the next answer owed has the first deadline again. */
static void
settle (struct watchdog *w)
{
  w->owed_since = -1;
  w->deadline = WATCHDOG_HUNG_MS;
  w->looked = -1;
}

void
watchdog_init (struct watchdog *w)
{
  *w = (struct watchdog) { .fd = -1, .due = 0 };
  settle (w);
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
  settle (w);
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
  settle (w);
  w->owed_since = now;
}

enum watchdog_verdict
watchdog_run (struct watchdog *w, long now, bool busy)
{
  if (w->fd >= 0 && w->sent && read_reply (w, now)) {
    w->sent = false;
    settle (w);
    w->due = now + WATCHDOG_PROBE_MS;
  }
  if (w->fd >= 0 && !w->sent && now >= w->due) {
    if (busy)
      send_probe (w, now);
    else
      w->due = now + WATCHDOG_PROBE_MS;         /* look again then */
  }
  if (w->owed_since >= 0 && now - w->owed_since >= w->deadline)
    return WATCHDOG_HUNG;
  return WATCHDOG_OK;
}

/* How much tasks waited for memory by one PSI reading and the one before
 * it, interval ms earlier (or none): avg10, or the total's growth over
 * the interval if that is more, in percent.  The first look has only
 * avg10, which covers about the 10 s the answer has been owed.  *grew_us
 * is the growth, when it is the larger.
 */
static double
pressure_pct (const struct psi_some *now, const struct psi_some *before,
              long interval, double *grew_us)
{
  double pct;

  *grew_us = -1;
  if (!now->have)
    return 0;
  pct = now->avg10;
  if (before && before->have && interval > 0 &&
      now->total_us >= before->total_us) {
    double grew = (double) (now->total_us - before->total_us);

    /* µs in ms: 1000 per 100 %. */
    if (grew / (interval * 10.0) > pct) {
      pct = grew / (interval * 10.0);
      *grew_us = grew;
    }
  }
  return pct;
}

/* Appends ", " and the text to why (of len, n used so far). */
static void __attribute__ ((format (printf, 4, 5)))
add (char *why, size_t len, size_t *n, const char *fmt, ...)
{
  va_list ap;
  int r;

  if (*n >= len)
    return;
  if (*n) {
    r = snprintf (why + *n, len - *n, ", ");
    *n += r > 0 ? (size_t) r : 0;
    if (*n >= len)
      return;
  }
  va_start (ap, fmt);
  r = vsnprintf (why + *n, len - *n, fmt, ap);
  va_end (ap);
  *n += r > 0 ? (size_t) r : 0;
}

static void
add_pressure (char *why, size_t len, size_t *n, const char *where,
              const struct psi_some *p, double grew_us, long interval)
{
  if (grew_us >= 0)
    add (why, len, n, "%s memory some %.1f s of the last %.1f s", where,
         grew_us / 1e6, interval / 1e3);
  else
    add (why, len, n, "%s memory some avg10=%.2f", where, p->avg10);
}

bool
watchdog_stalled (struct watchdog *w, long now, const struct stall_reading *r,
                  char *why, size_t len)
{
  long interval = w->looked >= 0 ? now - w->looked : 0;
  const struct psi_some *sys0 = w->looked >= 0 ? &w->system : NULL;
  const struct psi_some *cg0 = w->looked >= 0 ? &w->cgroup : NULL;
  double sys_grew, cg_grew;
  double sys = pressure_pct (&r->system, sys0, interval, &sys_grew);
  double cg = pressure_pct (&r->cgroup, cg0, interval, &cg_grew);
  size_t n = 0;

  if (len)
    why[0] = '\0';
  if (r->d_tid > 0)
    add (why, len, &n, "thread %d in D state", (int) r->d_tid);
  if (sys >= WATCHDOG_PRESSURE_PCT)
    add_pressure (why, len, &n, "system", &r->system, sys_grew, interval);
  if (cg >= WATCHDOG_PRESSURE_PCT)
    add_pressure (why, len, &n, "cgroup", &r->cgroup, cg_grew, interval);
  w->looked = now;
  w->system = r->system;
  w->cgroup = r->cgroup;
  if (n == 0 || w->deadline + WATCHDOG_EXTEND_MS > WATCHDOG_STALL_MAX_MS)
    return false;
  w->deadline += WATCHDOG_EXTEND_MS;
  return true;
}

long
watchdog_wait_ms (const struct watchdog *w, long now)
{
  long t = WATCHDOG_PROBE_MS;

  if (!w->sent && w->due - now < t)
    t = w->due - now;
  if (w->owed_since >= 0 && w->owed_since + w->deadline - now < t)
    t = w->owed_since + w->deadline - now;
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
  settle (w);
}
