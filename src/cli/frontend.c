/* Starting a server for an image: the one place attach and the supervisor
 * do it, for either front end: pdio's own server (pdio serve --pidfile) or
 * nbdkit with pdio.so, as a daemon (server_argv in server.c builds either
 * command line).
 */
#include <config.h>

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kernel.h"

static pid_t
read_pidfile (const char *path)
{
  FILE *fp = fopen (path, "re");
  int pid = 0;

  if (fp) {
    if (fscanf (fp, "%d", &pid) != 1)
      pid = 0;
    fclose (fp);
  }
  return pid;
}

/* nbdkit -P, or pdio serve --pidfile: it opens the image (and so fails on
 * a locked or missing one) before it forks, its first process exits with the verdict, and the
 * daemon writes the pid file once it listens.  The daemon is re-parented
 * to our subreaper (the supervisor), which then learns how it dies.
 */
static pid_t
start_daemon (const struct server_opts *o, const char *log, char *why,
              size_t len)
{
  struct server_cmd cmd;
  pid_t pid, server;
  int status = -1;

  unlink (o->socket);
  unlink (o->pidfile);
  server_argv (o, &cmd);
  pid = run_background ((char **) cmd.argv, log);
  if (pid == -1) {
    snprintf (why, len, "cannot run %s", o->nbdkit);
    return -1;
  }
  while (waitpid (pid, &status, 0) == -1)
    if (errno != EINTR) {
      snprintf (why, len, "waitpid: %m");
      return -1;
    }
  if (status != 0) {
    snprintf (why, len, "%s could not serve %s (exit status %d; its "
              "messages are in %s)", o->native ? "pdio serve" : "nbdkit",
              o->image,
              WIFEXITED (status) ? WEXITSTATUS (status)
                                 : 128 + WTERMSIG (status), log);
    return -1;
  }
  for (unsigned t = 0; (server = read_pidfile (o->pidfile)) <= 0; t += 20) {
    if (t >= 10000) {
      snprintf (why, len, "%s wrote no pid file (%s) within 10 s",
                o->native ? "pdio serve" : "nbdkit", o->pidfile);
      return -1;
    }
    msleep (20);
  }
  return server;
}

/* Tests only (PDIO_TEST_BREAK=server-exits-with-supervisor): nbdkit -f
 * --exit-with-parent as our direct child, the design in which a device
 * dies with its supervisor; the guest's "supervisor killed" test must
 * fail with it.
 */
static pid_t
start_nbdkit_tied (const struct server_opts *o, const char *log, char *why,
                   size_t len)
{
  struct server_opts fg = *o;
  struct server_cmd cmd;
  pid_t pid;

  fg.pidfile = NULL;
  unlink (o->socket);
  server_argv (&fg, &cmd);
  pid = run_background ((char **) cmd.argv, log);
  for (unsigned t = 0; pid > 0 && access (o->socket, F_OK) == -1; t += 20) {
    if (t >= 10000 || waitpid (pid, NULL, WNOHANG) == pid) {
      snprintf (why, len, "nbdkit could not serve %s (see %s)", o->image,
                log);
      return -1;
    }
    msleep (20);
  }
  return pid;
}

pid_t
frontend_start (const struct server_opts *o, const char *log, char *why,
                size_t len)
{
  if (test_break ("server-exits-with-supervisor"))
    return start_nbdkit_tied (o, log, why, len);
  return start_daemon (o, log, why, len);
}

struct server_opts
record_server_opts (const struct record *r, const char *pdio,
                    const char *nbdkit, const char *pidfile)
{
  return (struct server_opts) {
    .nbdkit = nbdkit, .plugin = r->plugin, .image = r->image,
    .socket = r->socket, .pidfile = pidfile, .readonly = r->readonly,
    .native = !r->nbdkit, .pdio = pdio, .threads = r->threads,
  };
}
