/* SPDX-License-Identifier: BSD-3-Clause */
/* /dev/nbdN as the kernel sees it, from sysfs and mountinfo.  A device
 * exists when /sys/block/nbdN does; it is connected while the kernel has
 * a client for it (/sys/block/nbdN/pid, present only then), and shows
 * what it was connected with in /sys/block/nbdN/backend meanwhile.
 */
#include <config.h>

#include <dirent.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "pdio.h"

/* SYSFS/block/nbdIDX/NAME exists (NAME may be ""). */
static bool
sys_exists (int idx, const char *name)
{
  char path[PATH_MAX];

  snprintf (path, sizeof path, "%s/block/nbd%d/%s", sysfs (), idx, name);
  return access (path, F_OK) == 0;
}

bool
nbd_driver_present (void)
{
  char path[PATH_MAX];

  /* Loaded as a module or built in (it has parameters, so it is listed
   * under /sys/module either way).
   */
  snprintf (path, sizeof path, "%s/module/nbd", sysfs ());
  return access (path, F_OK) == 0 || sys_exists (0, "");
}

int
nbd_index (const char *name)
{
  unsigned long v;

  if (strncmp (name, "/dev/", 5) == 0)
    name += 5;
  if (strncmp (name, "nbd", 3) != 0 || !parse_uint (name + 3, 0, 1 << 20, &v))
    return -1;
  return v;
}

bool
nbd_exists (int idx)
{
  return sys_exists (idx, "");
}

bool
nbd_connected (int idx)
{
  return sys_exists (idx, "pid");
}

uint64_t
nbd_size (int idx)
{
  char path[PATH_MAX];
  uint64_t sectors = 0;
  FILE *fp;

  snprintf (path, sizeof path, "%s/block/nbd%d/size", sysfs (), idx);
  fp = fopen (path, "re");
  if (fp) {
    if (fscanf (fp, "%" SCNu64, &sectors) != 1)
      sectors = 0;
    fclose (fp);
  }
  return sectors * 512;
}

int
nbd_nbds_max (void)
{
  char path[PATH_MAX];
  int n = -1;
  FILE *fp;

  snprintf (path, sizeof path, "%s/module/nbd/parameters/nbds_max", sysfs ());
  fp = fopen (path, "re");
  if (fp) {
    if (fscanf (fp, "%d", &n) != 1)
      n = -1;
    fclose (fp);
  }
  return n >= 0 ? n : 16;
}

bool
nbd_backend (int idx, char *buf, size_t len)
{
  char path[PATH_MAX];

  snprintf (path, sizeof path, "%s/block/nbd%d/backend", sysfs (), idx);
  return read_line (path, buf, len);
}

bool
nbd_set_io_timeout (int idx, unsigned ms)
{
  char path[PATH_MAX];
  FILE *fp;
  bool ok;

  snprintf (path, sizeof path, "%s/block/nbd%d/queue/io_timeout", sysfs (),
            idx);
  fp = fopen (path, "we");
  if (fp == NULL)
    return false;
  ok = fprintf (fp, "%u\n", ms) > 0;
  /* sysfs reports a refused value at the write, i.e. at fclose. */
  if (fclose (fp) == EOF)
    ok = false;
  return ok;
}

static void
write_change (const char *dir)
{
  char path[PATH_MAX];
  FILE *fp;

  snprintf (path, sizeof path, "%s/uevent", dir);
  fp = fopen (path, "we");
  if (fp == NULL)
    return;
  fputs ("change", fp);
  fclose (fp);
}

void
nbd_announce (int idx)
{
  char dir[PATH_MAX], part[PATH_MAX + 256], prefix[32];
  struct dirent *d;
  DIR *dp;
  int n;

  snprintf (dir, sizeof dir, "%s/block/nbd%d", sysfs (), idx);
  write_change (dir);
  n = snprintf (prefix, sizeof prefix, "nbd%dp", idx);
  dp = opendir (dir);
  if (dp == NULL)
    return;
  while ((d = readdir (dp)) != NULL)
    if (strncmp (d->d_name, prefix, n) == 0) {
      snprintf (part, sizeof part, "%s/%s", dir, d->d_name);
      write_change (part);
    }
  closedir (dp);
}

