/* SPDX-License-Identifier: BSD-3-Clause */
/* The supervisor: one small single-threaded process per attached device,
 * left behind by pdio attach (it is attach's child, in a session of its
 * own).  It is not on the data path: the kernel talks to the server over
 * the sockets pdio handed it.  It is the server's subreaper, so it learns
 * how the server died (SIGKILL, abort, exit status); it then starts a new
 * server (daemon.c), hands the device fresh connections with
 * NBD_CMD_RECONFIGURE, and the kernel resends what was in flight: the
 * filesystem sees a pause, not an error.
 *
 * pdio restart (SIGUSR1) with pdio's own server is a hand-over instead:
 * the new server takes the live connections from the old one (pdio serve
 * --take-over, src/server/handover.h) and the kernel sees nothing.  If
 * that fails at any step, the old server is killed and replaced as after
 * a crash, and the record's reason says so.  nbdkit cannot hand over: a
 * restart of it is always the kill-and-reconnect.
 *
 * Bounded: each death gets a few attempts with backoff, and more than
 * MAX_RESTARTS restarts within RESTART_WINDOW_S seconds is a crash loop;
 * either way it gives up, records why, and the kernel fails requests once
 * the dead-connection timeout has passed.
 *
 * A server that lives but stops answering (SIGSTOP, a disk that never
 * completes) is the watchdog's (watchdog.c): with one connection the
 * kernel's request timeout is 0 and the kernel would wait on it forever.
 * The supervisor kills it and restarts it as if it had died.
 *
 * If the supervisor dies, the device keeps working (nothing it holds is
 * on the data path) and pdio detach still cleans up from the record.
 * It holds the image's claim (claim.c) for the device's life.  When the
 * device goes away under it (autoclear, or a detach by other means) it
 * stops the server, removes the state and exits.  "The device" is the
 * one connected with this attachment's backend identifier: once
 * disconnected, its number may be given to another attachment at once,
 * and that one is not ours to watch, restart or clean up after.
 */
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "server.h"
#include "pdio.h"

#define RESTART_WINDOW_S 60
#define MAX_RESTARTS 10
/* Per death: attempts with backoff 0.25, 0.5, 1, 2, 4 s between them.  A
 * start that failed for a reason nothing announces the end of (the image
 * held by another process, memory, a file being replaced) is tried again
 * later; the usual reason, the dead server's lock, is waited for as an
 * event before each attempt (image_lock_free).
 */
#define START_ATTEMPTS 6
#define START_BACKOFF_MS 250
/* The dead server's io_uring rings, which hold the image's lock, are torn
 * down asynchronously after it dies.
 */
#define LOCK_WAIT_MS 10000
/* A server that handed its connections over exits at once; one that does
 * not within this long is killed (it holds nothing the device needs).
 */
#define HANDED_EXIT_MS 5000
/* A connection that died may have died with its server, whose death the
 * supervisor is then told of by SIGCHLD: it waits this long for the
 * server's exit first, so that a crash is handled as a crash.
 */
