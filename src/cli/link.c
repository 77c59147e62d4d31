/* SPDX-License-Identifier: BSD-3-Clause */
/* The supervisor of a remote device (pdio attach nbd://...): it keeps the
 * device's link to the remote server.  Like the supervisor of a local
 * device (supervise.c) it is attach's child, single-threaded and off the
 * data path; unlike it, there is no server to restart: when the link
 * dies it connects again, as often as it takes, and hands the device the
 * new socket.
 *
 * A link is dead when the kernel says so (NBD_CMD_LINK_DEAD: the server
 * hung up, or the connection failed), when the supervisor's own
 * reference to the device's socket shows an error or a hang-up, or when
 * the watchdog (watchdog.c) finds that the server owes an answer past
 * its deadline on the probe connection it took -- then the supervisor
 * shuts the socket down itself,
 * because the kernel ignores a new socket aimed at a live one
 * (nbd_reconnect_socket) and, with a request timeout of 0, would wait on
 * the old one for ever.
 *
 * Reconnecting: attempts with exponential backoff and jitter, capped at
 * BACKOFF_MAX_MS so that once the server is reachable again the device
 * waits at most that long for it.  Each new connection must reach the
 * same export: the same size and flags, and the same NBD_INFO_NAME and
 * DESCRIPTION where the server gave them.  Another export at that address
 * (an image swapped, a server restarted on another file) is refused: its
 * data would not be the device's.  The kernel holds the requests for the
 * dead-connection timeout, then fails them; the link is then "failed",
 * and the supervisor goes on trying at the capped pace, so that a server
 * that comes back still gets its device back.  Requests that were in
 * flight on the dead socket are resent by the kernel at their timer's
 * first expiry after the hand-over (device.c sets it to REQUEUE_MS).
 *
 * Each outage is logged with its length and counted in the record, which
 * pdio list shows.  A detach (SIGTERM) during an outage ends it at once.
 *
 * An nbds:// link is a new TLS session each time (negotiate.c), handed
 * to the kernel by link_hand_over: the TCP socket itself once its keys
 * are the kernel's (kTLS), else one end of a socketpair with a relay
 * (relay.c) in this process.  Either way the kernel sees a dead link
 * when the TLS one dies, and the rest is as for a plain link.  What kTLS
 * cannot carry ends the link too: a TLS 1.3 KeyUpdate from the server
 * reaches the nbd driver as a record it cannot read, so the kernel fails
 * the receive and reports the link dead, and the device gets a new
 * session -- an outage of one reconnect.  The watchdog's probe speaks
 * plain NBD on a socket of its own, so a TLS link is watched through
 * its socket and the kernel's events only.
 */
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "pdio.h"
#include "proto.h"

/* A connection attempt to a host that does not answer takes up to
 * CONNECT_MS on top of the backoff (link_policy.c): a SYN lost while the
 * link comes back is resent by TCP within that time.
 */
#define CONNECT_MS 2000
/* A probe connection the server did not take is tried again after this. */
#define PROBE_RETRY_MS 60000

struct link {
  struct record rec;
  struct nbd_uri uri;
  struct nbd_offer first;       /* what the export was at attach */
  int idx;
  int fd;                       /* our reference to the device's socket */
  struct relay *relay;          /* a TLS link's relay, if it has one */
  int sfd;                      /* signals */
  int claim;
  struct nl_sock *ev;
  struct watchdog wd;
  bool probe_refused;           /* said once that the probe cannot connect */
  unsigned seed;
};

static void __attribute__ ((format (printf, 1, 2)))
say (const char *fmt, ...)
{
  char stamp[32];
  time_t t = time (NULL);
  va_list ap;

  strftime (stamp, sizeof stamp, "%F %T", localtime (&t));
  fprintf (stderr, "%s pdio-supervise[%d]: ", stamp, (int) getpid ());
  va_start (ap, fmt);
  vfprintf (stderr, fmt, ap);
  va_end (ap);
  fputc ('\n', stderr);
  fflush (stderr);
}

