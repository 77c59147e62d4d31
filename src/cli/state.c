/* SPDX-License-Identifier: BSD-3-Clause */
/* The run directory (/run/pdio).  Per attachment, named after the image
 * (NAME, image_name in claim.c), because they exist before the kernel
 * picks the device: the image's claim NAME.claim, the server's socket
 * NAME.sock, the socket where pdio's own server waits for a successor
 * NAME.handover, its pid file NAME.pid and its log NAME.log (the previous
 * server's in NAME.log.prev).  Named after the device once it is
 * connected: the supervisor's log nbdN.supervisor.log and a record
 * nbdN.rec of "key=value" lines, so that list and detach know what attach
 * did.  The directory's "lock" file orders the changes of device numbers
 * (state_lock in pdio.h).
 */
#include <config.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include "pdio.h"

int
state_lock (const char *cmd)
{
  char path[PATH_MAX];
  int fd;

  if (!make_rundir (cmd))
    return -1;
  snprintf (path, sizeof path, "%s/lock", rundir ());
  fd = open (path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd == -1) {
    errorf ("%s: %s: %m", cmd, path);
    return -1;
  }
  if (flock (fd, LOCK_EX) == -1) {
    errorf ("%s: %s: flock: %m", cmd, path);
    close (fd);
    return -1;
  }
  return fd;
}

static bool
locked (void *arg)
{
  return flock (*(int *) arg, LOCK_EX | LOCK_NB) == 0;
}

int
state_lock_within (unsigned ms)
{
  char path[PATH_MAX];
  int fd, in;
  bool ok;

  snprintf (path, sizeof path, "%s/lock", rundir ());
  fd = open (path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd == -1)
    return -1;
  /* The holder lets go when it closes the file (or exits). */
  in = inotify_on (path, IN_CLOSE_WRITE);
  ok = wait_until (in, locked, &fd, deadline_in (ms));
  if (in >= 0)
    close (in);
  if (!ok) {
    close (fd);
    return -1;
  }
  return fd;
}

void
state_path (const char *base, const char *ext, char *buf, size_t len)
{
  const char *slash = strrchr (base, '/');

  snprintf (buf, len, "%s/%s.%s", rundir (), slash ? slash + 1 : base, ext);
}

int
record_write (const struct record *r)
{
  char path[PATH_MAX], tmp[PATH_MAX + 8];
  FILE *fp;

  state_path (r->device, "rec", path, sizeof path);
  snprintf (tmp, sizeof tmp, "%s.tmp", path);
  fp = fopen (tmp, "we");
  if (fp == NULL)
    return -1;
  fprintf (fp, "device=%s\nimage=%s\nsocket=%s\nreadonly=%d\n"
           "connections=%u\nblock_size=%" PRIu32 "\ndio_align=%" PRIu32 "\n"
           "size=%" PRIu64 "\nserver_pid=%d\n",
           r->device, r->image, r->socket, r->readonly, r->connections,
           r->block_size, r->dio_align, r->size, (int) r->server_pid);
  fprintf (fp, "supervisor_pid=%d\ntimeout=%u\ndead_timeout=%u\n"
           "autoclear=%d\nrestarts=%u\nreason=%s\ngave_up=%d\n",
           (int) r->supervisor_pid, r->timeout, r->dead_timeout, r->autoclear,
           r->restarts, r->reason, r->gave_up);
  fprintf (fp, "frontend=%s\nplugin=%s\nthreads=%u\n",
           r->nbdkit ? "nbdkit" : "native", r->plugin, r->threads);
  fprintf (fp, "name=%s\nbackend=%s\non_demand=%d\n", r->name, r->backend,
           r->on_demand);
  fprintf (fp, "swap=%d\nslice=%s\ncgroup=%s\n", r->swap, r->slice,
           r->cgroup);
  if (r->remote)
    fprintf (fp, "remote=1\nshared=%d\nlink=%s\nlink_since=%lld\n"
             "link_why=%s\noutages=%u\nlast_outage_ms=%ld\n", r->shared,
             r->link, r->link_since, r->link_why, r->outages,
             r->last_outage_ms);
  if (r->remote && r->tls[0])
    fprintf (fp, "tls=%s\n", r->tls);
  if (fclose (fp) == EOF || rename (tmp, path) == -1) {
    unlink (tmp);
    return -1;
  }
  return 0;
}

