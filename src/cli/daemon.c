/* SPDX-License-Identifier: BSD-3-Clause */
/* The server of an attachment as a daemon process -- pdio's own (pdio
 * serve --pidfile) or, with --nbdkit, nbdkit with pdio.so: starting it
 * (the one place attach, restart and the supervisor do it, with the
 * command line of server_cmd.c), asking the running server what it
 * advertises, stopping it; and two looks at the image that do not open
 * it: is it locked, and how much of it sits in the page cache.
 */
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <linux/fs.h>

#include "pdio.h"
#include "proto.h"

/* How long a daemon that said it serves has to write its pid file. */
#define PIDFILE_WAIT_MS 10000

static bool
query_once (const char *socket, const char *port, struct server_info *info,
            char *why, size_t len)
{
  struct nbd_offer o;

  if (!nbd_query (socket, port, &o, why, len))
    return false;
  info->size = o.size;
  info->block_min = o.block_min;
  info->dio_align = o.block_preferred;
  info->readonly = o.eflags & NBD_FLAG_READ_ONLY;
  info->multi_conn = o.eflags & NBD_FLAG_CAN_MULTI_CONN;
  return true;
}

struct query {
  const char *socket, *port;
  struct server_info *info;
  char *why;
  size_t len;
};

static bool
answered (void *arg)
{
  struct query *q = arg;

  return query_once (q->socket, q->port, q->info, q->why, q->len);
}

bool
server_query (const char *socket, const char *port, unsigned ms,
              struct server_info *info, char *why, size_t len)
{
  struct query q = { socket, port, info, why, len };
  /* A server that is not there yet, or restarting, makes its socket anew
   * (bind creates it, listen follows at once); on a port nothing
   * announces it.
   */
  int fd = socket && ms ? inotify_on_dir (socket, IN_CREATE | IN_ATTRIB |
                                                   IN_MOVED_TO)
                        : -1;
  bool ok = wait_until (fd, answered, &q, deadline_in (ms));

  if (fd >= 0)
    close (fd);
  return ok;
}

void
server_stop (pid_t pid)
{
  if (!pid_alive (pid))
    return;
  kill (pid, SIGTERM);
  if (wait_gone (pid, 10000))
    return;
  kill (pid, SIGKILL);
  wait_gone (pid, 5000);
}

/* F_OFD_GETLK takes no lock: it only reports one that would conflict
 * with a write lock.
 */
static bool
locked_now (int fd)
{
  struct flock fl = { .l_type = F_WRLCK, .l_whence = SEEK_SET };

  if (fcntl (fd, F_OFD_GETLK, &fl) == -1)
    return false;               /* no locks here: nothing to wait for */
  return fl.l_type != F_UNLCK;
}

static bool
unlocked (void *arg)
{
  return !locked_now (*(int *) arg);
}

bool
image_lock_free (const char *image, unsigned ms)
{
  int fd = open (image, O_RDONLY | O_CLOEXEC), in;
  bool free_;

  if (fd == -1)
    return true;
  /* A server killed hard keeps the lock for up to ~200 ms: its io_uring
   * rings, which hold the image, are torn down asynchronously.  The lock
   * goes with the last reference to the server's open file, whose close
   * inotify reports.
   */
  in = inotify_on (image, IN_CLOSE_WRITE | IN_CLOSE_NOWRITE);
  free_ = wait_until (in, unlocked, &fd, deadline_in (ms));
  if (in >= 0)
    close (in);
  close (fd);
  return free_;
}

