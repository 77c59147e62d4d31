/* SPDX-License-Identifier: BSD-3-Clause */
/* The threads of a process as /proc shows them: each one's state (field
 * 3 of /proc/PID/task/TID/stat: R, S, D, T...) and its kernel flags
 * (field 9: PF_*).  pdio list reads the flags PR_SET_IO_FLUSHER sets, the
 * supervisor's watchdog looks for a thread in D state.
 */
#include <config.h>

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pdio.h"

/* Fields 3 and 9.  The command name (field 2) may hold blanks and
 * parentheses: the fields after it start after its last ')'.
 */
static bool
task_stat (pid_t pid, pid_t tid, char *state, unsigned *flags)
{
  char path[64], line[1024], *end;
  bool ok = false;
  FILE *fp;

  snprintf (path, sizeof path, "/proc/%d/task/%d/stat", (int) pid, (int) tid);
  fp = fopen (path, "re");
  if (fp == NULL)
    return false;
  if (fgets (line, sizeof line, fp) && (end = strrchr (line, ')')) != NULL)
    ok = sscanf (end + 1, " %c %*d %*d %*d %*d %*d %u", state, flags) == 2;
  fclose (fp);
  return ok;
}

int
proc_each_task (pid_t pid, bool (*fn) (pid_t tid, char state, unsigned flags,
                                       void *arg),
                void *arg)
{
  char path[64];
  struct dirent *d;
  DIR *dir;
  int n = 0;

  snprintf (path, sizeof path, "/proc/%d/task", (int) pid);
  dir = opendir (path);
  if (dir == NULL)
    return -1;
  while ((d = readdir (dir)) != NULL) {
    pid_t tid = atoi (d->d_name);
    unsigned flags;
    char state;

    /* A thread that ended since readdir saw it is not counted. */
    if (tid <= 0 || !task_stat (pid, tid, &state, &flags))
      continue;
    n++;
    if (!fn (tid, state, flags, arg))
      break;
  }
  closedir (dir);
  return n;
}
