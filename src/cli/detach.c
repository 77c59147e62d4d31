/* SPDX-License-Identifier: BSD-3-Clause */
/* pdio detach DEVICE|IMAGE, pdio detach --all: stop the device's
 * supervisor (so that it does not restart the server), take over the
 * image's claim from it (an attach of the image waits meanwhile),
 * disconnect the device over netlink (a device made on demand is then
 * destroyed by the kernel), stop its server by the pid in the record,
 * remove its files from the run directory.  A device that is mounted or
 * held is refused unless --force.  Records whose server or device is gone
 * (stale) are cleaned up as well; a device whose number the kernel has
 * given to another attachment since is left alone.  A device connected
 * by an attach that died before its record (attachments.c) goes the
 * same way, its server found by the pid file of the attachment its
 * identifier names.
 */
#include <config.h>

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <signal.h>

#include "pdio.h"

#define CMD "pdio detach"
/* How long the kernel has to let go of a device after NBD_CMD_DISCONNECT;
 * with --force, how long before a device still in use is left to let go
 * when it is closed.
 */
#define DISCONNECT_WAIT_MS 10000
#define FORCED_WAIT_MS 2000

struct detach_opts {
  bool all, force;
  const char *what;             /* DEVICE or IMAGE */
};

static void
usage (FILE *fp)
{
  fprintf (fp,
"Usage: pdio detach [--force] DEVICE|IMAGE|URI\n"
"       pdio detach [--force] --all\n"
"Disconnect the device, stop its server and remove its socket.\n"
"\n"
"  -a, --all      detach every device pdio attached\n"
"  -f, --force    detach even if mounted or in use (the file system there\n"
"                 gets I/O errors)\n");
}

static int
parse (int argc, char **argv, struct detach_opts *o)
{
  static const struct option longopts[] = {
    { "all", no_argument, NULL, 'a' },
    { "force", no_argument, NULL, 'f' },
    { "help", no_argument, NULL, 'h' },
    { NULL, 0, NULL, 0 },
  };
  int c;

  *o = (struct detach_opts) { .all = false };
  while ((c = getopt_long (argc, argv, "+afh", longopts, NULL)) != -1)
    switch (c) {
    case 'a': o->all = true; break;
    case 'f': o->force = true; break;
    case 'h': usage (stdout); exit (EXIT_OK);
    default: usage (stderr); return EXIT_USAGE;
    }
  if (o->all ? optind != argc : optind != argc - 1) {
    errorf (CMD ": %s", o->all ? "--all takes no DEVICE or IMAGE"
                               : "give one DEVICE or IMAGE, or --all");
    usage (stderr);
    return EXIT_USAGE;
  }
  o->what = o->all ? NULL : argv[optind];
  return EXIT_OK;
}

/* NBD_CMD_DISCONNECT, then wait for the kernel to drop the device.  A
 * device still mounted (--force) keeps its connection state until it is
 * unmounted: then only say so.
 */
static bool
let_go (int idx, void *arg)
{
  (void) arg;
  return !nbd_connected (idx) && !nbd_size (idx);
}

static bool
disconnect (const char *device, int idx, bool force)
{
  char why[256];

  if (!device_disconnect (device, why, sizeof why)) {
    errorf (CMD ": %s: %s", device, why);
    return false;
  }
  if (!wait_nbd (idx, let_go, NULL,
                 force ? FORCED_WAIT_MS : DISCONNECT_WAIT_MS)) {
    if (force) {
      warnf (CMD ": warning: %s: disconnected, but in use: the kernel lets "
             "go of it when it is closed (unmounted)", device);
      return true;
    }
    errorf (CMD ": %s: still connected %d s after NBD_CMD_DISCONNECT",
            device, DISCONNECT_WAIT_MS / 1000);
    return false;
  }
  device_drop_partitions (device);
  return true;
}