/* Counts resident pages in [off, off+len) with mincore; -1 on error. */
static int64_t
resident (int fd, off_t off, size_t len, long page)
{
  unsigned char vec[4096];
  int64_t bytes = 0;
  void *p = mmap (NULL, len, PROT_READ, MAP_SHARED, fd, off);

  if (p == MAP_FAILED)
    return -1;
  for (size_t done = 0; done < len; ) {
    size_t pages = (len - done + page - 1) / page;
    size_t n = pages < sizeof vec ? pages : sizeof vec;
    size_t chunk = n * (size_t) page;

    if (chunk > len - done)
      chunk = len - done;
    if (mincore ((char *) p + done, chunk, vec) == -1) {
      bytes = -1;
      break;
    }
    for (size_t i = 0; i < n; i++)
      if (vec[i] & 1)
        bytes += page;
    done += chunk;
  }
  munmap (p, len);
  return bytes;
}

int64_t
image_cached_bytes (const char *image)
{
  const size_t window = 1 << 30;        /* map 1 GiB at a time */
  long page = sysconf (_SC_PAGESIZE);
  int fd = open (image, O_RDONLY | O_CLOEXEC);
  uint64_t size;
  int64_t total = 0;
  struct stat st;

  if (fd == -1)
    return -1;
  if (fstat (fd, &st) == -1 ||
      (S_ISBLK (st.st_mode) ? ioctl (fd, BLKGETSIZE64, &size) == -1
                            : (size = st.st_size, false))) {
    close (fd);
    return -1;
  }
  for (uint64_t off = 0; off < size && total >= 0; off += window) {
    size_t len = size - off < window ? size - off : window;
    int64_t r = resident (fd, off, len, page);

    total = r < 0 ? -1 : total + r;
  }
  close (fd);
  return total;
}

pid_t
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

struct pidfile {
  const char *path;
  pid_t pid;
};

static bool
pidfile_written (void *arg)
{
  struct pidfile *pf = arg;

  return (pf->pid = read_pidfile (pf->path)) > 0;
}

/* nbdkit -P, or pdio serve --pidfile: it opens the image (and so fails on
 * a locked or missing one) before it forks, its first process exits with
 * the verdict, and the daemon writes the pid file once it listens.  The
 * daemon is re-parented to our subreaper (the supervisor), which then
 * learns how it dies.
 */
static pid_t
start_daemon (const struct server_opts *o, const char *log, char *why,
              size_t len)
{
  struct server_cmd cmd;
  struct pidfile pf = { .path = o->pidfile };
  pid_t pid;
  int status = -1, in;

  /* A successor inherits the listening socket bound there. */
  if (!o->take_over)
    unlink (o->socket);
  unlink (o->pidfile);
  /* Watched before the daemon starts, so that its write is not missed
   * (both servers write the file in place and close it).
   */
  in = inotify_on_dir (o->pidfile, IN_CLOSE_WRITE | IN_MOVED_TO);
  server_argv (o, &cmd);
  pid = run_background ((char **) cmd.argv, log);
  if (pid == -1)
    snprintf (why, len, "cannot run %s", o->native ? o->pdio : o->nbdkit);
  else {
    while (waitpid (pid, &status, 0) == -1)
      if (errno != EINTR) {
        snprintf (why, len, "waitpid: %m");
        break;
      }
    if (status != 0)
      snprintf (why, len, "%s could not serve %s (exit status %d; its "
                "messages are in %s)", o->native ? "pdio serve" : "nbdkit",
                o->image,
                WIFEXITED (status) ? WEXITSTATUS (status)
                                   : 128 + WTERMSIG (status), log);
    else if (!wait_until (in, pidfile_written, &pf,
                          deadline_in (PIDFILE_WAIT_MS)))
      snprintf (why, len, "%s wrote no pid file (%s) within %d s",
                o->native ? "pdio serve" : "nbdkit", o->pidfile,
                PIDFILE_WAIT_MS / 1000);
  }
  if (in >= 0)
    close (in);
  return pid != -1 && status == 0 && pf.pid > 0 ? pf.pid : -1;
}

pid_t
server_start (const struct server_opts *o, const char *log, char *why,
              size_t len)
{
#ifdef PDIO_TEST_BREAKS
  if (test_break ("server-exits-with-supervisor"))
    return test_start_server_tied (o, log, why, len);
#endif
  return start_daemon (o, log, why, len);
}
