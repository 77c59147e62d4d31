/* SPDX-License-Identifier: BSD-3-Clause */
/* What a process costs in memory, for pdio list --json: its resident set
 * and its proportional set size from /proc/PID/smaps_rollup.  PSS counts
 * a page shared by n processes as 1/n of it (libraries; pdio's text,
 * shared by a server and its supervisor), so the PSS of all processes
 * adds up to what they hold together: the figure a per-device cost is
 * counted in.
 */
#include <config.h>

#include <inttypes.h>
#include <stdio.h>

#include "pdio.h"

bool
proc_memory (pid_t pid, uint64_t *rss, uint64_t *pss)
{
  char path[64], line[256];
  bool have_rss = false, have_pss = false;
  uint64_t kib;
  FILE *fp;

  snprintf (path, sizeof path, "/proc/%d/smaps_rollup", (int) pid);
  /* Only for a process we may ptrace (our own, or any as root). */
  fp = fopen (path, "re");
  if (fp == NULL)
    return false;
  while (fgets (line, sizeof line, fp)) {
    if (sscanf (line, "Rss: %" SCNu64 " kB", &kib) == 1) {
      *rss = kib * 1024;
      have_rss = true;
    }
    else if (sscanf (line, "Pss: %" SCNu64 " kB", &kib) == 1) {
      *pss = kib * 1024;
      have_pss = true;
    }
  }
  fclose (fp);
  return have_rss && have_pss;
}
