/* SPDX-License-Identifier: BSD-3-Clause */
/* mount.pdio: "mount -t pdio IMAGE DIR" and fstab's "IMAGE DIR pdio ...".
 * mount(8) runs /sbin/mount.pdio IMAGE DIR [-sfnv] [-N NS] [-o OPTIONS]
 * [-t pdio[.FSTYPE]]; this attaches IMAGE with autoclear and mounts the
 * device, like "mount -o loop": when the filesystem is unmounted the
 * device's last user closes it, the kernel disconnects it, and its
 * supervisor stops the server and removes the state.
 *
 * The device is held open from before autoclear is armed until after the
 * mount: a probe (udev's blkid) that opens and closes it in between must
 * not be its last user.  Options: "ro" attaches read-only; "fstype=TYPE"
 * (or -t pdio.TYPE) names the filesystem, else mount(8) detects it; the
 * TLS ones of a remote export (tls-certificates=DIR, tls-psk=FILE,
 * tls-username=NAME, [no-]tls-verify-peer) are pdio attach's --tls-*
 * options, kept from the filesystem, which would refuse them; the
 * rest go to mount(8), which is run with -i so that it does not call us
 * again, and with "helper=pdio", which libmount keeps in its utab, so that
 * umount(8) runs umount.pdio (umount_pdio.c): it returns once the server
 * has let go of the image.
 */
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "pdio.h"

#define CMD "mount.pdio"
/* mount(8)'s exit statuses: usage, system error, mount failure. */
#define MOUNT_EX_USAGE 1
#define MOUNT_EX_SYSERR 2
#define MOUNT_EX_FAIL 32

/* The mount options that are pdio attach's options of the same name,
 * "--NAME=VALUE" (or "--NAME" for a flag).
 */
static const struct {
  const char *name;
  bool value;
} attach_options[] = {
  { "tls-certificates", true }, { "tls-psk", true },
  { "tls-username", true }, { "tls-verify-peer", false },
  { "no-tls-verify-peer", false },
};
#define N_ATTACH_OPTIONS (sizeof attach_options / sizeof attach_options[0])

struct mount_opts {
  const char *image, *dir;
  const char *fstype;
  bool readonly, fake, verbose;
  char options[4096];           /* what mount(8) gets with -o */
  char attach[N_ATTACH_OPTIONS][PATH_MAX + 32];  /* "" or --NAME[=VALUE] */
};

/* opt (n bytes) is one of attach_options: noted for pdio attach.  A value
 * may not be empty; a flag takes none.
 */
static bool
attach_option (struct mount_opts *o, const char *opt, size_t n)
{
  for (size_t i = 0; i < N_ATTACH_OPTIONS; i++) {
    size_t k = strlen (attach_options[i].name);

    if (n < k || strncmp (opt, attach_options[i].name, k) != 0)
      continue;
    if (attach_options[i].value ? n > k + 1 && opt[k] == '=' : n == k) {
      snprintf (o->attach[i], sizeof o->attach[i], "--%.*s", (int) n, opt);
      return true;
    }
  }
  return false;
}

static void
add_option (struct mount_opts *o, const char *opt, size_t n)
{
  size_t len = strlen (o->options);

  snprintf (o->options + len, sizeof o->options - len, "%s%.*s",
            len ? "," : "", (int) n, opt);
}

static void
parse_options (struct mount_opts *o, const char *s)
{
  static char fstype[64];

  while (*s) {
    size_t n = strcspn (s, ",");

    if (n == 2 && strncmp (s, "ro", 2) == 0) {
      o->readonly = true;
      add_option (o, s, n);
    }
    else if (n > 7 && strncmp (s, "fstype=", 7) == 0) {
      snprintf (fstype, sizeof fstype, "%.*s", (int) n - 7, s + 7);
      o->fstype = fstype;
    }
    else if (n == 8 && strncmp (s, "defaults", 8) == 0)
      ;                         /* mount(8)'s business, and the default */
    else if (n >= 7 && strncmp (s, "helper=", 7) == 0)
      ;                         /* ours: umount.pdio */
    else if (attach_option (o, s, n))
      ;
    else if (n)
      add_option (o, s, n);
    s += n;
    if (*s == ',')
      s++;
  }
}

static int
parse (int argc, char **argv, struct mount_opts *o)
{
  int c;

  *o = (struct mount_opts) { .image = NULL };
  /* mount(8) puts the options after the two operands. */
  while ((c = getopt (argc, argv, "sfnvN:o:t:h")) != -1)
    switch (c) {
    case 's': case 'n': break;
    case 'f': o->fake = true; break;
    case 'v': o->verbose = true; break;
    case 'N':
      errorf (CMD ": -N (mount namespaces) is not supported");
      return MOUNT_EX_USAGE;
    case 'o': parse_options (o, optarg); break;
    case 't':
      if (strncmp (optarg, "pdio.", 5) == 0 && optarg[5])
        o->fstype = optarg + 5;
      else if (strcmp (optarg, "pdio") != 0) {
        errorf (CMD ": -t %s: this helper mounts type pdio or pdio.FSTYPE",
                optarg);
        return MOUNT_EX_USAGE;
      }
      break;
    case 'h':
    default:
      fprintf (stderr, "Usage: mount -t pdio [-o ro,fstype=TYPE,...] IMAGE "
               "DIR\n       mount -t pdio [-o _netdev,tls-certificates=DIR,"
               "...] URI DIR\n  (mount.pdio IMAGE DIR [-sfnv] [-o OPTIONS] "
               "[-t pdio[.FSTYPE]])\n");
      return MOUNT_EX_USAGE;
    }
  if (argc - optind != 2) {
    errorf (CMD ": give IMAGE and DIR");
    return MOUNT_EX_USAGE;
  }
  o->image = argv[optind];
  o->dir = argv[optind + 1];
  return EXIT_OK;
}