bool
nbd_set_max_request (int idx, uint32_t bytes, unsigned *kb)
{
  char path[PATH_MAX], line[32];
  unsigned long hw;
  FILE *fp;
  bool ok;

  snprintf (path, sizeof path, "%s/block/nbd%d/queue/max_hw_sectors_kb",
            sysfs (), idx);
  if (!read_line (path, line, sizeof line))
    return false;
  hw = strtoul (line, NULL, 10);
  *kb = bytes / 1024 < hw ? bytes / 1024 : (unsigned) hw;
  snprintf (path, sizeof path, "%s/block/nbd%d/queue/max_sectors_kb",
            sysfs (), idx);
  fp = fopen (path, "we");
  if (fp == NULL)
    return false;
  ok = fprintf (fp, "%u\n", *kb) > 0;
  /* sysfs reports a refused value at the write, i.e. at fclose. */
  if (fclose (fp) == EOF)
    ok = false;
  return ok;
}

bool
nbd_in_flight (int idx)
{
  char path[PATH_MAX];
  unsigned long reads, writes;
  FILE *fp;
  bool busy = true;

  snprintf (path, sizeof path, "%s/block/nbd%d/inflight", sysfs (), idx);
  fp = fopen (path, "re");
  if (fp) {
    if (fscanf (fp, "%lu %lu", &reads, &writes) == 2)
      busy = reads + writes > 0;
    fclose (fp);
  }
  return busy;
}

/* "MAJ:MIN" of a sysfs block directory's dev file into buf. */
static bool
read_devno (const char *dir, char *buf, size_t len)
{
  char path[PATH_MAX];

  snprintf (path, sizeof path, "%s/dev", dir);
  return read_line (path, buf, len) && buf[0];
}

/* The mount point of MAJ:MIN from /proc/self/mountinfo, if mounted. */
static bool
mounted_at (const char *devno, char *where, size_t len)
{
  char line[4096], id[32], mnt[PATH_MAX];
  bool found = false;
  FILE *fp = fopen ("/proc/self/mountinfo", "re");

  if (fp == NULL)
    return false;
  while (!found && fgets (line, sizeof line, fp))
    /* "ID PARENT MAJ:MIN ROOT MOUNTPOINT ..." */
    if (sscanf (line, "%*s %*s %31s %*s %4095s", id, mnt) == 2 &&
        strcmp (id, devno) == 0) {
      snprintf (where, len, "mounted on %s", mnt);
      found = true;
    }
  fclose (fp);
  return found;
}

/* The first entry of DIR/holders (device-mapper, md, ...), if any. */
static bool
held_by (const char *dir, char *what, size_t len)
{
  char path[PATH_MAX];
  struct dirent *d;
  bool found = false;
  DIR *h;

  snprintf (path, sizeof path, "%s/holders", dir);
  h = opendir (path);
  if (h == NULL)
    return false;
  while (!found && (d = readdir (h)) != NULL)
    if (d->d_name[0] != '.') {
      snprintf (what, len, "held by %s", d->d_name);
      found = true;
    }
  closedir (h);
  return found;
}

static bool
dir_busy (const char *dir, char *buf, size_t len)
{
  char devno[32];

  return (read_devno (dir, devno, sizeof devno) &&
          mounted_at (devno, buf, len)) || held_by (dir, buf, len);
}

bool
nbd_busy (int idx, char *buf, size_t len)
{
  char dir[PATH_MAX], part[PATH_MAX + 256], prefix[32];
  struct dirent *d;
  bool busy;
  DIR *dp;

  snprintf (dir, sizeof dir, "%s/block/nbd%d", sysfs (), idx);
  if (dir_busy (dir, buf, len))
    return true;
  /* Partitions: nbdNp1 ... */
  snprintf (prefix, sizeof prefix, "nbd%dp", idx);
  dp = opendir (dir);
  if (dp == NULL)
    return false;
  busy = false;
  while (!busy && (d = readdir (dp)) != NULL)
    if (strncmp (d->d_name, prefix, strlen (prefix)) == 0) {
      snprintf (part, sizeof part, "%s/%s", dir, d->d_name);
      busy = dir_busy (part, buf, len);
    }
  closedir (dp);
  return busy;
}