static void
set_field (struct record *r, const char *key, const char *value)
{
  if (strcmp (key, "device") == 0)
    snprintf (r->device, sizeof r->device, "%s", value);
  else if (strcmp (key, "image") == 0)
    snprintf (r->image, sizeof r->image, "%s", value);
  else if (strcmp (key, "socket") == 0)
    snprintf (r->socket, sizeof r->socket, "%s", value);
  else if (strcmp (key, "readonly") == 0)
    r->readonly = atoi (value) != 0;
  else if (strcmp (key, "connections") == 0)
    r->connections = strtoul (value, NULL, 10);
  else if (strcmp (key, "block_size") == 0)
    r->block_size = strtoul (value, NULL, 10);
  else if (strcmp (key, "dio_align") == 0)
    r->dio_align = strtoul (value, NULL, 10);
  else if (strcmp (key, "size") == 0)
    r->size = strtoull (value, NULL, 10);
  else if (strcmp (key, "server_pid") == 0)
    r->server_pid = atoi (value);
  else if (strcmp (key, "supervisor_pid") == 0)
    r->supervisor_pid = atoi (value);
  else if (strcmp (key, "timeout") == 0)
    r->timeout = strtoul (value, NULL, 10);
  else if (strcmp (key, "dead_timeout") == 0)
    r->dead_timeout = strtoul (value, NULL, 10);
  else if (strcmp (key, "autoclear") == 0)
    r->autoclear = atoi (value) != 0;
  else if (strcmp (key, "restarts") == 0)
    r->restarts = strtoul (value, NULL, 10);
  else if (strcmp (key, "reason") == 0)
    snprintf (r->reason, sizeof r->reason, "%s", value);
  else if (strcmp (key, "gave_up") == 0)
    r->gave_up = atoi (value) != 0;
  else if (strcmp (key, "frontend") == 0)
    r->nbdkit = strcmp (value, "nbdkit") == 0;
  else if (strcmp (key, "plugin") == 0)
    snprintf (r->plugin, sizeof r->plugin, "%s", value);
  else if (strcmp (key, "threads") == 0)
    r->threads = strtoul (value, NULL, 10);
  else if (strcmp (key, "name") == 0)
    snprintf (r->name, sizeof r->name, "%s", value);
  else if (strcmp (key, "backend") == 0)
    snprintf (r->backend, sizeof r->backend, "%s", value);
  else if (strcmp (key, "on_demand") == 0)
    r->on_demand = atoi (value) != 0;
  else if (strcmp (key, "swap") == 0)
    r->swap = atoi (value) != 0;
  else if (strcmp (key, "slice") == 0)
    snprintf (r->slice, sizeof r->slice, "%s", value);
  else if (strcmp (key, "cgroup") == 0)
    snprintf (r->cgroup, sizeof r->cgroup, "%s", value);
  else if (strcmp (key, "remote") == 0)
    r->remote = atoi (value) != 0;
  else if (strcmp (key, "shared") == 0)
    r->shared = atoi (value) != 0;
  else if (strcmp (key, "link") == 0)
    snprintf (r->link, sizeof r->link, "%s", value);
  else if (strcmp (key, "link_since") == 0)
    r->link_since = strtoll (value, NULL, 10);
  else if (strcmp (key, "link_why") == 0)
    snprintf (r->link_why, sizeof r->link_why, "%s", value);
  else if (strcmp (key, "outages") == 0)
    r->outages = strtoul (value, NULL, 10);
  else if (strcmp (key, "last_outage_ms") == 0)
    r->last_outage_ms = strtol (value, NULL, 10);
  else if (strcmp (key, "tls") == 0)
    snprintf (r->tls, sizeof r->tls, "%s", value);
}