/* pdio attach --autoclear? no: armed here, once the device is held. */
static bool
attach (const struct mount_opts *o, char *device, size_t len)
{
  char self[PATH_MAX];
  const char *argv[8 + N_ATTACH_OPTIONS];
  int p[2], status, i = 0;
  ssize_t n;
  size_t got = 0;
  pid_t pid;

  n = readlink ("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) {
    errorf (CMD ": /proc/self/exe: %m");
    return false;
  }
  self[n] = '\0';
  argv[i++] = self;
  argv[i++] = "attach";
  if (o->readonly)
    argv[i++] = "--read-only";
  for (size_t k = 0; k < N_ATTACH_OPTIONS; k++)
    if (o->attach[k][0])
      argv[i++] = o->attach[k];
  argv[i++] = o->image;
  argv[i] = NULL;
  if (pipe2 (p, O_CLOEXEC) == -1) {
    errorf (CMD ": pipe: %m");
    return false;
  }
  fflush (NULL);
  pid = fork ();
  if (pid == 0) {
    dup2 (p[1], STDOUT_FILENO);
    execv (self, (char **) argv);
    _exit (127);
  }
  close (p[1]);
  while (pid > 0 && got < len - 1 &&
         (n = read (p[0], device + got, len - 1 - got)) > 0)
    got += n;
  close (p[0]);
  device[got] = '\0';
  device[strcspn (device, "\n")] = '\0';
  if (pid == -1 || waitpid (pid, &status, 0) == -1 ||
      !WIFEXITED (status) || WEXITSTATUS (status) != 0 ||
      nbd_index (device) < 0) {
    errorf (CMD ": could not attach %s (pdio attach's messages are above)",
            o->image);
    return false;
  }
  return true;
}

/* Autoclear armed, and noted in the record for umount.pdio. */
static bool
arm_autoclear (const char *device, char *why, size_t len)
{
  struct record r;

  if (record_load_device (device, &r) == -1) {
    snprintf (why, len, "no record of it in %s", rundir ());
    return false;
  }
  if (!device_autoclear (&r, why, len))
    return false;
  r.autoclear = true;
  record_write (&r);
  return true;
}

static int
run_mount (const struct mount_opts *o, const char *device)
{
  char mount[PATH_MAX];
  const char *argv[12];
  int i = 0;

  if (!find_program (NULL, "mount", mount, sizeof mount)) {
    errorf (CMD ": mount(8) not found");
    return MOUNT_EX_SYSERR;
  }
  argv[i++] = mount;
  argv[i++] = "-i";             /* no helper: that is us */
  if (o->verbose)
    argv[i++] = "-v";
  if (o->fstype) {
    argv[i++] = "-t";
    argv[i++] = o->fstype;
  }
  if (o->options[0]) {
    argv[i++] = "-o";
    argv[i++] = o->options;
  }
  argv[i++] = device;
  argv[i++] = o->dir;
  argv[i] = NULL;
  return run_wait ((char **) argv, -1) == 0 ? EXIT_OK : MOUNT_EX_FAIL;
}

int
cmd_mount (int argc, char **argv)
{
  struct mount_opts o;
  char device[64], why[256];
  int r, fd;

  r = parse (argc, argv, &o);
  if (r != EXIT_OK)
    return r;
  if (o.fake)
    return EXIT_OK;
  if (!need_root (CMD))
    return MOUNT_EX_USAGE;
  /* At boot (fstab) nobody may have loaded the driver yet; options for
   * it (max_part) come from modprobe.d.
   */
  if (!nbd_driver_present ()) {
    char modprobe[PATH_MAX];
    char *mp[] = { modprobe, (char *) "nbd", NULL };

    if (find_program (NULL, "modprobe", modprobe, sizeof modprobe))
      run_wait (mp, -1);
  }
  if (!test_break ("no-umount-helper"))
    add_option (&o, "helper=pdio", 11);
  if (!attach (&o, device, sizeof device))
    return MOUNT_EX_FAIL;
  fd = open (device, O_RDONLY | O_CLOEXEC);
  if (fd == -1) {
    errorf (CMD ": %s: %m", device);
    return MOUNT_EX_FAIL;
  }
  if (!test_break ("no-autoclear")) {
    if (!arm_autoclear (device, why, sizeof why)) {
      errorf (CMD ": %s: cannot arm autoclear: %s (pdio detach %s)", device,
              why, device);
      close (fd);
      return MOUNT_EX_FAIL;
    }
  }
  r = run_mount (&o, device);
  /* Mounted, the filesystem holds the device; if not, this close is its
   * last and the device goes away.
   */
  close (fd);
  if (r != EXIT_OK)
    errorf (CMD ": mounting %s (%s) on %s failed; the device detaches "
            "itself", device, o.image, o.dir);
  return r;
}
