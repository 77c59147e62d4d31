/* SPDX-License-Identifier: BSD-3-Clause */
/* pdio resize DEVICE|IMAGE [--size SIZE]: like losetup -c, the device takes
 * the image's size; with --size the image is first grown (or, refused
 * while the device is in use unless --force, shrunk) to SIZE.
 *
 * Three parties learn the size, in an order that never has the kernel
 * send a request the server would refuse:
 *   - the image: ftruncate, with --size;
 *   - the server: pdio's own re-reads the size for each new connection and
 *     checks every request against the size it serves now, so a handshake
 *     is both how it learns and how this learns that it did; nbdkit reads
 *     the size only when a connection opens and checks the kernel's old
 *     connections against their old size, so it is restarted (pdio
 *     restart's path: the kernel resends what was in flight at its
 *     timer's next expiry, 1-2 s with the defaults, or when a request
 *     timeout above 0 expires);
 *   - the kernel: NBD_CMD_RECONFIGURE with the size (and the image's
 *     identity, which it insists on), then a uevent, after which resize2fs
 *     or xfs_growfs can grow a mounted filesystem.
 * Growing: image, server, kernel.  Shrinking: kernel, image, server.
 * The record's size is updated before the server step: a supervisor that
 * reconnects meanwhile must accept the server's new size.
 */
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <linux/fs.h>

#include "pdio.h"

#define CMD "pdio resize"

static void
usage (FILE *fp)
{
  fprintf (fp,
"Usage: pdio resize [--size SIZE [--force]] DEVICE|IMAGE\n"
"Give the device the image's current size, like losetup -c: grow the image\n"
"first (truncate -s, or a resized block device), then run this; resize2fs\n"
"or xfs_growfs can then grow a mounted filesystem.\n"
"\n"
"  -s, --size SIZE   first make the image SIZE bytes (K, M, G, T: powers of\n"
"                    1024).  Shrinking loses the data past the new end\n"
"                    and corrupts a filesystem that extends there, so it is\n"
"                    refused while the device is mounted or open\n"
"  -f, --force       shrink even so\n"
"\n"
"With --nbdkit attachments the server is restarted to serve the new size\n"
"(requests in flight wait 1-2 s with the defaults, up to --timeout if it\n"
"was set above 0).\n");
}

/* The image's size now: a file's length or a block device's size. */
static bool
image_size (const char *image, uint64_t *size, bool *blockdev)
{
  struct stat st;
  int fd;

  if (stat (image, &st) == -1) {
    errorf (CMD ": %s: %m", image);
    return false;
  }
  *blockdev = S_ISBLK (st.st_mode);
  if (!*blockdev) {
    *size = st.st_size;
    return true;
  }
  fd = open (image, O_RDONLY | O_CLOEXEC);
  if (fd == -1 || ioctl (fd, BLKGETSIZE64, size) == -1) {
    errorf (CMD ": %s: cannot read its size: %m", image);
    if (fd >= 0)
      close (fd);
    return false;
  }
  close (fd);
  return true;
}

static bool
truncate_image (const char *image, uint64_t size)
{
  if (truncate (image, size) == -1) {
    errorf (CMD ": %s: cannot make it %" PRIu64 " bytes: %m", image, size);
    return false;
  }
  return true;
}

/* The record's size, changed under the state lock so that attach and
 * detach never see half of it; the rest of the record stays as its
 * writers (the supervisor, mount.pdio) left it.
 */
static bool
record_size (struct record *r, uint64_t size)
{
  struct record now;
  int lock = state_lock (CMD);
  bool ok = false;

  if (lock == -1)
    return false;
  if (record_load_device (r->device, &now) == -1 ||
      strcmp (now.backend, r->backend) != 0)
    errorf (CMD ": %s: its record went away (detached?)", r->device);
  else {
    *r = now;
    r->size = size;
    ok = record_write (r) == 0;
    if (!ok)
      errorf (CMD ": cannot write the record of %s in %s: %m", r->device,
              rundir ());
  }
  close (lock);
  return ok;
}

/* The server serves size: nbdkit is restarted for it; pdio's own server
 * reads the new size at this handshake.
 */
static bool
server_serves (struct record *r, uint64_t size)
{
  struct server_info info;
  char why[PATH_MAX + 256], log[PATH_MAX];

  if (r->nbdkit && !test_break ("resize-no-restart") &&
      !restart_server (CMD, r))
    return false;
  if (!server_query (r->socket, NULL, 10000, &info, why, sizeof why)) {
    errorf (CMD ": %s: its server does not answer: %s", r->device, why);
    return false;
  }
  if (info.size != size) {
    state_path (r->name, "log", log, sizeof log);
    errorf (CMD ": %s: its server serves %" PRIu64 " bytes of %s, not %"
            PRIu64 " (see %s)", r->device, info.size, r->image, size, log);
    return false;
  }
  return true;
}

