/* SPDX-License-Identifier: BSD-3-Clause */
/* Where a device's supervisor and server live: in a cgroup of their own
 * under a slice (pdio.slice unless pdio attach --slice says otherwise),
 * not in the memory cgroup of whoever ran pdio attach.  There, a writer
 * with a memory.max and the server that must take its writes would
 * reclaim from one budget; here the server has a memory.min of its own
 * (DEVICE_MEMORY_MIN) that reclaim leaves alone.
 *
 * The supervisor moves itself, before it starts a server: the server,
 * and every server it starts later, is its child and starts in its
 * cgroup.  (Memory a process charged before a move stays charged where it
 * was: moving the server afterwards would leave its first allocations in
 * the caller's cgroup.)
 *
 * - Under systemd: a transient scope pdio-PID.scope in the slice, made by
 *   systemd's StartTransientUnit with the supervisor's pid, MemoryMin set
 *   (systemd.c); systemd removes it once it is empty.  The slice is made
 *   transient the first time, with DefaultDependencies=no, as is the
 *   scope: with the default ones, shutdown stops them as it begins, and
 *   the servers with them, while filesystems on the devices are still
 *   mounted; without them the servers live until the mount units are
 *   stopped (umount.pdio detaches) or systemd's final kill.
 * - Without systemd, with cgroup v2 at /sys/fs/cgroup and its memory
 *   controller: the directory SLICE/pdio-PID, which pdio makes, fills
 *   and removes (placement_leave, placement_remove; a later placement
 *   removes any left behind by a supervisor that was killed).
 * - Otherwise the processes stay where they are.
 *
 * A child's memory.min counts only as far as its parents are protected
 * too: the slice's memory.min is kept at the sum of its live children's
 * (slice_update_min), under a lock on the run directory.
 */
#include <config.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>
#include <linux/magic.h>

#include "pdio.h"

#define CGROUP_FS "/sys/fs/cgroup"
/* How long systemd may take to move us into the new scope (its job runs
 * after StartTransientUnit returns).
 */
#define SCOPE_WAIT_MS 10000
/* How long the threads of a process that has exited may take to go. */
#define EXITING_WAIT_MS 2000

static bool
is_cgroup2 (const char *path)
{
  struct statfs st;

  return statfs (path, &st) == 0 && st.f_type == CGROUP2_SUPER_MAGIC;
}

const char *
cgroup2_root (void)
{
  if (is_cgroup2 (CGROUP_FS))
    return CGROUP_FS;
  /* systemd's hybrid layout: v1 controllers, v2 beside them. */
  if (is_cgroup2 (CGROUP_FS "/unified"))
    return CGROUP_FS "/unified";
  return NULL;
}

bool
proc_cgroup (pid_t pid, char *buf, size_t len)
{
  char path[64], line[PATH_MAX + 16];
  bool found = false;
  FILE *fp;

  snprintf (path, sizeof path, "/proc/%d/cgroup", (int) pid);
  fp = fopen (path, "re");
  if (fp == NULL)
    return false;
  while (!found && fgets (line, sizeof line, fp))
    if (strncmp (line, "0::", 3) == 0) {
      line[strcspn (line, "\n")] = '\0';
      snprintf (buf, len, "%s", line + 3);
      found = true;
    }
  fclose (fp);
  return found;
}

bool
slice_name_valid (const char *name)
{
  size_t n = strlen (name);

  if (strcmp (name, "none") == 0)
    return true;
  if (n <= 6 || n > 64 || strcmp (name + n - 6, ".slice") != 0 ||
      name[0] == '-' || name[0] == '.')
    return false;
  for (const char *p = name; *p; p++)
    if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
          (*p >= '0' && *p <= '9') || strchr ("-_.:", *p)))
      return false;
  return true;
}

/* A flock on the run directory itself (state_lock's is on a file in
 * it), held while a slice's children change; -1 if it cannot be had
 * (then unlocked: at worst the slice's memory.min is off by one device
 * until the next change).
 */
static int
lock_cgroups (void)
{
  int fd = open (rundir (), O_RDONLY | O_DIRECTORY | O_CLOEXEC);

  if (fd >= 0 && flock (fd, LOCK_EX) == -1) {
    close (fd);
    fd = -1;
  }
  return fd;
}

static void
unlock_cgroups (int fd)
{
  if (fd >= 0)
    close (fd);
}