static int
record_read (const char *path, struct record *r)
{
  char line[PATH_MAX + 32];
  FILE *fp = fopen (path, "re");

  if (fp == NULL)
    return -1;
  memset (r, 0, sizeof *r);
  while (fgets (line, sizeof line, fp)) {
    char *eq = strchr (line, '=');

    line[strcspn (line, "\n")] = '\0';
    if (eq) {
      *eq = '\0';
      set_field (r, line, eq + 1);
    }
  }
  fclose (fp);
  /* A record without a device is not one of ours. */
  if (nbd_index (r->device) < 0)
    return -1;
  /* An older pdio named the attachment's files after the device. */
  if (r->name[0] == '\0')
    snprintf (r->name, sizeof r->name, "%s", r->device + 5);
  return 0;
}

int
record_load_device (const char *device, struct record *r)
{
  char path[PATH_MAX];

  state_path (device, "rec", path, sizeof path);
  return record_read (path, r);
}

static int
by_device (const void *a, const void *b)
{
  return nbd_index (((const struct record *) a)->device) -
         nbd_index (((const struct record *) b)->device);
}

struct record *
records_slot (struct record **v, size_t *cap, size_t n)
{
  if (n == *cap) {
    size_t want = *cap ? *cap * 2 : 8;
    struct record *nv = realloc (*v, want * sizeof **v);

    if (nv == NULL)
      return NULL;
    *v = nv;
    *cap = want;
  }
  return &(*v)[n];
}

void
records_sort (struct record *v, size_t n)
{
  if (n)
    qsort (v, n, sizeof *v, by_device);
}

struct record *
records_load (size_t *n)
{
  DIR *dir = opendir (rundir ());
  struct record *v = NULL, *r;
  struct dirent *d;
  size_t cap = 0;

  *n = 0;
  if (dir == NULL)
    return NULL;
  while ((d = readdir (dir)) != NULL) {
    size_t len = strlen (d->d_name);
    char path[PATH_MAX];

    if (len < 5 || strcmp (d->d_name + len - 4, ".rec") != 0)
      continue;
    if ((r = records_slot (&v, &cap, *n)) == NULL)
      break;
    snprintf (path, sizeof path, "%s/%s", rundir (), d->d_name);
    if (record_read (path, r) == 0)
      (*n)++;
  }
  closedir (dir);
  records_sort (v, *n);
  return v;
}

/* The record goes last: whatever an interruption leaves, detach finds it
 * by its record.  The claim file is the caller's (claim_drop).
 */
void
state_remove (const struct record *r)
{
  static const char *const named[] = {
    "sock", "handover", "pid", "log", "log.prev", "stats",
  };
  char path[PATH_MAX];

  for (size_t i = 0; i < sizeof named / sizeof named[0]; i++) {
    state_path (r->name, named[i], path, sizeof path);
    unlink (path);
  }
  /* A failed attach, before the kernel's pick; or an orphan, which has
   * none (a record there is another attachment's).
   */
  if (r->device[0] == '\0' || r->orphan)
    return;
  state_path (r->device, "supervisor.log", path, sizeof path);
  unlink (path);
  state_path (r->device, "rec", path, sizeof path);
  unlink (path);
}

/* A supervisor whose device went away removes its files, but the device's
 * number may already be another attachment's: the device's own files go
 * only while the record there is still ours (the same backend), under the
 * run directory's lock, which an attach holds from connecting to writing
 * its record; waited for up to lock_ms (a detach that holds it cleans up
 * itself).
 */
void
state_forget_device (const struct record *rec, int idx, unsigned lock_ms)
{
  struct record cur, mine = *rec;
  int lock = state_lock_within (lock_ms);

  if (lock >= 0 && !nbd_connected (idx))
    device_drop_partitions (rec->device);
  if (lock == -1 ||
      (record_load_device (rec->device, &cur) == 0 &&
       strcmp (cur.backend, rec->backend) != 0))
    mine.device[0] = '\0';
  state_remove (&mine);
  if (lock >= 0)
    close (lock);
}
