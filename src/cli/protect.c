/* SPDX-License-Identifier: BSD-3-Clause */
/* What keeps a device's server, and its supervisor, working when memory
 * is short.  Every write the kernel flushes to /dev/nbdN passes through
 * the server: if the server must allocate to answer, and reclaim waits on
 * writeback to that very device, the two wait on each other.
 *
 * - PR_SET_IO_FLUSHER (Linux 5.6; needs CAP_SYS_RESOURCE) sets
 *   PF_MEMALLOC_NOIO and PF_LOCAL_THROTTLE on the calling thread: its
 *   allocations never start I/O to reclaim, and it is throttled only on
 *   its own writeback.  Threads created later, forked children and exec
 *   all keep it, so the supervisor sets it before it starts any server,
 *   and pdio serve before it creates any thread.
 * - oom_score_adj -1000: the OOM killer never picks the process.  Killing
 *   the server frees a few MiB and loses every write in flight to the
 *   device.
 * - mlockall (--swap): nothing of the process is ever swapped out, since
 *   swapping it back in could need the device it serves.
 * - PR_SET_THP_DISABLE: an idle server holds about 1 MiB.  Where
 *   transparent huge pages are "always" (Debian's kernel), one touch of a
 *   fresh anonymous region (a thread's malloc arena, a pool slab) can
 *   fault in a whole 2 MiB page, which doubles that and is not given back
 *   when the pool is.  Inherited by children and kept across exec.
 *
 * A child that runs another program (mount, udevadm, the call to
 * systemd) is no part of the I/O path and must be free to allocate and
 * to be killed: it drops the flag and the OOM protection (spawn.c:
 * unprotect_child).
 */
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "pdio.h"

#ifndef PR_SET_IO_FLUSHER
#define PR_SET_IO_FLUSHER 57
#endif
/* include/linux/sched.h: what PR_SET_IO_FLUSHER sets. */
#define PF_MEMALLOC_NOIO 0x00080000u
#define PF_LOCAL_THROTTLE 0x00100000u
#define OOM_SCORE_ADJ_MIN (-1000)

bool
set_io_flusher (char *why, size_t len)
{
  if (test_break ("no-io-flusher")) {
    snprintf (why, len, "not set (test break no-io-flusher)");
    return false;
  }
  if (prctl (PR_SET_IO_FLUSHER, 1, 0, 0, 0) == 0)
    return true;
  if (errno == EPERM)
    snprintf (why, len, "PR_SET_IO_FLUSHER refused: %m (it needs "
              "CAP_SYS_RESOURCE)");
  else if (errno == EINVAL)
    snprintf (why, len, "PR_SET_IO_FLUSHER refused: %m (the kernel is "
              "older than 5.6)");
  else
    snprintf (why, len, "PR_SET_IO_FLUSHER: %m");
  return false;
}

void
no_huge_pages (void)
{
  /* Refused only before Linux 3.15, where it costs memory, not safety. */
  (void) prctl (PR_SET_THP_DISABLE, 1, 0, 0, 0);
}

/* Writes an oom_score_adj; false with errno set. */
static bool
write_oom_score_adj (pid_t pid, int adj)
{
  char path[64], buf[16];
  int fd, n;
  bool ok;

  snprintf (path, sizeof path, "/proc/%d/oom_score_adj", (int) pid);
  fd = open (path, O_WRONLY | O_CLOEXEC);
  if (fd == -1)
    return false;
  n = snprintf (buf, sizeof buf, "%d\n", adj);
  ok = write (fd, buf, n) == n;
  if (close (fd) == -1)
    ok = false;
  return ok;
}

bool
proc_oom_score_adj (pid_t pid, int *adj)
{
  char path[64];
  bool ok;
  FILE *fp;

  snprintf (path, sizeof path, "/proc/%d/oom_score_adj", (int) pid);
  fp = fopen (path, "re");
  if (fp == NULL)
    return false;
  ok = fscanf (fp, "%d", adj) == 1;
  fclose (fp);
  return ok;
}

bool
set_oom_protected (char *why, size_t len)
{
  if (test_break ("no-oom-adjust")) {
    snprintf (why, len, "not set (test break no-oom-adjust)");
    return false;
  }
  if (write_oom_score_adj (getpid (), OOM_SCORE_ADJ_MIN))
    return true;
  snprintf (why, len, "cannot set oom_score_adj to %d: %m%s",
            OOM_SCORE_ADJ_MIN, errno == EACCES || errno == EPERM
            ? " (lowering it needs CAP_SYS_RESOURCE)" : "");
  return false;
}

bool
lock_memory (char *why, size_t len)
{
  if (mlockall (MCL_CURRENT | MCL_FUTURE) == 0)
    return true;
  snprintf (why, len, "mlockall: %m%s", errno == EPERM || errno == ENOMEM
            ? " (it needs CAP_IPC_LOCK or a memlock limit as large as the "
              "process)" : "");
  return false;
}

static bool
lacks_flags (pid_t tid, char state, unsigned flags, void *arg)
{
  bool *all = arg;

  (void) tid;
  (void) state;
  if ((flags & (PF_MEMALLOC_NOIO | PF_LOCAL_THROTTLE)) !=
      (PF_MEMALLOC_NOIO | PF_LOCAL_THROTTLE)) {
    *all = false;
    return false;
  }
  return true;
}

int
proc_io_flusher (pid_t pid)
{
  bool all = true;

  if (pid <= 0 || proc_each_task (pid, lacks_flags, &all) <= 0)
    return -1;
  return all;
}

void
protect_supervisor (const char *slice, bool swap, const char *image,
                    struct protection *p)
{
  *p = (struct protection) { .io_flusher = "" };
  no_huge_pages ();
  set_io_flusher (p->io_flusher, sizeof p->io_flusher);
  set_oom_protected (p->oom, sizeof p->oom);
  if (swap)
    lock_memory (p->lock, sizeof p->lock);
  place_self (slice, image, p->cgroup, sizeof p->cgroup, p->placed,
              sizeof p->placed);
}