static void
save (struct link *l)
{
  struct record cur;

  /* mount.pdio sets autoclear after attach. */
  if (record_load_device (l->rec.device, &cur) == 0) {
    if (strcmp (cur.backend, l->rec.backend) != 0)
      return;
    l->rec.autoclear = cur.autoclear;
  }
  for (char *p = l->rec.link_why; *p; p++)
    if (*p == '\n')
      *p = ' ';
  if (record_write (&l->rec) == -1)
    say ("cannot write the record of %s: %m", l->rec.device);
}

static void
set_link (struct link *l, const char *state, const char *why)
{
  snprintf (l->rec.link, sizeof l->rec.link, "%s", state);
  snprintf (l->rec.link_why, sizeof l->rec.link_why, "%s", why);
  l->rec.link_since = time (NULL);
  save (l);
}

/* The device is gone (autoclear, a detach by other means): so is the
 * reason to watch it (state_forget_device says which files go).
 */
static void __attribute__ ((noreturn))
device_gone (struct link *l, unsigned lock_ms)
{
  say ("%s is no longer connected: exiting", l->rec.device);
  watchdog_close (&l->wd);
  placement_leave (l->rec.cgroup);
  state_forget_device (&l->rec, l->idx, lock_ms);
  claim_drop (l->claim, l->rec.name);
  exit (EXIT_OK);
}

/* The signals that end a supervisor: a detach (SIGTERM), with the device
 * staying for it to disconnect; or, if the device went already, cleaning
 * up.  false if none is pending.
 */
static void
signals (struct link *l)
{
  struct signalfd_siginfo si;

  while (read (l->sfd, &si, sizeof si) == sizeof si) {
    if (si.ssi_signo == SIGCHLD || si.ssi_signo == SIGUSR1)
      continue;
    if (!device_is_ours (&l->rec))
      device_gone (l, 2000);
    say ("signal %d: exiting; %s stays", si.ssi_signo, l->rec.device);
    watchdog_close (&l->wd);
#ifdef PDIO_TEST_BREAKS
    if (test_break ("supervisor-exits-late"))
      test_exit_late (EXIT_OK);
#endif
    exit (EXIT_OK);
  }
}

/* Waits ms, answering signals and noticing the device going. */
static void
pause_ms (struct link *l, long ms)
{
  struct pollfd p = { .fd = l->sfd, .events = POLLIN };

  if (poll (&p, 1, ms) > 0)
    signals (l);
}

/* Set when kTLS left a socket unusable (TX taken, RX refused): later
 * connections go through the relay without trying it again.
 */
static bool ktls_unusable;

/* pdio_ktls_enable for both directions.  The test build's ktls-rx-refused
 * leaves the socket as a kernel that takes TLS_TX and refuses TLS_RX does
 * (its send side in the kernel, GnuTLS's state behind it): -2.
 */
static int
ktls_enable (struct tls_client *t, int fd, char *why, size_t len)
{
  if (test_break ("ktls-rx-refused") &&
      pdio_ktls_enable (tls_client_session (t), fd, false, why, len) == 0) {
    snprintf (why, len, "setsockopt TLS_RX: refused by the test break "
              "ktls-rx-refused; the send side is in the kernel already: "
              "the connection cannot go on");
    return -2;
  }
  return pdio_ktls_enable (tls_client_session (t), fd, true, why, len);
}

/* kTLS: the session's keys to the kernel, both directions (the socket is
 * the nbd driver's to read and write).  Setting TCP_ULP "tls" loads the
 * module on demand (the kernel's request_module, as root).  1 done, 0
 * refused with the socket as it was, -1 the socket lost.
 */
static int
try_ktls (struct tls_client *t, int fd, char *why, size_t len)
{
  if (test_break ("no-ktls")) {
    snprintf (why, len, "kTLS refused by the test break no-ktls");
    return 0;
  }
  if (ktls_unusable) {
    snprintf (why, len, "kTLS failed on an earlier connection");
    return 0;
  }
  switch (ktls_enable (t, fd, why, len)) {
  case 0:
    return 1;
  case -2:
    ktls_unusable = true;
    return -1;
  default:
    return 0;
  }
}

