/* SPDX-License-Identifier: BSD-3-Clause */
/* What the supervisor reads before it calls a silent server hung
 * (watchdog_stalled in watchdog.c judges it): is a thread of the server
 * in D state, waiting in the kernel; and how much do tasks stall on
 * memory, system-wide (/proc/pressure/memory) and in the server's cgroup
 * (its memory.pressure, cgroup v2).  Both are PSI's "some" line: avg10,
 * the share of about the last 10 s in which at least one task waited for
 * memory, in percent; total, that time in µs since boot.
 */
#include <config.h>

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "pdio.h"

static void
psi_read (const char *path, struct psi_some *p)
{
  char line[256];
  FILE *fp;

  *p = (struct psi_some) { .have = false };
  fp = fopen (path, "re");
  if (fp == NULL)
    return;
  while (fgets (line, sizeof line, fp))
    if (sscanf (line, "some avg10=%lf avg60=%*f avg300=%*f total=%" SCNu64,
                &p->avg10, &p->total_us) == 2)
      p->have = true;
  fclose (fp);
}

static bool
find_d_state (pid_t tid, char state, unsigned flags, void *arg)
{
  pid_t *d_tid = arg;

  (void) flags;
  if (state != 'D')
    return true;
  *d_tid = tid;
  return false;
}

void
stall_read (pid_t server, struct stall_reading *r)
{
  char cg[PATH_MAX], path[PATH_MAX + 64];
  const char *root = cgroup2_root ();

  *r = (struct stall_reading) { .d_tid = 0 };
  proc_each_task (server, find_d_state, &r->d_tid);
  psi_read ("/proc/pressure/memory", &r->system);
  /* The root cgroup's pressure is the system's. */
  if (root && proc_cgroup (server, cg, sizeof cg) && strcmp (cg, "/") != 0) {
    snprintf (path, sizeof path, "%s%s/memory.pressure", root, cg);
    psi_read (path, &r->cgroup);
  }
}
