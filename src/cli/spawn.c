/* SPDX-License-Identifier: BSD-3-Clause */
/* Running the programs pdio drives (the server, mount, umount, udevadm,
 * modprobe) and watching processes that are not its children (a
 * daemonized server).
 */
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "pdio.h"

#ifndef PR_SET_IO_FLUSHER
#define PR_SET_IO_FLUSHER 57
#endif

bool
find_program (const char *env, const char *name, char *buf, size_t len)
{
  const char *v = env ? getenv (env) : NULL;
  const char *path, *p;

  if (v && *v) {
    snprintf (buf, len, "%s", v);
    return access (buf, X_OK) == 0;
  }
  path = getenv ("PATH");
  if (path == NULL || !*path)
    path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
  for (p = path; *p; ) {
    size_t n = strcspn (p, ":");

    snprintf (buf, len, "%.*s/%s", (int) n, p, name);
    if (n && access (buf, X_OK) == 0)
      return true;
    p += n;
    if (*p == ':')
      p++;
  }
  return false;
}

/* A program pdio runs that is not a server (mount, umount, udevadm,
 * modprobe; systemd.c's call) is no part of the I/O path: it must be free
 * to allocate, and to be killed, like any other (iscsid clears the flag
 * in such children too, after its NOIO allocations lost devices).  So it
 * drops what the supervisor holds (protect.c): PR_SET_IO_FLUSHER, and a
 * protective (negative) oom_score_adj, which goes back to the default; a
 * positive one someone chose stays.  System calls only, between fork
 * and exec.
 */
void
unprotect_child (void)
{
  char buf[16];
  ssize_t n;
  int fd;

  if (test_break ("child-keeps-protection"))
    return;
  /* Whether it was set or not: EINVAL before Linux 5.6, nothing set. */
  prctl (PR_SET_IO_FLUSHER, 0, 0, 0, 0);
  fd = open ("/proc/self/oom_score_adj", O_RDWR | O_CLOEXEC);
  if (fd == -1)
    return;
  n = read (fd, buf, sizeof buf - 1);
  if (n > 0) {
    buf[n] = '\0';
    /* Should the write fail, the program runs protected: nothing better
     * can be done here.
     */
    if (atoi (buf) < 0 && lseek (fd, 0, SEEK_SET) == 0)
      n = write (fd, "0\n", 2);
  }
  close (fd);
}

/* In the child: a clean signal state (attach blocks signals while it
 * works; a blocked mask survives exec), then the redirections.  A server
 * keeps the protections; any other program drops them.
 */
static void
child_setup (bool server, bool own_session, int out_fd, const char *log)
{
  sigset_t none;
  int fd;

  if (!server)
    unprotect_child ();

  sigemptyset (&none);
  sigprocmask (SIG_SETMASK, &none, NULL);
  signal (SIGINT, SIG_DFL);
  signal (SIGTERM, SIG_DFL);
  signal (SIGHUP, SIG_DFL);
  if (own_session) {
    setsid ();
    fd = open ("/dev/null", O_RDONLY);
    if (fd == -1 || dup2 (fd, STDIN_FILENO) == -1)
      _exit (127);
  }
  if (log) {
    fd = open (log, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND, 0644);
    if (fd == -1 || dup2 (fd, STDOUT_FILENO) == -1 ||
        dup2 (fd, STDERR_FILENO) == -1)
      _exit (127);
  }
  if (out_fd >= 0 && (dup2 (out_fd, STDOUT_FILENO) == -1 ||
                      dup2 (out_fd, STDERR_FILENO) == -1))
    _exit (127);
}

static pid_t
start (char *const argv[], bool server, bool own_session, int out_fd,
       const char *log)
{
  pid_t pid;

  fflush (NULL);
  pid = fork ();
  if (pid == 0) {
    child_setup (server, own_session, out_fd, log);
    execv (argv[0], argv);
    fprintf (stderr, "pdio: %s: %m\n", argv[0]);
    _exit (127);
  }
  if (pid == -1)
    fprintf (stderr, "pdio: fork: %m\n");
  return pid;
}

int
run_wait (char *const argv[], int out_fd)
{
  pid_t pid = start (argv, false, false, out_fd, NULL);
  int status;

  if (pid == -1)
    return -1;
  while (waitpid (pid, &status, 0) == -1)
    if (errno != EINTR)
      return -1;
  if (WIFEXITED (status))
    return WEXITSTATUS (status);
  return 128 + WTERMSIG (status);
}

pid_t
run_background (char *const argv[], const char *log)
{
  return start (argv, true, true, -1, log);
}

pid_t
run_child (char *const argv[])
{
  return start (argv, true, false, -1, NULL);
}

bool
pid_alive (pid_t pid)
{
  char path[64], state;
  FILE *fp;

  if (pid <= 0 || (kill (pid, 0) == -1 && errno == ESRCH))
    return false;
  /* A zombie is gone for our purposes (its files are closed).  It may
   * also be reaped between kill() and here (init reaps a server whose
   * supervisor was stopped): no /proc entry means gone too.
   */
  snprintf (path, sizeof path, "/proc/%d/stat", (int) pid);
  fp = fopen (path, "re");
  if (fp == NULL)
    return errno != ENOENT && errno != ESRCH;
  /* Unreadable once open: reaped in between as well. */
  if (fscanf (fp, "%*d (%*[^)]) %c", &state) != 1)
    state = 'X';
  fclose (fp);
  return state != 'Z' && state != 'X';
}

bool
proc_comm (pid_t pid, char *comm, size_t len)
{
  char path[64];
  FILE *fp;

  comm[0] = '\0';
  snprintf (path, sizeof path, "/proc/%d/comm", (int) pid);
  fp = fopen (path, "re");
  if (fp == NULL)
    return false;
  if (fgets (comm, len, fp) == NULL)
    comm[0] = '\0';
  fclose (fp);
  comm[strcspn (comm, "\n")] = '\0';
  return comm[0] != '\0';
}

bool
pid_is_server (pid_t pid)
{
  char comm[64];

  return proc_comm (pid, comm, sizeof comm) &&
    (strcmp (comm, "nbdkit") == 0 || strcmp (comm, "pdio") == 0);
}

int
run_quiet (char *const argv[])
{
  FILE *out = tmpfile ();
  char buf[4096];
  size_t n;
  int r;

  r = run_wait (argv, out ? fileno (out) : -1);
  if (out) {
    if (r != 0) {
      rewind (out);
      while ((n = fread (buf, 1, sizeof buf, out)) > 0)
        fwrite (buf, 1, n, stderr);
    }
    fclose (out);
  }
  return r;
}