/* The device, its server and its files go. */
static int
detach_claimed (const struct detach_opts *o, const struct record *r, int idx)
{
  if (device_is_ours (r) && !disconnect (r->device, idx, o->force))
    return EXIT_FAILED;
  /* The pid is the server's unless it died and the pid was reused. */
  if (pid_alive (r->server_pid) && pid_is_server (r->server_pid)) {
    server_stop (r->server_pid);
    if (pid_alive (r->server_pid)) {
      errorf (CMD ": %s: its server, pid %d, does not exit", r->device,
              (int) r->server_pid);
      return EXIT_FAILED;
    }
  }
  /* Supervisor and server gone: so is the reason for their cgroup. */
  placement_remove (r->cgroup);
  /* Whoever attaches the image next must not be refused by the lock of a
   * server that has just exited.
   */
  image_lock_free (r->image, 2000);
  state_remove (r);
  return EXIT_OK;
}

static int
detach_one (const struct detach_opts *o, const struct record *rec)
{
  int idx = nbd_index (rec->device);
  char why[PATH_MAX + 32];
  struct record fresh;
  const struct record *r = rec;
  struct claim_holder h;
  int claim, st;

  if (!o->force && device_is_ours (r) && nbd_busy (idx, why, sizeof why)) {
    errorf (CMD ": %s: is %s: unmount it first (or --force)", r->device,
            why);
    return EXIT_FAILED;
  }
  /* First the supervisor, or it would restart what we stop.  It may have
   * been restarting the server: the record then names the new one.  Its
   * claim is ours once its last thread (a TLS relay's) has exited, which
   * may be after its main thread.
   */
  if (pid_is_supervisor (r->supervisor_pid)) {
    kill (r->supervisor_pid, SIGTERM);
    if (!wait_exited (r->supervisor_pid, 15000)) {
      errorf (CMD ": %s: its supervisor, pid %d, does not exit", r->device,
              (int) r->supervisor_pid);
      return EXIT_FAILED;
    }
    if (record_load_device (r->device, &fresh) == 0)
      r = &fresh;
  }
  /* The supervisor let go of it by exiting; anyone else (pdio restart's
   * new supervisor) keeps it.  An orphan's is free (attachments.c):
   * someone who took it since owns the attachment's files and server.
   */
  claim = claim_take (r->name, "detaching", 2000, &h);
  if (claim < 0 && r->orphan) {
    if (h.pid)
      errorf (CMD ": %s: its image is claimed by pid %d (%s) since it was "
              "found", r->device, (int) h.pid, h.doing);
    return EXIT_FAILED;
  }
  if (claim >= 0)
    claim_note (claim, "detaching", r->device);
  st = detach_claimed (o, r, idx);
  if (st == EXIT_OK)
    claim_drop (claim, r->name);
  else if (claim >= 0)
    close (claim);
  return st;
}

int
cmd_detach (int argc, char **argv)
{
  struct detach_opts o;
  struct record *recs;
  size_t n;
  int r, lock;

  r = parse (argc, argv, &o);
  if (r != EXIT_OK)
    return r;
  if (!need_root (CMD))
    return EXIT_NOT_ROOT;
  lock = state_lock (CMD);
  if (lock == -1)
    return EXIT_FAILED;
  recs = attachments_load (&n);
  if (o.all) {
    for (size_t i = 0; i < n; i++)
      if (detach_one (&o, &recs[i]) != EXIT_OK)
        r = EXIT_FAILED;
  }
  else {
    const struct record *rec = attachments_match (o.what, recs, n);

    if (rec)
      r = detach_one (&o, rec);
    else {
      if (nbd_index (o.what) >= 0)
        errorf (CMD ": %s: not attached by pdio (no record in %s, and not "
                "connected with a pdio identifier)", o.what, rundir ());
      else
        errorf (CMD ": %s: not attached", o.what);
      r = EXIT_FAILED;
    }
  }
  free (recs);
  close (lock);
  return r;
}
