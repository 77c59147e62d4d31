/* SPDX-License-Identifier: BSD-3-Clause */
/* The attachments pdio knows of, and the one a command's argument names:
 * every record, and every orphan -- a device pdio connected but has no
 * record of.  attach connects the device, then writes its record; killed
 * in between (SIGKILL, the OOM killer), it leaves a connected device and
 * a live server that list, detach and attach would not know of.  What is
 * left names them: the device's backend identifier
 * (/sys/block/nbdN/backend) is the image's identity, hence the
 * attachment's name, hence its pid file and socket.  A device is an
 * orphan only while nobody holds the image's claim: from before the
 * connect until the record is written, attach holds it, so an attach
 * still under way is never taken for one.
 */
#include <config.h>

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "pdio.h"

/* A record is of the device: the device it names is connected with its
 * backend (or, in a record of an older pdio with none, is that device).
 */
static bool
recorded (int idx, const char *backend, const struct record *recs,
          size_t nrecs)
{
  for (size_t i = 0; i < nrecs; i++)
    if (nbd_index (recs[i].device) == idx &&
        (recs[i].backend[0] == '\0' || strcmp (recs[i].backend, backend) == 0))
      return true;
  return false;
}

/* The orphan on nbdIDX, from its identifier, into r; false if it is not
 * one.
 */
static bool
orphan_at (int idx, const struct record *recs, size_t nrecs,
           struct record *r)
{
  char backend[BACKEND_ID_MAX], name[sizeof r->name], pidfile[PATH_MAX];
  struct claim_holder h;
  const char *image;
  pid_t pid;

  if (!nbd_backend (idx, backend, sizeof backend) ||
      !backend_parse (backend, name, sizeof name, &image) ||
      recorded (idx, backend, recs, nrecs) || claim_held (name, &h))
    return false;
  memset (r, 0, sizeof *r);
  r->orphan = true;
  snprintf (r->device, sizeof r->device, "/dev/nbd%d", idx);
  snprintf (r->name, sizeof r->name, "%s", name);
  snprintf (r->backend, sizeof r->backend, "%s", backend);
  snprintf (r->image, sizeof r->image, "%s", image);
  state_path (name, "sock", r->socket, sizeof r->socket);
  state_path (name, "pid", pidfile, sizeof pidfile);
  /* Only a server: the pid may have been reused since. */
  pid = read_pidfile (pidfile);
  if (pid > 0 && pid_alive (pid) && pid_is_server (pid)) {
    char comm[64];

    r->server_pid = pid;
    r->nbdkit = proc_comm (pid, comm, sizeof comm) &&
      strcmp (comm, "nbdkit") == 0;
  }
  r->size = nbd_size (idx);
  r->on_demand = idx >= nbd_nbds_max ();
  return true;
}

struct record *
attachments_load (size_t *n)
{
  char path[PATH_MAX];
  struct record *v = records_load (n), *r;
  size_t nrecs = *n, cap = nrecs;
  struct dirent *d;
  DIR *dir;

  /* Without the records (the run directory is 0700: another user's
   * list), every device of pdio's would look like one.  An orphan's
   * attach made the directory before it connected the device.
   */
  if (access (rundir (), R_OK | X_OK) == -1)
    return v;
  snprintf (path, sizeof path, "%s/block", sysfs ());
  dir = opendir (path);
  if (dir == NULL)
    return v;
  while ((d = readdir (dir)) != NULL) {
    int idx = nbd_index (d->d_name);

    if (idx < 0)
      continue;
    if ((r = records_slot (&v, &cap, *n)) == NULL)
      break;
    /* v[0 .. nrecs-1] stay the records: r is past them. */
    if (orphan_at (idx, v, nrecs, r))
      (*n)++;
  }
  closedir (dir);
  records_sort (v, *n);
  return v;
}

const struct record *
attachments_match (const char *what, const struct record *recs, size_t n)
{
  char real[PATH_MAX] = "", name[64] = "";
  int idx = nbd_index (what);

  /* A remote export by any spelling of its URI (the first of several
   * --shared ones: name their devices to choose).
   */
  if (idx < 0 && nbd_uri_is (what)) {
    struct nbd_uri u;
    char why[256];

    if (nbd_uri_parse (what, &u, why, sizeof why) &&
        nbd_uri_canonical (&u, real, sizeof real))
      for (size_t i = 0; i < n; i++)
        if (recs[i].remote && strcmp (recs[i].image, real) == 0)
          return &recs[i];
    return NULL;
  }
  /* An image by any of its paths (its identity), or by the path
   * attached if it is gone.
   */
  if (idx < 0) {
    if (!image_name (what, name, sizeof name))
      name[0] = '\0';
    if (!realpath (what, real))
      real[0] = '\0';
  }
  for (size_t i = 0; i < n; i++)
    if (idx >= 0 ? nbd_index (recs[i].device) == idx
                 : (name[0] && strcmp (recs[i].name, name) == 0) ||
                   (real[0] && strcmp (recs[i].image, real) == 0) ||
                   strcmp (recs[i].image, what) == 0)
      return &recs[i];
  return NULL;
}

bool
record_find (const char *cmd, const char *what, struct record *out)
{
  const struct record *r;
  struct record *recs;
  size_t n;
  bool ok = false;

  recs = attachments_load (&n);
  r = attachments_match (what, recs, n);
  if (r == NULL)
    errorf ("%s: %s: not attached by pdio (no record in %s)", cmd, what,
            rundir ());
  else if (r->orphan)
    errorf ("%s: %s: connected by an attach that was interrupted before it "
            "recorded it; pdio detach %s, then attach again", cmd, r->device,
            r->device);
  else if (r->remote)
    /* restart and resize act on pdio's own server of an image. */
    errorf ("%s: %s: a remote export (%s), whose server is not pdio's to "
            "restart or resize", cmd, r->device, r->image);
  else {
    *out = *r;
    ok = true;
  }
  free (recs);
  return ok;
}

int
record_operand (const char *cmd, int argc, char **argv,
                void (*usage) (FILE *), struct record *out)
{
  const char *what = one_operand (cmd, argc, argv, "DEVICE or IMAGE", usage);

  if (what == NULL)
    return EXIT_USAGE;
  if (!need_root (cmd))
    return EXIT_NOT_ROOT;
  return record_find (cmd, what, out) ? EXIT_OK : EXIT_FAILED;
}