int
link_hand_over (int fd, struct tls_client *t, struct relay **relay,
                char *mode, size_t mlen, char *note, size_t nlen,
                char *why, size_t len)
{
  int kfd;

  *relay = NULL;
  mode[0] = note[0] = '\0';
  if (t == NULL)
    return fd;
  /* Bytes GnuTLS holds would be lost to the kernel (a ticket is not:
   * GnuTLS consumed it while reading NBD_OPT_GO's replies).
   */
  if (!tls_client_idle (t))
    snprintf (note, nlen, "GnuTLS holds data received after the "
              "handshake");
  else
    switch (try_ktls (t, fd, note, nlen)) {
    case 1:
      snprintf (mode, mlen, "ktls");
      note[0] = '\0';
      tls_client_free (t);
      return fd;
    case -1:
      snprintf (why, len, "kTLS: %s (the next connection uses the relay)",
                note);
      return -2;
    }
  *relay = relay_start (t, &kfd, why, len);
  if (*relay == NULL)
    return -1;
  snprintf (mode, mlen, "relay");
  return kfd;
}

/* One attempt: a new connection, the same export, handed to the device.
 * false with why set.
 */
static bool
reconnect_once (struct link *l, char *why, size_t len)
{
  struct nbd_offer now;
  struct tls_client *t;
  struct relay *relay;
  char mode[8], note[256];
  int fd = nbd_handshake_uri (&l->uri, CONNECT_MS, &now, &t, why, len);
  int kfd;
  const struct nbdnl_change c = {
    .backend = l->rec.backend, .fds = &kfd, .n = 1, .client_flags = -1,
  };

  if (fd == -1)
    return false;
  if (!test_break ("no-export-check") &&
      !link_same_export (&l->first, &now, l->rec.size, why, len)) {
    tls_client_free (t);
    close (fd);
    return false;
  }
  kfd = link_hand_over (fd, t, &relay, mode, sizeof mode, note, sizeof note,
                        why, len);
  if (kfd < 0) {
    tls_client_free (t);
    close (fd);
    return false;
  }
  l->fd = dup (kfd);
  if (!nbdnl_reconfigure (l->idx, &c, why, len)) {
    if (relay)
      relay_stop (relay);
    else
      close (fd);
    close (kfd);
    close (l->fd);
    l->fd = -1;
    return false;
  }
  if (relay)
    close (kfd);                /* the kernel holds it now */
  else
    close (fd);
  if (note[0])
    say ("%s: TLS through the relay: %s", l->rec.device, note);
  l->relay = relay;
  snprintf (l->rec.tls, sizeof l->rec.tls, "%s", mode);
  return true;
}

/* Discards LINK_DEAD events already queued: they are about the
 * connection just replaced.
 */
static void
drain_events (struct link *l)
{
  for (int i = 0; l->ev && i < 1000 && nbdnl_events_read (l->ev) >= -2; i++)
    ;
}

/* Waits up to ms for the kernel to mark the device's connection dead
 * (LINK_DEAD): a new socket handed over before that would be ignored.
 */
static bool
await_kernel_dead (struct link *l, long ms)
{
  long end = now_ms () + ms;

  while (l->ev) {
    struct pollfd p = { .fd = nbdnl_events_fd (l->ev), .events = POLLIN };
    long left = end - now_ms ();
    int idx;

    while ((idx = nbdnl_events_read (l->ev)) >= -2)
      if (idx == l->idx)
        return true;
    if (left <= 0 || poll (&p, 1, left) <= 0)
      return false;
  }
  return false;
}

