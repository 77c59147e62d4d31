/* SPDX-License-Identifier: BSD-3-Clause */
/* umount.pdio: umount(8)'s helper for what mount.pdio mounted.
 * mount.pdio records "helper=pdio" in the mount's userspace options
 * (libmount's utab), so umount(8), and systemd stopping an fstab mount
 * unit, run /sbin/umount.pdio DIR [-flnrv] [-N NS] [-t TYPE] instead of
 * unmounting by themselves.  This unmounts with umount -i (no helper: that
 * is us) and, when that was the device's last user and autoclear
 * disconnected it, waits for its supervisor to stop the server and remove
 * the state: when umount returns, nothing of pdio holds the image any
 * more, so the filesystem the image lives on can be unmounted next (as
 * systemd does at shutdown, at once).
 */
#include <config.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "pdio.h"

#define CMD "umount.pdio"
/* umount(8)'s exit statuses: usage, mount failure. */
#define UMOUNT_EX_USAGE 1
#define UMOUNT_EX_FAIL 32
/* How long autoclear may take to disconnect the device after the unmount,
 * and the supervisor to stop the server and remove the state after that.
 */
#define DISCONNECT_WAIT_MS 3000
#define CLEANUP_WAIT_MS 15000

static bool
disconnected (int idx, void *arg)
{
  (void) arg;
  return !device_connected (idx);
}

/* mountinfo escapes blanks and backslashes as \ooo. */
static void
unescape (char *s)
{
  char *o = s;

  for (; *s; s++)
    if (s[0] == '\\' && s[1] >= '0' && s[1] <= '3' && s[2] >= '0' &&
        s[2] <= '7' && s[3] >= '0' && s[3] <= '7') {
      *o++ = (char) ((s[1] - '0') * 64 + (s[2] - '0') * 8 + (s[3] - '0'));
      s += 3;
    }
    else
      *o++ = *s;
  *o = '\0';
}

/* The device mounted on DIR, topmost mount, if it is /dev/nbdN. */
static bool
device_on (const char *dir, char *device, size_t len)
{
  char line[8192], target[PATH_MAX];
  unsigned maj, mnr;
  bool found = false;
  FILE *fp;

  if (realpath (dir, target) == NULL)
    snprintf (target, sizeof target, "%s", dir);
  fp = fopen ("/proc/self/mountinfo", "re");
  if (fp == NULL)
    return false;
  /* ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [TAGS...] - TYPE SOURCE ... */
  while (fgets (line, sizeof line, fp)) {
    char mp[PATH_MAX];

    if (sscanf (line, "%*u %*u %u:%u %*s %4095s", &maj, &mnr, mp) != 3)
      continue;
    unescape (mp);
    if (strcmp (mp, target) != 0)
      continue;
    /* By the device number: the source field may name a path that is
     * not the node's.
     */
    found = false;
    {
      char sys[64], link[PATH_MAX], name[64];
      ssize_t n;

      snprintf (sys, sizeof sys, "/sys/dev/block/%u:%u", maj, mnr);
      n = readlink (sys, link, sizeof link - 1);
      if (n > 0) {
        const char *base;

        link[n] = '\0';
        base = strrchr (link, '/');
        snprintf (name, sizeof name, "/dev/%.40s", base ? base + 1 : link);
        if (nbd_index (name) >= 0) {
          snprintf (device, len, "%s", name);
          found = true;
        }
      }
    }
  }
  fclose (fp);
  return found;
}

int
cmd_umount (int argc, char **argv)
{
  static const char flags[] = "flnrv";
  char umount[PATH_MAX], device[64] = "";
  const char *args[4 + sizeof flags];
  const char *target;
  bool set[sizeof flags] = { false }, have_record = false;
  struct record r;
  int c, i = 0, st;

  /* umount(8) puts the options after the operand. */
  while ((c = getopt (argc, argv, "flnrvN:t:h")) != -1)
    switch (c) {
    case 'f': case 'l': case 'n': case 'r': case 'v':
      set[strchr (flags, c) - flags] = true;
      break;
    case 't': break;
    case 'N':
      errorf (CMD ": -N (mount namespaces) is not supported");
      return UMOUNT_EX_USAGE;
    case 'h':
    default:
      fprintf (stderr, "Usage: umount.pdio DIR|DEVICE [-flnrv]\n  (run by "
               "umount(8) for what mount.pdio mounted)\n");
      return UMOUNT_EX_USAGE;
    }
  if (argc - optind != 1) {
    errorf (CMD ": give DIR or DEVICE");
    return UMOUNT_EX_USAGE;
  }
  target = argv[optind];
  args[i++] = umount;
  args[i++] = "-i";             /* no helper: that is us */
  for (size_t f = 0; f < sizeof flags - 1; f++)
    if (set[f])
      args[i++] = (const char *[]) { "-f", "-l", "-n", "-r", "-v" }[f];
  args[i++] = target;
  args[i] = NULL;
  if (!find_program (NULL, "umount", umount, sizeof umount)) {
    errorf (CMD ": umount(8) not found");
    return UMOUNT_EX_FAIL;
  }

  /* What to wait for, learnt before the unmount. */
  {
    struct stat sb;

    if (stat (target, &sb) == 0 && S_ISBLK (sb.st_mode)) {
      if (nbd_index (target) >= 0)
        snprintf (device, sizeof device, "%s", target);
    }
    else
      device_on (target, device, sizeof device);
  }
  if (device[0] && record_load_device (device, &r) == 0 && r.autoclear)
    have_record = true;

  st = run_wait ((char **) args, -1);
  if (st != 0)
    return st < 0 ? UMOUNT_EX_FAIL : st;
  /* Lazily unmounted, the filesystem may hold the device for a while. */
  if (!have_record || set[1] /* -l */)
    return EXIT_OK;

  {
    /* Still connected: another user holds the device (a second mount, an
     * open), and autoclear disconnects it when that one lets go.
     */
    if (!wait_nbd (nbd_index (device), disconnected, NULL,
                   DISCONNECT_WAIT_MS))
      return EXIT_OK;
    /* The supervisor exits once the server is gone, the image's lock
     * free and the state removed.  (Without one, nobody stops the
     * server: pdio detach does, as for any unsupervised device.)
     */
    if (r.supervisor_pid > 0 && pid_is_supervisor (r.supervisor_pid) &&
        !wait_exited (r.supervisor_pid, CLEANUP_WAIT_MS))
      warnf (CMD ": %s: its supervisor (pid %d) has not finished after %u "
             "s", device, (int) r.supervisor_pid, CLEANUP_WAIT_MS / 1000);
  }
  return EXIT_OK;
}