static bool
write_str (const char *path, const char *s)
{
  int fd = open (path, O_WRONLY | O_CLOEXEC);
  ssize_t n = (ssize_t) strlen (s);
  bool ok;

  if (fd == -1)
    return false;
  ok = write (fd, s, n) == n;
  if (close (fd) == -1)
    ok = false;
  return ok;
}

static bool
populated (const char *dir)
{
  char path[PATH_MAX + 32], line[64];
  bool yes = false;
  FILE *fp;

  snprintf (path, sizeof path, "%s/cgroup.events", dir);
  fp = fopen (path, "re");
  if (fp == NULL)
    return false;
  while (fgets (line, sizeof line, fp))
    if (strcmp (line, "populated 1\n") == 0)
      yes = true;
  fclose (fp);
  return yes;
}

/* The slice's memory.min becomes the sum of its populated children's
 * (the child cgroup skip, a path below the root, not counted: a
 * supervisor on its way out).  Under systemd through the slice's unit
 * (a value written behind its back would be undone at its next reload).
 */
static void
slice_update_min (const char *slice_cg, const char *skip)
{
  const char *root = cgroup2_root ();
  char dir[PATH_MAX], child[PATH_MAX + 512], v[64], why[256];
  uint64_t sum = 0;
  struct dirent *d;
  DIR *dp;

  if (root == NULL)
    return;
  snprintf (dir, sizeof dir, "%s%s", root, slice_cg);
  dp = opendir (dir);
  if (dp == NULL)
    return;
  while ((d = readdir (dp)) != NULL) {
    if (d->d_type != DT_DIR || d->d_name[0] == '.')
      continue;
    snprintf (child, sizeof child, "%s/%s", slice_cg, d->d_name);
    if (skip && strcmp (child, skip) == 0)
      continue;
    snprintf (child, sizeof child, "%s/%s", dir, d->d_name);
    if (!populated (child))
      continue;
    snprintf (child, sizeof child, "%s/%s/memory.min", dir, d->d_name);
    if (read_line (child, v, sizeof v) && strcmp (v, "max") != 0)
      sum += strtoull (v, NULL, 10);
  }
  closedir (dp);
  if (systemd_runs ()) {
    const char *slash = strrchr (slice_cg, '/');

    systemd_set_memory_min (slash ? slash + 1 : slice_cg, sum, why,
                            sizeof why);
  }
  else {
    snprintf (v, sizeof v, "%" PRIu64, sum);
    snprintf (child, sizeof child, "%s/memory.min", dir);
    write_str (child, v);
  }
}

/* The parent directory of a cgroup path: "/a.slice/b" -> "/a.slice". */
static void
parent_of (const char *cg, char *buf, size_t len)
{
  const char *slash = strrchr (cg, '/');
  int n = slash ? (int) (slash - cg) : 0;

  snprintf (buf, len, "%.*s", n, cg);
}

/* The directory of systemd's slice under the cgroup root: "a-b.slice"
 * is ROOT/a.slice/a-b.slice.
 */
static void
slice_dir (const char *root, const char *slice, char *buf, size_t len)
{
  size_t n = snprintf (buf, len, "%s", root);
  const char *end = strstr (slice, ".slice");

  if (strcmp (slice, "-.slice") == 0 || end == NULL)
    return;
  for (const char *dash = slice; n < len; dash++) {
    dash = strchr (dash, '-');
    if (dash == NULL || dash > end)
      dash = end;
    n += snprintf (buf + n, len - n, "/%.*s.slice", (int) (dash - slice),
                   slice);
    if (dash == end)
      break;
  }
}

struct move {
  char *cg;
  size_t cglen;
  const char *scope, *scope_dir;
  int in;
};

/* In the scope yet?  Its cgroup.events is watched once it exists: it
 * changes when systemd moves us in.
 */
static bool
moved (void *arg)
{
  struct move *m = arg;
  size_t n = strlen (m->scope), k;
  char events[PATH_MAX + 32];

  if (proc_cgroup (getpid (), m->cg, m->cglen) && (k = strlen (m->cg)) > n &&
      strcmp (m->cg + k - n, m->scope) == 0 && m->cg[k - n - 1] == '/')
    return true;
  snprintf (events, sizeof events, "%s/cgroup.events", m->scope_dir);
  if (m->in >= 0)
    inotify_add_watch (m->in, events, IN_MODIFY);
  return false;
}

/* systemd makes the scope's cgroup in the slice's directory, then moves
 * pid into it, after StartTransientUnit has answered.
 */
