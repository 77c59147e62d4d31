/* SPDX-License-Identifier: BSD-3-Clause */
/* pdio restart DEVICE|IMAGE: replace the server on purpose (after an
 * upgrade, say) while the device stays connected and mounted.  The
 * supervisor does it (SIGUSR1): with pdio's own server, the new server
 * takes the live connections over from the old one and the kernel sees
 * nothing; with nbdkit, or if the hand-over fails, it kills the server,
 * starts a new one and hands the device fresh connections.  This waits
 * until the record says it is done, and prints which it was.  If the
 * supervisor is gone, this starts a new one, which replaces the server
 * the second way.  pdio resize uses this to restart an nbdkit server.
 */
#include <config.h>

#include <fcntl.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "pdio.h"

#define CMD "pdio restart"
/* The lock wait and the attempts with their backoff. */
#define RESTART_WAIT_MS 60000

static void
usage (FILE *fp)
{
  fprintf (fp,
"Usage: pdio restart DEVICE|IMAGE\n"
"Replace the device's server with a new one; the device stays connected.\n"
"pdio's own server hands its live connections to the new one: no request\n"
"fails or waits for a timeout.  With --nbdkit, or if the hand-over fails\n"
"(said so), the old server is killed and the device gets fresh\n"
"connections: requests in flight wait for their timeout, then are resent.\n"
"If the device's supervisor is gone, a new one is started (and the server\n"
"is replaced the second way).\n");
}

/* The device's supervisor is gone (killed, say): start a new one, as
 * attach does (a subreaper in a session of its own), under the state lock
 * so that two of these do not both start one.  It tells us on the pipe
 * once it has recorded itself.
 */
static bool
start_supervisor (const char *cmd, struct record *r)
{
  char self[PATH_MAX], nbdkit[PATH_MAX] = "", pidfile[PATH_MAX], c;
  ssize_t n = readlink ("/proc/self/exe", self, sizeof self - 1);
  int p[2], lock, status;
  pid_t pid;

  if (n <= 0) {
    errorf ("%s: cannot find pdio itself (/proc/self/exe): %m", cmd);
    return false;
  }
  self[n] = '\0';
  if (test_break ("no-take-over")) {
    errorf ("%s: %s: its supervisor (pid %d) is gone", cmd, r->device,
            (int) r->supervisor_pid);
    return false;
  }
  if (r->nbdkit &&
      !find_program ("PDIO_NBDKIT", "nbdkit", nbdkit, sizeof nbdkit)) {
    errorf ("%s: nbdkit not found (%s): install it (apt-get install "
            "nbdkit)", cmd, nbdkit);
    return false;
  }
  lock = state_lock (cmd);
  if (lock == -1)
    return false;
  /* Another pdio restart may have been quicker. */
  if (record_load_device (r->device, r) == -1) {
    errorf ("%s: %s: its record went away (detached?)", cmd, r->device);
    close (lock);
    return false;
  }
  if (pid_is_supervisor (r->supervisor_pid)) {
    close (lock);
    if (kill (r->supervisor_pid, SIGUSR1) == -1) {
      errorf ("%s: %s: cannot signal its supervisor, pid %d: %m", cmd,
              r->device, (int) r->supervisor_pid);
      return false;
    }
    return true;
  }
  state_path (r->name, "pid", pidfile, sizeof pidfile);
  if (pipe2 (p, O_CLOEXEC) == -1) {
    errorf ("%s: pipe: %m", cmd);
    close (lock);
    return false;
  }
  fflush (NULL);
  pid = fork ();
  if (pid == -1) {
    errorf ("%s: fork: %m", cmd);
    close (lock);
    return false;
  }
  if (pid == 0) {
    const struct server_opts so = record_server_opts (r, self, nbdkit,
                                                      pidfile);
    struct protection prot;

    close (p[0]);
    close (lock);
    setsid ();
    prctl (PR_SET_CHILD_SUBREAPER, 1);
    /* As attach's supervisor, before it replaces the server.  A record of
     * an older pdio names no slice: the default.
     */
    protect_supervisor (r->slice[0] ? r->slice : DEFAULT_SLICE, r->swap,
                        r->image, &prot);
    supervise (r, &so, p[1], -1, true, NULL, &prot);
  }
  close (p[1]);
  if (read (p[0], &c, 1) != 1) {
    waitpid (pid, &status, 0);
    errorf ("%s: %s: the new supervisor did not start (see %s/%s"
            ".supervisor.log)", cmd, r->device, rundir (), r->device + 5);
    close (p[0]);
    close (lock);
    return false;
  }
  close (p[0]);
  close (lock);
  printf ("%s: its supervisor was gone: started a new one, pid %d\n",
          r->device, (int) pid);
  return true;
}