static void
outage (struct link *l, const char *cause, bool kernel_knows)
{
  char why[PATH_MAX + 256] = "";
  long t0 = now_ms (), failed_at = t0 + l->rec.dead_timeout * 1000L;
  unsigned attempt = 0;

  if (l->fd >= 0) {
    /* The kernel's receiver ends on this too, if it had not yet. */
    shutdown (l->fd, SHUT_RDWR);
    close (l->fd);
    l->fd = -1;
  }
  relay_stop (l->relay);
  l->relay = NULL;
  watchdog_forget (&l->wd);
  if (!kernel_knows && !await_kernel_dead (l, 5000))
    say ("%s: no LINK_DEAD from the kernel within 5 s; handing it a new "
         "connection all the same", l->rec.device);
  l->rec.outages++;
  say ("link of %s to %s lost (%s): reconnecting", l->rec.device,
       l->rec.image, cause);
  set_link (l, "reconnecting", cause);
  if (test_break ("no-reconnect")) {
    say ("not reconnecting (test break no-reconnect)");
    return;
  }
  for (;;) {
    if (!device_is_ours (&l->rec))
      device_gone (l, 30000);
    if (reconnect_once (l, why, sizeof why))
      break;
    attempt++;
    if (attempt == 1 || attempt % 10 == 0)
      say ("reconnect attempt %u: %s", attempt, why);
    if (now_ms () >= failed_at && strcmp (l->rec.link, "failed") != 0) {
      say ("%s: no link for %u s (the dead-connection timeout): the kernel "
           "fails its new requests now; still trying",
           l->rec.device, l->rec.dead_timeout);
      set_link (l, "failed", why);
    }
    else if (strcmp (l->rec.link_why, why) != 0 &&
             strcmp (l->rec.link, "failed") != 0) {
      /* What stands in the way now, for pdio list. */
      snprintf (l->rec.link_why, sizeof l->rec.link_why, "%s", why);
      save (l);
    }
    pause_ms (l, link_backoff_ms (attempt - 1, (unsigned) rand_r (&l->seed)));
  }
  l->rec.last_outage_ms = now_ms () - t0;
  drain_events (l);
  say ("link of %s to %s back after %ld ms (outage %u, %u failed "
       "attempt(s))", l->rec.device, l->rec.image, l->rec.last_outage_ms,
       l->rec.outages, attempt);
  set_link (l, "connected", "");
}

/* The watchdog's turn, as in supervise.c, on a connection of its own to
 * the same export.  A hung server is made a dead link.
 */
static void
watch (struct link *l)
{
  long now = now_ms ();

  if (test_break ("no-watchdog") || strcmp (l->rec.link, "connected") ||
      l->uri.tls)
    return;
  if (l->wd.fd < 0 && now >= l->wd.due) {
    struct nbd_offer o;
    char why[512];
    int fd = nbd_handshake_uri (&l->uri, CONNECT_MS, &o, NULL, why,
                                sizeof why);

    if (fd >= 0)
      watchdog_attach (&l->wd, fd, l->rec.block_size, now_ms ());
    else {
      /* Not an answer owed: a server may cap its clients (qemu-nbd
       * serves one by default, and leaves the next in its backlog), and
       * the device's own link still works.  Only a probe on a connection
       * it accepted is judged; this one is tried again much later.
       */
      if (!l->probe_refused)
        say ("%s: the watchdog's probe connection failed (%s): the "
             "server is watched through the device's link only, for now",
             l->rec.device, why);
      l->probe_refused = true;
      l->wd.due = now_ms () + PROBE_RETRY_MS;
    }
  }
  if (watchdog_run (&l->wd, now_ms (), nbd_in_flight (l->idx)) ==
      WATCHDOG_HUNG) {
    char cause[128];

    snprintf (cause, sizeof cause, "the server has not answered for %ld "
              "ms", watchdog_owed_ms (&l->wd, now_ms ()));
    outage (l, cause, false);
  }
}

static void
detach_stdio (const struct record *r)
{
  char path[PATH_MAX];
  int fd;

  state_path (r->device, "supervisor.log", path, sizeof path);
  fd = open (path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd >= 0) {
    dup2 (fd, STDOUT_FILENO);
    dup2 (fd, STDERR_FILENO);
    close (fd);
  }
  fd = open ("/dev/null", O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    dup2 (fd, STDIN_FILENO);
    close (fd);
  }
}