static bool
wait_moved (const char *slice, const char *scope, char *cg, size_t cglen)
{
  const char *root = cgroup2_root ();
  char dir[PATH_MAX], scope_dir[PATH_MAX + 64];
  struct move m = { .cg = cg, .cglen = cglen, .scope = scope,
                    .scope_dir = scope_dir, .in = -1 };
  bool ok;

  slice_dir (root ? root : CGROUP_FS, slice, dir, sizeof dir);
  snprintf (scope_dir, sizeof scope_dir, "%s/%s", dir, scope);
  m.in = inotify_on (dir, IN_CREATE);
  ok = wait_until (m.in, moved, &m, deadline_in (SCOPE_WAIT_MS));
  if (m.in >= 0)
    close (m.in);
  return ok;
}

static bool
systemd_place (const char *slice, const char *what, char *cg, size_t cglen,
               char *why, size_t len)
{
  char scope[64], desc[256], parent[PATH_MAX], ignored[256];

  snprintf (scope, sizeof scope, "pdio-%d.scope", (int) getpid ());
  snprintf (desc, sizeof desc, "pdio: supervisor and server of %.200s", what);
  /* Fails once it exists (a unit file, an earlier attach): as it should. */
  systemd_make_slice (slice, "pdio's devices: their supervisors and servers",
                      ignored, sizeof ignored);
  if (!systemd_make_scope (scope, slice, desc, getpid (), DEVICE_MEMORY_MIN,
                           why, len))
    return false;
  if (!wait_moved (slice, scope, cg, cglen)) {
    snprintf (why, len, "systemd made %s but did not move pid %d into it "
              "within %d s", scope, (int) getpid (), SCOPE_WAIT_MS / 1000);
    return false;
  }
  parent_of (cg, parent, sizeof parent);
  slice_update_min (parent, NULL);
  return true;
}

static bool
has_word (const char *path, const char *word)
{
  char line[512];
  size_t n = strlen (word);

  if (!read_line (path, line, sizeof line))
    return false;
  for (char *p = line; (p = strstr (p, word)) != NULL; p += n)
    if ((p == line || p[-1] == ' ') && (p[n] == ' ' || p[n] == '\0'))
      return true;
  return false;
}

/* The controller for the children of dir (cgroup.subtree_control). */
static bool
enable_memory (const char *dir, char *why, size_t len)
{
  char path[PATH_MAX + 32];

  snprintf (path, sizeof path, "%s/cgroup.subtree_control", dir);
  if (has_word (path, "memory") || write_str (path, "+memory"))
    return true;
  snprintf (why, len, "cannot enable the memory controller in %s: %m", path);
  return false;
}

/* Removes SLICE/pdio-PID directories whose supervisor is gone and that
 * nothing lives in any more (a supervisor killed before it could).
 */
static void
sweep (const char *dir)
{
  char path[PATH_MAX + 256];
  struct dirent *d;
  DIR *dp = opendir (dir);

  if (dp == NULL)
    return;
  while ((d = readdir (dp)) != NULL) {
    unsigned long pid;

    if (strncmp (d->d_name, "pdio-", 5) != 0 ||
        !parse_uint (d->d_name + 5, 1, INT32_MAX, &pid) ||
        pid_alive ((pid_t) pid))
      continue;
    snprintf (path, sizeof path, "%s/%s", dir, d->d_name);
    if (!populated (path))
      rmdir (path);
  }
  closedir (dp);
}

static bool
cgroupfs_place (const char *slice, char *cg, size_t cglen, char *why,
                size_t len)
{
  char dir[PATH_MAX], mine[PATH_MAX + 32], path[PATH_MAX + 64], v[32];

  if (!has_word (CGROUP_FS "/cgroup.controllers", "memory")) {
    snprintf (why, len, "cgroup v2 at " CGROUP_FS " has no memory "
              "controller");
    return false;
  }
  if (!enable_memory (CGROUP_FS, why, len))
    return false;
  snprintf (dir, sizeof dir, CGROUP_FS "/%s", slice);
  if (mkdir (dir, 0755) == -1 && errno != EEXIST) {
    snprintf (why, len, "cannot make %s: %m", dir);
    return false;
  }
  if (!enable_memory (dir, why, len))
    return false;
  sweep (dir);
  snprintf (mine, sizeof mine, "%s/pdio-%d", dir, (int) getpid ());
  if (mkdir (mine, 0755) == -1 && errno != EEXIST) {
    snprintf (why, len, "cannot make %s: %m", mine);
    return false;
  }
  snprintf (path, sizeof path, "%s/memory.min", mine);
  snprintf (v, sizeof v, "%d", DEVICE_MEMORY_MIN);
  if (!write_str (path, v)) {
    snprintf (why, len, "cannot write %s: %m", path);
    rmdir (mine);
    return false;
  }
  snprintf (path, sizeof path, "%s/cgroup.procs", mine);
  snprintf (v, sizeof v, "%d", (int) getpid ());
  if (!write_str (path, v)) {
    snprintf (why, len, "cannot move pid %s into %s: %m", v, mine);
    rmdir (mine);
    return false;
  }
  snprintf (cg, cglen, "/%s/pdio-%d", slice, (int) getpid ());
  snprintf (dir, sizeof dir, "/%s", slice);
  slice_update_min (dir, NULL);
  return true;
}