/* What restart_server waits for in the device's record, which the
 * supervisor rewrites (a rename into the run directory) as the restart
 * goes.
 */
struct restarting {
  const struct record *before;
  struct record now;
  int gone;                     /* -1: no record; 1: gave up; 0: a server */
};

static bool
restarted (void *arg)
{
  struct restarting *w = arg;

  if (record_load_device (w->before->device, &w->now) == -1)
    return (w->gone = -1), true;
  if (w->now.gave_up && w->now.restarts > w->before->restarts)
    return (w->gone = 1), true;
  return w->now.restarts > w->before->restarts && w->now.server_pid > 0 &&
    pid_alive (w->now.server_pid);
}

bool
restart_server (const char *cmd, struct record *r)
{
  struct restarting w = { .before = r };
  pid_t old = r->server_pid;
  char path[PATH_MAX];
  bool done;
  int in;

  state_path (r->device, "rec", path, sizeof path);
  in = inotify_on_dir (path, IN_MOVED_TO | IN_DELETE);
  if (!pid_is_supervisor (r->supervisor_pid)) {
    /* The new supervisor replaces the server as it starts. */
    if (!start_supervisor (cmd, r)) {
      if (in >= 0)
        close (in);
      return false;
    }
  }
  else if (kill (r->supervisor_pid, SIGUSR1) == -1) {
    errorf ("%s: %s: cannot signal its supervisor, pid %d: %m", cmd,
            r->device, (int) r->supervisor_pid);
    if (in >= 0)
      close (in);
    return false;
  }
  done = wait_until (in, restarted, &w, deadline_in (RESTART_WAIT_MS));
  if (in >= 0)
    close (in);
  if (!done) {
    errorf ("%s: %s: no new server within %d s (see %s/%s.supervisor"
            ".log)", cmd, r->device, RESTART_WAIT_MS / 1000, rundir (),
            r->device + 5);
    return false;
  }
  if (w.gone < 0) {
    errorf ("%s: %s: its record went away (detached?)", cmd, r->device);
    return false;
  }
  if (w.gone > 0) {
    errorf ("%s: %s: the server could not be restarted: %s", cmd,
            r->device, w.now.reason);
    return false;
  }
  *r = w.now;
  printf ("%s: server pid %d replaced by pid %d (%s)\n", r->device,
          (int) old, (int) r->server_pid, r->reason);
  return true;
}

int
cmd_restart (int argc, char **argv)
{
  static const struct option longopts[] = {
    { "help", no_argument, NULL, 'h' },
    { NULL, 0, NULL, 0 },
  };
  struct record r;
  int c;

  while ((c = getopt_long (argc, argv, "+h", longopts, NULL)) != -1)
    switch (c) {
    case 'h': usage (stdout); return EXIT_OK;
    default: usage (stderr); return EXIT_USAGE;
    }
  if ((c = record_operand (CMD, argc, argv, usage, &r)) != EXIT_OK)
    return c;
  return restart_server (CMD, &r) ? EXIT_OK : EXIT_FAILED;
}