#define DYING_SERVER_MS 200
struct sup {
  struct record rec;
  struct server_opts so;
  char pidfile[PATH_MAX], log[PATH_MAX];
  int idx;
  struct nl_sock *ev;
  int claim;                    /* the image's claim, or -1 */
  bool restart_requested;
  struct watchdog wd;
  long hung_ms;                 /* the server was killed as hung after
                                   owing an answer this long, or 0 */
  bool stalled;                 /* after it was given longer, stalled */
  char requested_how[PATH_MAX + 320]; /* why the hand-over was not done */
  long recent[MAX_RESTARTS];    /* ms of the last restarts, a ring */
  unsigned nrecent;
  struct pdio_devstats_map stats; /* the device's counters, once mapped */
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
stats_error (const char *fmt, va_list args)
{
  char msg[PATH_MAX + 128];

  vsnprintf (msg, sizeof msg, fmt, args);
  say ("%s: not counting restarts there", msg);
}

/* The device's counters, where the servers keep them (pdio serve
 * --stats): the supervisor adds what only it sees.  NULL without (nbdkit)
 * or if the file cannot be had; tried again next time.
 */
static struct pdio_devstats *
stats (struct sup *s)
{
  const struct pdio_log log = { .error = stats_error };

  if (s->stats.h == NULL && s->so.stats[0])
    pdio_devstats_open (s->so.stats, 0, false, false, &log, &s->stats);
  return s->stats.h;
}

/* One more of a counter, and a pause of ms (or -1: none) the device saw. */
static void
count (struct sup *s, size_t field, long pause_ms)
{
  struct pdio_devstats *h = stats (s);
  uint64_t *p, ns;

  if (h == NULL)
    return;
  p = (uint64_t *) ((char *) h + field);
  pdio_devstats_set (p, pdio_devstats_get (p) + 1);
  if (pause_ms < 0)
    return;
  ns = (uint64_t) pause_ms * 1000000;
  pdio_devstats_set (&h->last_pause_ns, ns);
  if (ns > pdio_devstats_get (&h->longest_pause_ns))
    pdio_devstats_set (&h->longest_pause_ns, ns);
}

bool
pid_is_supervisor (pid_t pid)
{
  char comm[64];

  return pid > 0 && pid_alive (pid) && proc_comm (pid, comm, sizeof comm) &&
    strcmp (comm, "pdio-supervise") == 0;
}

void
describe_status (int status, char *buf, size_t len)
{
  if (WIFSIGNALED (status)) {
    const char *abbrev = sigabbrev_np (WTERMSIG (status));

    if (abbrev)
      snprintf (buf, len, "killed by SIG%s%s", abbrev,
                WCOREDUMP (status) ? " (core dumped)" : "");
    else
      snprintf (buf, len, "killed by signal %d", WTERMSIG (status));
  }
  else if (WIFEXITED (status))
    snprintf (buf, len, "exited with status %d", WEXITSTATUS (status));
  else
    snprintf (buf, len, "ended (wait status %#x)", status);
}

/* The record's reason is one line of "key=value". */
static void
set_reason (struct sup *s, const char *fmt, ...)
{
  va_list ap;

  va_start (ap, fmt);
  vsnprintf (s->rec.reason, sizeof s->rec.reason, fmt, ap);
  va_end (ap);
  for (char *p = s->rec.reason; *p; p++)
    if (*p == '\n')
      *p = ' ';
}

/* What other commands change in the record: mount.pdio sets autoclear
 * after attach, pdio resize the size.  A reconnect must expect the size
 * the device has now, not the one it had at attach.  false if the record
 * at the device's number is another attachment's.
 */
static bool
refresh (struct sup *s)
{
  struct record cur;

  if (record_load_device (s->rec.device, &cur) != 0)
    return true;
  /* The number went to another attachment: its record is not ours. */
  if (strcmp (cur.backend, s->rec.backend) != 0)
    return false;
  s->rec.autoclear = cur.autoclear;
  if (!test_break ("supervisor-stale-size"))
    s->rec.size = cur.size;
  return true;
}

static void
save (struct sup *s)
{
  if (!refresh (s))
    return;
  if (record_write (&s->rec) == -1)
    say ("cannot write the record of %s: %m", s->rec.device);
}

/* The server log's last line containing needle, or false. */
static bool
log_has (const char *log, const char *needle)
{
  char line[1024];
  bool found = false;
  FILE *fp = fopen (log, "re");

  if (fp == NULL)
    return false;
  while (fgets (line, sizeof line, fp))
    if (strstr (line, needle))
      found = true;
  fclose (fp);
  return found;
}

static void
last_log_line (const char *log, char *buf, size_t len)
{
  char line[1024];
  FILE *fp = fopen (log, "re");

  buf[0] = '\0';
  if (fp == NULL)
    return;
  while (fgets (line, sizeof line, fp))
    if (line[0] != '\n') {
      /* Truncated to buf: the start of a message says what it is. */
      size_t n = strnlen (line, len - 1);

      memcpy (buf, line, n);
      buf[n] = '\0';
    }
  fclose (fp);
  buf[strcspn (buf, "\n")] = '\0';
}

/* Starts a server with so, logging to the device's log; the previous
 * server's messages stay beside it for whoever investigates.  Its pid, or
 * <= 0 with why ending in the new log's last line (what it died of).
 */
static pid_t
start_logged (struct sup *s, const struct server_opts *so, char *why,
              size_t len)
{
  char prev[PATH_MAX + 8], last[512];
  pid_t pid;

  snprintf (prev, sizeof prev, "%s.prev", s->log);
  rename (s->log, prev);
  pid = server_start (so, s->log, why, len);
  if (pid <= 0) {
    last_log_line (s->log, last, sizeof last);
    if (last[0]) {
      size_t n = strlen (why);

      snprintf (why + n, len - n, ": %s", last);
    }
  }
  return pid;
}

static void
give_up (struct sup *s, const char *why)
{
  s->rec.gave_up = true;
  s->rec.server_pid = 0;
  set_reason (s, "gave up: %s", why);
  save (s);
  say ("giving up on %s: %s; the device fails requests once its "
       "dead-connection timeout (%u s) has passed", s->rec.device, why,
       s->rec.dead_timeout);
}

/* One attempt: a server, then fresh connections for the device. */
static bool
start_and_reconnect (struct sup *s, char *why, size_t len)
{
  char id[BACKEND_ID_MAX], alias[ALIAS_MAX + 1];
  pid_t pid;
  int status;

  /* The right image, always: the path may name another file now (the
   * image replaced, or moved and another put there).  The kernel would
   * take the new server's sockets; its data would not be the device's.
   * (A path that names nothing is left to the server, which says so.)
   */
  backend_alias (s->rec.backend, alias);
  if (s->rec.backend[0] && !test_break ("no-identity-check") &&
      backend_id (s->rec.image, alias, id, why, len)) {
    if (strcmp (id, s->rec.backend) != 0) {
      int n = snprintf (why, len, "%s is not the image attached any more "
                        "(it is %s, the device's is ", s->rec.image, id);

      if (n > 0 && (size_t) n < len)
        snprintf (why + n, len - n, "%s): not serving it", s->rec.backend);
      return false;
    }
  }
  if (!image_lock_free (s->rec.image, LOCK_WAIT_MS)) {
    snprintf (why, len, "%s is still locked by another process after %d s",
              s->rec.image, LOCK_WAIT_MS / 1000);
    return false;
  }
  pid = start_logged (s, &s->so, why, len);
  if (pid <= 0)
    return false;
  s->rec.server_pid = pid;
  refresh (s);
  if (device_reconnect (&s->rec, why, len))
    return true;
  kill (pid, SIGKILL);
  waitpid (pid, &status, 0);
  s->rec.server_pid = 0;
  return false;
}

/* Discards LINK_DEAD events already queued: they are about the
 * connections just replaced.
 */
static void
drain_events (struct sup *s)
{
  for (int i = 0; s->ev && i < 1000 && nbdnl_events_read (s->ev) >= -2; i++)
    ;
}

static void
restart (struct sup *s, long died)
{
  char why[PATH_MAX + 512] = "";
  long t;

  /* A crash loop is not worth following. */
  t = now_ms ();
  if (s->nrecent >= MAX_RESTARTS &&
      t - s->recent[s->nrecent % MAX_RESTARTS] < RESTART_WINDOW_S * 1000L) {
    snprintf (why, sizeof why, "%d restarts within %d s", MAX_RESTARTS,
              RESTART_WINDOW_S);
    give_up (s, why);
    return;
  }
  s->recent[s->nrecent++ % MAX_RESTARTS] = t;
  for (int attempt = 0; attempt < START_ATTEMPTS; attempt++) {
    if (attempt) {
      say ("attempt %d failed: %s", attempt, why);
      if (attempt == START_ATTEMPTS - 1 && test_break ("no-give-up"))
        attempt = 1;
      msleep (START_BACKOFF_MS << (attempt - 1));
    }
    if (start_and_reconnect (s, why, sizeof why)) {
      s->rec.gave_up = false;
      save (s);
      drain_events (s);
      count (s, offsetof (struct pdio_devstats, restarts), now_ms () - died);
      say ("restart %u: server pid %d serves %s again; connections handed "
           "to %s %ld ms after the old server died", s->rec.restarts,
           (int) s->rec.server_pid, s->rec.image, s->rec.device,
           now_ms () - died);
      return;
    }
  }
  give_up (s, why);
}

static void
server_died (struct sup *s, int status)
{
  char how[128];
  long died = now_ms ();

  describe_status (status, how, sizeof how);
  say ("server pid %d %s", (int) s->rec.server_pid, how);
  watchdog_forget (&s->wd);
  s->rec.restarts++;
  if (s->restart_requested)
    set_reason (s, "pdio restart%s", s->requested_how);
  else if (s->hung_ms)
    set_reason (s, "server hung: no answer for %ld s%s", s->hung_ms / 1000,
                s->stalled ? " (stalled, past the bound)" : "");
  else if (log_has (s->log, "raw_send_socket: Assertion"))
    /* Debian 12's nbdkit 1.32.5, when a client hangs up with replies
     * queued (fixed upstream in 1.33.10).
     */
    set_reason (s, "server %s (nbdkit's raw_send_socket assertion)", how);
  else
    set_reason (s, "server %s", how);
  s->restart_requested = false;
  s->hung_ms = 0;
  s->stalled = false;
  s->rec.server_pid = 0;
  save (s);
  if (test_break ("no-restart"))
    return;
  restart (s, died);
}

static void
reap (struct sup *s)
{
  pid_t pid;
  int status;

  while ((pid = waitpid (-1, &status, WNOHANG)) > 0)
    if (pid == s->rec.server_pid)
      server_died (s, status);
}

/* A connection died while the server lives (a request timed out and the
 * kernel gave up on that socket): fresh connections, same server.
 */
static void
link_dead (struct sup *s)
{
  char why[PATH_MAX + 256];

  wait_gone (s->rec.server_pid, DYING_SERVER_MS);
  reap (s);
  if (s->rec.gave_up || s->rec.server_pid <= 0 ||
      !pid_alive (s->rec.server_pid))
    return;
  refresh (s);
  if (device_reconnect (&s->rec, why, sizeof why)) {
    say ("a connection of %s died with the server alive: handed it a fresh "
         "one", s->rec.device);
    count (s, offsetof (struct pdio_devstats, reconnects), -1);
    drain_events (s);
    return;
  }
  say ("a connection of %s died and the server (pid %d) does not take new "
       "ones (%s): killing it to restart it", s->rec.device,
       (int) s->rec.server_pid, why);
  kill (s->rec.server_pid, SIGKILL);
}

/* The server has owed the watchdog an answer past its deadline, and is
 * not stalled (or has been for too long): kill it (SIGKILL works on a
 * stopped process too); server_died restarts it and records why.
 */
static void
server_hung (struct sup *s, const char *stall)
{
  s->hung_ms = watchdog_owed_ms (&s->wd, now_ms ());
  s->stalled = s->wd.deadline > WATCHDOG_HUNG_MS;
  if (s->stalled)
    say ("server pid %d has not answered for %ld ms, stalled past the %d s "
         "bound (%s): killing it to restart it", (int) s->rec.server_pid,
         s->hung_ms, WATCHDOG_STALL_MAX_MS / 1000,
         stall[0] ? stall : "no longer");
  else
    say ("server pid %d has not answered for %ld ms: killing it to restart "
         "it", (int) s->rec.server_pid, s->hung_ms);
  watchdog_forget (&s->wd);
  kill (s->rec.server_pid, SIGKILL);
}

/* The deadline passed: hung, or stalled in the kernel or under memory
 * pressure (watchdog_stalled), which earns it more time, said each time.
 */
static void
deadline_passed (struct sup *s)
{
  struct stall_reading r;
  char why[256] = "";
  long now;

  if (!test_break ("watchdog-ignores-stall")) {
    stall_read (s->rec.server_pid, &r);
    now = now_ms ();
    if (watchdog_stalled (&s->wd, now, &r, why, sizeof why)) {
      say ("server pid %d stalled (%s): waiting longer (no answer for %ld "
           "s; replaced at %d s)", (int) s->rec.server_pid, why,
           watchdog_owed_ms (&s->wd, now) / 1000,
           WATCHDOG_STALL_MAX_MS / 1000);
      return;
    }
  }
  server_hung (s, why);
}

/* The watchdog's turn: a connection of its own when it has none and a
 * probe is due, then its probe and verdict.  A handshake with a server
 * that accepts and says nothing takes up to negotiate.c's 10 s: it then
 * counts as an answer owed since the attempt began.
 */
static bool
watching (const struct sup *s)
{
  return !s->rec.gave_up && s->rec.server_pid > 0 && !s->hung_ms &&
    !test_break ("no-watchdog");
}

static void
watch (struct sup *s)
{
  long now = now_ms ();

  if (!watching (s))
    return;
  if (s->wd.fd < 0 && now >= s->wd.due) {
    struct nbd_offer o;
    char why[PATH_MAX + 64];
    int fd = nbd_handshake (s->rec.socket, &o, why, sizeof why);

    if (fd >= 0)
      watchdog_attach (&s->wd, fd, s->rec.block_size, now_ms ());
    else
      watchdog_unreachable (&s->wd, now);
  }
  if (watchdog_run (&s->wd, now_ms (), nbd_in_flight (s->idx)) ==
      WATCHDOG_HUNG)
    deadline_passed (s);
}

/* The device is gone (autoclear, or disconnected by other means): so is
 * the reason to serve it (state_forget_device says which files go).
 */
static void __attribute__ ((noreturn))
device_gone (struct sup *s, unsigned lock_ms)
{
  say ("%s is no longer connected: stopping server pid %d and exiting",
       s->rec.device, (int) s->rec.server_pid);
  watchdog_close (&s->wd);
  if (s->rec.server_pid > 0) {
    server_stop (s->rec.server_pid);
    waitpid (s->rec.server_pid, NULL, WNOHANG);
  }
  placement_leave (s->rec.cgroup);
  image_lock_free (s->rec.image, 2000);
  state_forget_device (&s->rec, s->idx, lock_ms);
  claim_drop (s->claim, s->rec.name);
  exit (EXIT_OK);
}

/* Waits for the server that handed over to exit; kills it if it does not.
 * It is our child, unless a supervisor before us started it.
 */
static void
reap_handed (pid_t old)
{
  int status;

  if (!wait_gone (old, HANDED_EXIT_MS)) {
    say ("server pid %d handed over but did not exit within %d s: "
         "killing it", (int) old, HANDED_EXIT_MS / 1000);
    kill (old, SIGKILL);
  }
  waitpid (old, &status, 0);
}

/* pdio's own server: a successor takes the live connections over.  true
 * once it serves them and the old server is gone; false with why set,
 * the old server then alive or not.
 */
static bool
hand_over (struct sup *s, char *why, size_t len)
{
  struct server_opts so = s->so;
  pid_t old = s->rec.server_pid, pid;
  long t0 = now_ms ();

  so.take_over = true;
  pid = start_logged (s, &so, why, len);
  if (pid <= 0)
    return false;
  /* The requests waited at most the successor's start (the old server
   * serves until the successor asks): an upper bound of the pause.
   */
  count (s, offsetof (struct pdio_devstats, handovers), now_ms () - t0);
  reap_handed (old);
  s->rec.server_pid = pid;
  say ("server pid %d took the live connections of %s over from pid %d "
       "in %ld ms", (int) pid, s->rec.device, (int) old, now_ms () - t0);
  return true;
}

static void
requested (struct sup *s)
{
  char why[PATH_MAX + 256];

  say ("restart requested (pdio restart)");
  s->requested_how[0] = '\0';
  if (s->so.native && s->rec.server_pid > 0 &&
      pid_alive (s->rec.server_pid)) {
    if (test_break ("handover-off"))
      snprintf (why, sizeof why, "switched off (test break handover-off)");
    else if (hand_over (s, why, sizeof why)) {
      if (test_break ("handover-stall")) {
        kill (s->rec.server_pid, SIGSTOP);
        sleep (3);
        kill (s->rec.server_pid, SIGCONT);
      }
      /* Not a death: it does not count towards a crash loop. */
      s->rec.restarts++;
      s->rec.gave_up = false;
      set_reason (s, "pdio restart: live connections handed over");
      save (s);
      return;
    }
    say ("hand-over failed: %s; falling back to killing the server and "
         "handing %s fresh connections", why, s->rec.device);
    /* What happened first: a long why may be cut in the record. */
    snprintf (s->requested_how, sizeof s->requested_how,
              ": hand-over failed, fresh connections instead (%s)", why);
  }
  if (s->rec.server_pid > 0 && pid_alive (s->rec.server_pid)) {
    /* SIGKILL, not SIGTERM: nbdkit answers the requests that arrive while
     * it shuts down with errors (ESHUTDOWN), which the kernel passes up
     * as I/O errors (seen in the guest test); a killed server answers
     * nothing, and the kernel resends.  Nothing is lost: the server
     * writes through (O_DIRECT, honest flush), and a write it never
     * acknowledged is resent.
     */
    s->restart_requested = true;
    kill (s->rec.server_pid, SIGKILL);
    return;
  }
  /* Given up earlier, or gone with a failed hand-over: the user may have
   * fixed what was wrong.
   */
  s->rec.restarts++;
  set_reason (s, "pdio restart%s", s->requested_how);
  s->nrecent = 0;
  restart (s, now_ms ());
}

/* pdio restart on a device whose supervisor is gone: the new supervisor
 * replaces the server, which is not its child (it could not learn how it
 * dies), with one of its own.  A server that died unsupervised is simply
 * brought back.
 */
static void
take_over (struct sup *s, const char *old_cgroup)
{
  pid_t old = s->rec.server_pid;
  char why[128];

  say ("taking over %s, whose supervisor is gone: replacing server pid %d",
       s->rec.device, (int) old);
  if (old > 0 && pid_alive (old) && pid_is_server (old)) {
    kill (old, SIGKILL);
    if (!wait_gone (old, 10000)) {
      snprintf (why, sizeof why, "the old server, pid %d, does not exit",
                (int) old);
      give_up (s, why);
      return;
    }
  }
  /* The old supervisor's cgroup, now empty; ours is where the new
   * server starts.
   */
  if (strcmp (old_cgroup, s->rec.cgroup) != 0)
    placement_remove (old_cgroup);
  s->rec.restarts++;
  set_reason (s, "pdio restart (its supervisor was gone)");
  s->rec.server_pid = 0;
  save (s);
  restart (s, now_ms ());
}

/* stdout and stderr to RUNDIR/nbdN.supervisor.log, stdin from /dev/null. */
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

/* Once in the log: what the supervisor's protections are, and which
 * were refused.  Its server inherits them (pdio serve sets the flag again
 * itself, and says so in its own log if it cannot).
 */
static void
log_protection (const struct sup *s, const struct protection *p)
{
  if (p->io_flusher[0])
    say ("warning: %s: going on without it; under memory pressure the "
         "server's allocations may wait on writeback to %s itself",
         p->io_flusher, s->rec.device);
  if (p->oom[0])
    say ("warning: %s: going on; the OOM killer may pick the server",
         p->oom);
  if (p->lock[0])
    say ("warning: --swap: %s: going on; the supervisor may be swapped out",
         p->lock);
  say ("memory: PR_SET_IO_FLUSHER %s, oom_score_adj %s%s; %s%s%s",
       p->io_flusher[0] ? "not set" : "set", p->oom[0] ? "unchanged" : "-1000",
       s->rec.swap ? (p->lock[0] ? ", memory not locked"
                                 : ", memory locked (--swap)") : "",
       p->cgroup[0] ? "in cgroup " : "stays in its cgroup (",
       p->cgroup[0] ? p->cgroup : p->placed, p->cgroup[0] ? "" : ")");
}

void
supervise (const struct record *r, const struct server_opts *so,
           int notify_fd, int claim, bool adopt, struct nl_sock *ev,
           const struct protection *prot)
{
  static struct sup s;
  struct signalfd_siginfo si;
  char why[256], old_cgroup[PATH_MAX];
  sigset_t set;
  int sfd;

  s.rec = *r;
  snprintf (old_cgroup, sizeof old_cgroup, "%s", r->cgroup);
  snprintf (s.rec.cgroup, sizeof s.rec.cgroup, "%s", prot->cgroup);
  s.idx = nbd_index (r->device);
  watchdog_init (&s.wd);
  s.claim = claim;
  state_path (r->name, "pid", s.pidfile, sizeof s.pidfile);
  state_path (r->name, "log", s.log, sizeof s.log);
  s.so = *so;
  s.so.image = s.rec.image;
  s.so.socket = s.rec.socket;
  s.so.readonly = s.rec.readonly;
  s.so.pidfile = s.pidfile;
  prctl (PR_SET_NAME, "pdio-supervise");
  /* attach blocked these already; they arrive on the signalfd. */
  sigemptyset (&set);
  sigaddset (&set, SIGCHLD);
  sigaddset (&set, SIGTERM);
  sigaddset (&set, SIGINT);
  sigaddset (&set, SIGHUP);
  sigaddset (&set, SIGUSR1);
  sigprocmask (SIG_BLOCK, &set, NULL);
  sfd = signalfd (-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
  detach_stdio (r);
  if (adopt) {
    struct claim_holder h;

    s.rec.supervisor_pid = getpid ();
    save (&s);
    /* Free since the old supervisor died, unless a detach has it now. */
    s.claim = claim_take (r->name, "attached", 0, &h);
    if (s.claim >= 0)
      claim_note (s.claim, "attached", r->device);
  }
  if (write (notify_fd, "1", 1) != 1)
    say ("cannot tell pdio attach that %s is up: %m", r->device);
  close (notify_fd);
  s.ev = ev ? ev : nbdnl_events_open (why, sizeof why);
  if (s.ev == NULL)
    say ("%s: watching the server only (%s)", r->device, why);
  say ("supervising %s: %s served by pid %d, %u connection(s), timeout %u "
       "s, dead-connection timeout %u s", r->device, r->image,
       (int) r->server_pid, r->connections, r->timeout, r->dead_timeout);
  log_protection (&s, prot);
  if (adopt)
    take_over (&s, old_cgroup);
  else
    /* The server may have died before the signalfd existed. */
    reap (&s);

  for (;;) {
    struct pollfd p[3] = {
      { .fd = sfd, .events = POLLIN },
      { .fd = s.ev ? nbdnl_events_fd (s.ev) : -1, .events = POLLIN },
      { .fd = s.wd.fd, .events = POLLIN },
    };
    long wait = watching (&s) ? watchdog_wait_ms (&s.wd, now_ms ()) : 1000;

    if (poll (p, 3, wait < 1000 ? wait : 1000) == -1 && errno != EINTR) {
      say ("poll: %m");
      msleep (POLL_RETRY_MS);
    }
    if (p[0].revents & POLLIN)
      while (read (sfd, &si, sizeof si) == sizeof si)
        switch (si.ssi_signo) {
        case SIGCHLD: reap (&s); break;
        case SIGUSR1: requested (&s); break;
        default:
          /* systemd stops a unit with SIGTERM to what is left in its
           * cgroup: an fstab mount's after the umount, if we stayed in
           * it (--slice none, or no placement), or our scope's: the
           * device is gone then, and so should the rest be.
           */
          /* Not for long: a detach waits for us holding the lock. */
          if (!device_is_ours (&s.rec))
            device_gone (&s, 2000);
          /* pdio detach, or someone: the device and server stay. */
          say ("signal %d: exiting; %s and its server stay", si.ssi_signo,
               r->device);
          watchdog_close (&s.wd);
          exit (EXIT_OK);
        }
    if (p[1].revents & POLLIN) {
      int idx;

      while ((idx = nbdnl_events_read (s.ev)) >= -2)
        if (idx == s.idx)
          link_dead (&s);
    }
    watch (&s);
    if (!device_is_ours (&s.rec))
      device_gone (&s, 30000);
  }
}