static bool
tell_kernel (const struct record *r, uint64_t size)
{
  char why[PATH_MAX + 256];

  if (test_break ("resize-no-reconfigure"))
    return true;
  if (!device_resize (r, size, why, sizeof why)) {
    errorf (CMD ": %s: %s", r->device, why);
    return false;
  }
  return true;
}

int
cmd_resize (int argc, char **argv)
{
  static const struct option longopts[] = {
    { "size", required_argument, NULL, 's' },
    { "force", no_argument, NULL, 'f' },
    { "help", no_argument, NULL, 'h' },
    { NULL, 0, NULL, 0 },
  };
  char id[BACKEND_ID_MAX], why[PATH_MAX + 256], user[PATH_MAX + 64];
  uint64_t want = 0, now, target, dev_old, dev_new;
  bool have_size = false, force = false, blockdev, shrink;
  struct record r;
  int c, idx;

  while ((c = getopt_long (argc, argv, "+s:fh", longopts, NULL)) != -1)
    switch (c) {
    case 's':
      if (!parse_size (optarg, &want) || want == 0) {
        errorf (CMD ": --size %s: not a size in bytes (K, M, G, T allowed)",
                optarg);
        return EXIT_USAGE;
      }
      have_size = true;
      break;
    case 'f': force = true; break;
    case 'h': usage (stdout); return EXIT_OK;
    default: usage (stderr); return EXIT_USAGE;
    }
  if ((c = record_operand (CMD, argc, argv, usage, &r)) != EXIT_OK)
    return c;
  idx = nbd_index (r.device);
  /* Its number may be another attachment's now. */
  if (!device_is_ours (&r)) {
    errorf (CMD ": %s is not connected as %s's device (pdio list)",
            r.device, r.image);
    return EXIT_FAILED;
  }
  /* Sizing another file than the one served would be worse than useless. */
  if (r.backend[0]) {
    char alias[ALIAS_MAX + 1];

    backend_alias (r.backend, alias);
    if (!backend_id (r.image, alias, id, why, sizeof why)) {
      errorf (CMD ": %s", why);
      return EXIT_FAILED;
    }
    if (strcmp (id, r.backend) != 0) {
      errorf (CMD ": %s is not the image attached to %s any more (replaced "
              "or moved since attach): refusing", r.image, r.device);
      return EXIT_FAILED;
    }
  }
  if (!image_size (r.image, &now, &blockdev))
    return EXIT_FAILED;
  if (have_size && blockdev) {
    errorf (CMD ": %s is a block device, whose size is its own: resize it, "
            "then run pdio resize without --size", r.image);
    return EXIT_FAILED;
  }
  if (have_size && r.readonly && want != now) {
    errorf (CMD ": %s is attached read-only: pdio does not change its size",
            r.image);
    return EXIT_FAILED;
  }
  target = have_size ? want : now;
  dev_old = nbd_size (idx);
  dev_new = target - target % r.block_size;
  if (dev_new == 0) {
    errorf (CMD ": %" PRIu64 " bytes is less than one block of %s (%" PRIu32
            " bytes)", target, r.device, r.block_size);
    return EXIT_FAILED;
  }
  if (target % r.block_size)
    warnf (CMD ": warning: %s: size %" PRIu64 " is not a multiple of the "
           "block size %" PRIu32 ": its last %" PRIu64 " bytes are not on "
           "the device", r.image, target, r.block_size,
           target % r.block_size);
  shrink = dev_new < dev_old;
  if (shrink) {
    if (!force && !test_break ("resize-no-shrink-check") &&
        device_in_use (idx, user, sizeof user)) {
      errorf (CMD ": %s is in use (%s): shrinking it from %" PRIu64 " to %"
              PRIu64 " bytes would cut off data in use and corrupt a "
              "filesystem that extends past the new end; refusing "
              "(unmount or close it first, or --force)", r.device, user,
              dev_old, dev_new);
      return EXIT_FAILED;
    }
    warnf (CMD ": warning: shrinking %s from %" PRIu64 " to %" PRIu64
           " bytes: the data past the new end is lost", r.device, dev_old,
           dev_new);
    if (!tell_kernel (&r, target))
      return EXIT_FAILED;
  }
  if (have_size && want != now && !truncate_image (r.image, want))
    return EXIT_FAILED;
  if (!record_size (&r, target) || !server_serves (&r, target))
    return EXIT_FAILED;
  if (!shrink && !tell_kernel (&r, target))
    return EXIT_FAILED;
  printf ("%s: %" PRIu64 " -> %" PRIu64 " bytes\n", r.device, dev_old,
          nbd_size (idx));
  return EXIT_OK;
}
