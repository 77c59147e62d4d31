/* SPDX-License-Identifier: BSD-3-Clause */
/* Waiting for what the kernel announces, under a deadline.  A wait
 * watches the file descriptor that tells when its condition may have
 * changed -- a pidfd for a process's exit, inotify for a file, the
 * kernel's uevents for a block device -- and asks the condition again
 * only when that descriptor speaks.  Deadlines are on the monotonic
 * clock, so that a wall-clock step neither shortens nor stretches one.
 */
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/pidfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <linux/netlink.h>

#include "pdio.h"

/* The kernel announces some changes just before it completes them: a
 * file's close event comes before its flock and OFD locks are released
 * (__fput), a block device's "change" uevent at a disconnect before its
 * pid attribute goes.  So after an event the condition is asked again
 * every SETTLE_MS for SETTLE_ROUNDS rounds before the wait goes back to
 * waiting for the next event; and so it is at the start, for an event
 * that came after the watch began but before the change was complete.
 */
#define SETTLE_MS 5
#define SETTLE_ROUNDS 40
/* Where nothing can be watched (no inotify watch, no uevent socket), the
 * condition is asked every FALLBACK_MS: a backoff, for lack of an event.
 */
#define FALLBACK_MS 50

long
now_ms (void)
{
  struct timespec ts;

  clock_gettime (CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1000L + ts.tv_nsec / 1000000;
}

long
deadline_in (unsigned ms)
{
  return now_ms () + ms;
}

/* Reads what is queued on a non-blocking fd: the events only wake. */
static void
drain (int fd)
{
  char buf[4096];

  while (read (fd, buf, sizeof buf) > 0)
    ;
}

bool
wait_until (int fd, bool (*ready) (void *), void *arg, long end)
{
  int settle = SETTLE_ROUNDS;

  for (;;) {
    struct pollfd p = { .fd = fd, .events = POLLIN };
    long left;
    int n;

    if (ready (arg))
      return true;
    left = end - now_ms ();
    if (left <= 0)
      return false;
    if (fd < 0 && left > FALLBACK_MS)
      left = FALLBACK_MS;
    else if (settle > 0 && left > SETTLE_MS)
      left = SETTLE_MS;
    n = poll (&p, 1, left);
    if (n == -1 && errno != EINTR) {
      /* Cannot wait on fd: ask again after a backoff. */
      fd = -1;
      continue;
    }
    if (n > 0) {
      if (p.revents & (POLLERR | POLLNVAL))
        fd = -1;
      else
        drain (fd);
      settle = SETTLE_ROUNDS;
    }
    else if (settle > 0)
      settle--;
  }
}

int
inotify_on (const char *path, uint32_t mask)
{
  int fd = inotify_init1 (IN_NONBLOCK | IN_CLOEXEC);

  if (fd >= 0 && inotify_add_watch (fd, path, mask) == -1) {
    close (fd);
    fd = -1;
  }
  return fd;
}

int
inotify_on_dir (const char *path, uint32_t mask)
{
  char dir[PATH_MAX];
  const char *slash = strrchr (path, '/');

  if (slash == NULL)
    snprintf (dir, sizeof dir, ".");
  else
    snprintf (dir, sizeof dir, "%.*s",
              slash == path ? 1 : (int) (slash - path), path);
  return inotify_on (dir, mask);
}

int
uevents_open (void)
{
  struct sockaddr_nl sa = {
    .nl_family = AF_NETLINK, .nl_groups = 1 /* the kernel's, not udev's */,
  };
  int fd = socket (AF_NETLINK, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC,
                   NETLINK_KOBJECT_UEVENT);

  if (fd >= 0 && bind (fd, (struct sockaddr *) &sa, sizeof sa) == -1) {
    close (fd);
    fd = -1;
  }
  return fd;
}

struct nbd_state {
  int idx;
  bool (*ready) (int idx, void *arg);
  void *arg;
};

static bool
nbd_ready (void *arg)
{
  struct nbd_state *st = arg;

  return st->ready (st->idx, st->arg);
}

bool
wait_nbd (int idx, bool (*ready) (int idx, void *arg), void *arg,
          unsigned ms)
{
  struct nbd_state st = { .idx = idx, .ready = ready, .arg = arg };
  int fd = uevents_open ();
  bool ok;

  ok = wait_until (fd, nbd_ready, &st, deadline_in (ms));
  if (fd >= 0)
    close (fd);
  return ok;
}

struct process {
  pid_t pid;
  int fd;
  bool every_thread;
};

/* A pidfd polls readable once every thread of the process has exited,
 * zombie or not.  Its main thread may be a zombie before that, which
 * pid_alive calls gone; but until the last thread exits the process
 * keeps its files, and its fcntl locks with them: for every_thread
 * (where there is a pidfd), only the pidfd says gone.
 */
static bool
pid_gone (void *arg)
{
  struct process *p = arg;
  struct pollfd pf = { .fd = p->fd, .events = POLLIN };

  if (p->fd >= 0 && poll (&pf, 1, 0) == 1 && (pf.revents & POLLIN))
    return true;
  return !(p->every_thread && p->fd >= 0) && !pid_alive (p->pid);
}

static bool
wait_process (pid_t pid, unsigned ms, bool every_thread)
{
  struct process p = { .pid = pid, .every_thread = every_thread };
  bool gone;

  if (pid <= 0)
    return true;
  p.fd = pidfd_open (pid, 0);
  if (p.fd == -1 && errno == ESRCH)
    return true;
  gone = wait_until (p.fd, pid_gone, &p, deadline_in (ms));
  if (p.fd >= 0)
    close (p.fd);
  return gone;
}

bool
wait_gone (pid_t pid, unsigned ms)
{
  return wait_process (pid, ms, false);
}

bool
wait_exited (pid_t pid, unsigned ms)
{
  return wait_process (pid, ms, true);
}