void
supervise_link (const struct record *r, const struct nbd_uri *u,
                const struct nbd_offer *first, int notify_fd, int claim,
                struct nl_sock *ev, int link_fd, struct relay *relay,
                const struct protection *p)
{
  static struct link l;
  sigset_t set;
  char why[256];

  l.rec = *r;
  l.uri = *u;
  l.first = *first;
  l.idx = nbd_index (r->device);
  l.fd = link_fd;
  l.relay = relay;
  l.claim = claim;
  l.seed = (unsigned) getpid () ^ (unsigned) now_ms ();
  watchdog_init (&l.wd);
  prctl (PR_SET_NAME, "pdio-supervise");
  sigemptyset (&set);
  sigaddset (&set, SIGCHLD);
  sigaddset (&set, SIGTERM);
  sigaddset (&set, SIGINT);
  sigaddset (&set, SIGHUP);
  sigaddset (&set, SIGUSR1);
  sigprocmask (SIG_BLOCK, &set, NULL);
  l.sfd = signalfd (-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
  detach_stdio (r);
  if (write (notify_fd, "1", 1) != 1)
    say ("cannot tell pdio attach that %s is up: %m", r->device);
  close (notify_fd);
  l.ev = ev ? ev : nbdnl_events_open (why, sizeof why);
  if (l.ev == NULL)
    say ("%s: no LINK_DEAD events (%s): watching the socket only",
         r->device, why);
  say ("supervising %s: %s, %llu bytes, block size %u, dead-connection "
       "timeout %u s%s", r->device, r->image, (unsigned long long) r->size,
       r->block_size, r->dead_timeout, r->readonly ? ", read-only" : "");
  if (r->tls[0])
    say ("%s: TLS by %s", r->device, strcmp (r->tls, "ktls") == 0
         ? "the kernel (kTLS)" : "the supervisor's relay");
  if (p->io_flusher[0] || p->oom[0])
    say ("warning: protections refused: %s%s%s", p->io_flusher,
         p->io_flusher[0] && p->oom[0] ? "; " : "", p->oom);

  for (;;) {
    struct pollfd pf[4] = {
      { .fd = l.sfd, .events = POLLIN },
      { .fd = l.ev ? nbdnl_events_fd (l.ev) : -1, .events = POLLIN },
      { .fd = l.wd.fd, .events = POLLIN },
      /* Only hang-ups and errors: the data is the kernel's to read. */
      { .fd = l.fd, .events = POLLRDHUP },
    };
    long wait = watchdog_wait_ms (&l.wd, now_ms ());
    unsigned outages;

    if (poll (pf, 4, wait < 1000 ? wait : 1000) == -1 && errno != EINTR) {
      say ("poll: %m");
      msleep (POLL_RETRY_MS);
    }
    if (pf[0].revents & POLLIN)
      signals (&l);
    outages = l.rec.outages;
    if (pf[1].revents & POLLIN) {
      int idx;
      bool dead = false;

      while ((idx = nbdnl_events_read (l.ev)) >= -2)
        if (idx == l.idx)
          dead = true;
      if (dead)
        outage (&l, "the kernel reports the connection dead", true);
    }
    /* Not if the link was replaced meanwhile: what poll saw was the old
     * socket's.
     */
    if (l.fd >= 0 && outages == l.rec.outages &&
        (pf[3].revents & (POLLRDHUP | POLLHUP | POLLERR))) {
      int err = 0;
      socklen_t elen = sizeof err;
      char cause[160];

      getsockopt (l.fd, SOL_SOCKET, SO_ERROR, &err, &elen);
      if (err)
        snprintf (cause, sizeof cause, "the connection failed: %s",
                  strerror (err));
      else
        snprintf (cause, sizeof cause, "the server closed the connection");
      outage (&l, cause, false);
    }
    watch (&l);
    if (!device_is_ours (&l.rec))
      device_gone (&l, 30000);
  }
}