bool
place_self (const char *slice, const char *what, char *cg, size_t cglen,
            char *why, size_t len)
{
  bool placed;
  int lock;

  cg[0] = '\0';
  if (strcmp (slice, "none") == 0) {
    snprintf (why, len, "--slice none");
    return false;
  }
  if (geteuid () != 0) {
    snprintf (why, len, "not root");
    return false;
  }
  lock = lock_cgroups ();
  if (systemd_runs ())
    placed = systemd_place (slice, what, cg, cglen, why, len);
  else if (is_cgroup2 (CGROUP_FS))
    placed = cgroupfs_place (slice, cg, cglen, why, len);
  else {
    snprintf (why, len, "no systemd, and no cgroup v2 at " CGROUP_FS);
    placed = false;
  }
  unlock_cgroups (lock);
  if (!placed)
    cg[0] = '\0';
  return placed;
}

static bool
emptied (void *arg)
{
  return !populated (arg);
}

/* Waits until nothing lives in cgroup cg any more.  Its processes were
 * waited for, but a process counts as gone once its main thread is a
 * zombie, and its other threads may still be on their way out (nbdkit's
 * dozens): until they are, the cgroup is populated (rmdir says EBUSY),
 * briefly.
 */
static void
wait_empty (const char *cg)
{
  const char *root = cgroup2_root ();
  char path[PATH_MAX + 32];
  int in;

  if (root == NULL)
    return;
  /* cgroup.events changes when the last thread leaves. */
  snprintf (path, sizeof path, "%s%s/cgroup.events", root, cg);
  in = inotify_on (path, IN_MODIFY);
  path[strlen (path) - strlen ("/cgroup.events")] = '\0';
  wait_until (in, emptied, path, deadline_in (EXITING_WAIT_MS));
  if (in >= 0)
    close (in);
}

static void
remove_cgroup (const char *cg)
{
  char path[PATH_MAX + 32];

  wait_empty (cg);
  snprintf (path, sizeof path, CGROUP_FS "%s", cg);
  rmdir (path);
}

/* A cgroup pdio made itself (not a systemd unit's): SLICE/pdio-PID. */
static bool
made_by_pdio (const char *cg)
{
  const char *base = strrchr (cg, '/');

  return base && strncmp (base + 1, "pdio-", 5) == 0 &&
    strchr (base + 1, '.') == NULL && !systemd_runs ();
}

void
placement_leave (const char *cg)
{
  char parent[PATH_MAX], pid[16];
  int lock;

  if (cg == NULL || cg[0] == '\0')
    return;
  lock = lock_cgroups ();
  parent_of (cg, parent, sizeof parent);
  if (made_by_pdio (cg)) {
    /* A cgroup with a process in it cannot go: move to the root (the
     * one cgroup that may hold processes beside its children), and
     * remove it unless a server still lives there.
     */
    snprintf (pid, sizeof pid, "%d", (int) getpid ());
    write_str (CGROUP_FS "/cgroup.procs", pid);
    remove_cgroup (cg);
  }
  slice_update_min (parent, cg);
  unlock_cgroups (lock);
}

void
placement_remove (const char *cg)
{
  char parent[PATH_MAX];
  int lock;

  if (cg == NULL || cg[0] == '\0')
    return;
  lock = lock_cgroups ();
  parent_of (cg, parent, sizeof parent);
  if (made_by_pdio (cg))
    remove_cgroup (cg);
  else
    wait_empty (cg);            /* systemd removes its scope itself */
  slice_update_min (parent, NULL);
  unlock_cgroups (lock);
}
