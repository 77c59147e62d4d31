/* SPDX-License-Identifier: BSD-3-Clause */
/* pdio attach: an image becomes /dev/nbdN.
 *
 * The work is done in a child that stays behind as the device's
 * supervisor (supervise.c); the parent prints the device.  The child
 * claims the image (claim.c: one attachment per image, held for the
 * device's life), then a server -- pdio's own (pdio serve as a daemon),
 * or with --nbdkit nbdkit with pdio.so -- serves it on RUNDIR/NAME.sock
 * (NAME after the image's identity; its log in RUNDIR/NAME.log), pdio
 * asks it for the preferred block size it advertises (the image's
 * direct-I/O alignment), and connects a device over netlink (device.c)
 * with that block size, multi-conn connections, a timeout and a
 * dead-connection timeout.  The kernel picks the device, or makes one
 * past nbds_max, as /dev/loop-control does: there is no search for a free
 * one to race over.  Any failure undoes every step taken so far: no stray
 * server, no half-attached device, no record.
 */
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <sys/prctl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "pdio.h"

#define CMD "pdio attach"
/* How long the loser of a race to attach one image waits for the winner
 * to get its device (to name it): a server start's own limit, and some.
 */
#define CLAIM_WAIT_MS 60000
/* No --timeout: the one for the number of connections (pdio.h). */
#define TIMEOUT_UNSET ((unsigned long) -1)

struct attach_opts {
  bool readonly;
  unsigned long connections;    /* 0: the default */
  unsigned long block_size;     /* 0: the image's direct-I/O alignment */
  unsigned long timeout;        /* TIMEOUT_UNSET: the default */
  unsigned long dead_timeout;
  bool autoclear;
  const char *device;
  const char *plugin;
  const char *image;
  bool nbdkit;                  /* nbdkit + pdio.so instead of pdio serve */
  const char *slice;            /* the supervisor's and server's slice */
  bool swap;                    /* memory locked and never given back */
  bool shared;                  /* a remote export: others may attach it */
  const char *alias;            /* --name */
  const char *tls_certificates, *tls_psk, *tls_username;
  int tls_verify_peer;          /* -1 not given */
};

/* What has been done so far, for undo(). */
struct attach {
  char image[PATH_MAX];
  char nbdkit[PATH_MAX];
  char self[PATH_MAX];          /* this pdio, which runs pdio serve */
  char log[PATH_MAX], pidfile[PATH_MAX];
  int claim;                    /* the image's claim, or -1 */
  bool connected, recorded;
  struct record rec;
  struct nl_sock *ev;           /* the driver's events, for the supervisor */
  struct protection prot;       /* what the supervisor-to-be set up */
  char alias[ALIAS_MAX + 1];    /* /dev/disk/by-pdio/ALIAS, or "" */
};

static void
usage (FILE *fp)
{
  fprintf (fp,
"Usage: pdio attach [OPTIONS] IMAGE\n"
"       pdio attach [OPTIONS] nbd://HOST[:PORT]/EXPORT\n"
"       pdio attach [OPTIONS] nbd+unix:///EXPORT?socket=PATH\n"
"       pdio attach [OPTIONS] nbds://HOST[:PORT]/EXPORT (and nbds+unix)\n"
"Serve IMAGE with pdio's own NBD server (or nbdkit and pdio.so) and attach\n"
"it to a /dev/nbdN the kernel picks, or makes past nbds_max (or --device);\n"
"prints the device.  One attachment per image, whatever its path.  A\n"
"supervisor stays behind and restarts the server if it dies.  Both run\n"
"with PR_SET_IO_FLUSHER and oom_score_adj -1000, in a cgroup of their own.\n"
"A URI attaches a remote export: no server is started, the supervisor\n"
"reconnects when the link dies (bounded by --dead-timeout), and the block\n"
"size is the export's preferred one (else 512).\n"
"\n"
"  -r, --read-only        attach read-only (the image gets a shared lock)\n"
"  -C, --connections N    multi-conn connections, 1..%d (default %d, at most\n"
"                         the number of CPUs)\n"
"  -b, --block-size B     raise the block size above the image's\n"
"                         direct-I/O alignment (a power of two, %d..%d)\n"
"  -t, --timeout S        kernel request timeout in seconds, 0..86400:\n"
"                         with several connections a request that takes\n"
"                         longer is resent on another one, its own\n"
"                         dropped (default %d); with one, 0 (the default)\n"
"                         never drops it: requests in flight when a\n"
"                         server dies are resent 1-2 s after the new one\n"
"                         is up, and the supervisor replaces a server that\n"
"                         stops answering for %d s\n"
"      --dead-timeout S   how long the device waits for a new server before\n"
"                         failing requests (default %d)\n"
"      --autoclear        detach when the last user closes the device\n"
"      --shared           a URI: allow other attachments of the export from\n"
"                         this host (the server must advertise multi-conn)\n"
"  -n, --name NAME        the device's name, /dev/disk/by-pdio/NAME (NAME-partN\n"
"                         for its partitions): 1 to %d letters, digits,\n"
"                         \".\", \"_\" or \"-\" (default: the image's file name\n"
"                         without its extension)\n"
"      --tls-certificates DIR  nbds://: x509, DIR/ca-cert.pem the CA of the\n"
"                         server's certificate, DIR/client-cert.pem and\n"
"                         client-key.pem this client's if there (default:\n"
"                         the system's CAs)\n"
"      --tls-psk FILE     nbds://: a pre-shared key from FILE (psktool's\n"
"                         format) instead of certificates\n"
"      --tls-username NAME  the PSK's user (default: the user's name)\n"
"      --tls-verify-peer  check the server's certificate against the CA and\n"
"                         the URI's host name (the default)\n"
"      --no-tls-verify-peer  do not (anyone on the path can pretend to be\n"
"                         the server)\n"
"  -d, --device DEV       attach /dev/nbdN (made if the driver has fewer;\n"
"                         default: the kernel picks a free one, or makes\n"
"                         one)\n"
"      --slice NAME       the supervisor and server live in a cgroup of\n"
"                         their own in this slice, with memory.min %d MiB\n"
"                         (default %s; none: stay in the caller's cgroup)\n"
"      --swap             for swap on the device: the server's and the\n"
"                         supervisor's memory is locked and never given\n"
"                         back (without it, swap on a pdio device is not\n"
"                         supported)\n"
"      --nbdkit           serve with nbdkit and pdio.so instead\n"
"      --plugin PLUGIN    with --nbdkit: the plugin (default $PDIO_PLUGIN\n"
"                         or pdio)\n",
           MAX_CONNECTIONS, DEFAULT_CONNECTIONS, MIN_BLOCK_SIZE,
           MAX_BLOCK_SIZE, DEFAULT_MULTI_TIMEOUT, WATCHDOG_HUNG_MS / 1000,
           DEFAULT_DEAD_TIMEOUT, ALIAS_MAX, DEVICE_MEMORY_MIN >> 20,
           DEFAULT_SLICE);
}

static int
parse (int argc, char **argv, struct attach_opts *o)
{
  static const struct option longopts[] = {
    { "read-only", no_argument, NULL, 'r' },
    { "connections", required_argument, NULL, 'C' },
    { "block-size", required_argument, NULL, 'b' },
    { "timeout", required_argument, NULL, 't' },
    { "device", required_argument, NULL, 'd' },
    { "plugin", required_argument, NULL, 'P' },
    { "nbdkit", no_argument, NULL, 'N' },
    { "dead-timeout", required_argument, NULL, 'D' },
    { "autoclear", no_argument, NULL, 'A' },
    { "slice", required_argument, NULL, 'S' },
    { "swap", no_argument, NULL, 'W' },
    { "shared", no_argument, NULL, 'H' },
    { "name", required_argument, NULL, 'n' },
    { "tls-certificates", required_argument, NULL, 'X' },
    { "tls-psk", required_argument, NULL, 'K' },
    { "tls-username", required_argument, NULL, 'U' },
    { "tls-verify-peer", no_argument, NULL, 'V' },
    { "no-tls-verify-peer", no_argument, NULL, 'v' },
    { "help", no_argument, NULL, 'h' },
    { NULL, 0, NULL, 0 },
  };
  int c;

  *o = (struct attach_opts) { .timeout = TIMEOUT_UNSET,
                              .dead_timeout = DEFAULT_DEAD_TIMEOUT,
                              .slice = DEFAULT_SLICE,
                              .tls_verify_peer = -1 };
  while ((c = getopt_long (argc, argv, "+rC:b:t:d:n:h", longopts, NULL)) != -1)
    switch (c) {
    case 'r': o->readonly = true; break;
    case 'C':
      if (!parse_uint (optarg, 1, MAX_CONNECTIONS, &o->connections)) {
        errorf (CMD ": --connections %s: must be a number from 1 to %d",
                optarg, MAX_CONNECTIONS);
        return EXIT_USAGE;
      }
      break;
    case 'b':
      if (!parse_uint (optarg, MIN_BLOCK_SIZE, MAX_BLOCK_SIZE,
                       &o->block_size) || !is_power_of_two (o->block_size)) {
        errorf (CMD ": --block-size %s: must be a power of two from %d to %d "
                "(the kernel nbd driver's limits)", optarg, MIN_BLOCK_SIZE,
                MAX_BLOCK_SIZE);
        return EXIT_USAGE;
      }
      break;
    case 't':
      if (!parse_uint (optarg, 0, 86400, &o->timeout)) {
        errorf (CMD ": --timeout %s: must be a number of seconds from 0 to "
                "86400", optarg);
        return EXIT_USAGE;
      }
      break;
    case 'd':
      if (nbd_index (optarg) < 0) {
        errorf (CMD ": --device %s: not an nbd device (/dev/nbdN)", optarg);
        return EXIT_USAGE;
      }
      o->device = optarg;
      break;
    case 'P': o->plugin = optarg; break;
    case 'N': o->nbdkit = true; break;
    case 'D':
      if (!parse_uint (optarg, 1, 86400, &o->dead_timeout)) {
        errorf (CMD ": --dead-timeout %s: must be a number of seconds from "
                "1 to 86400", optarg);
        return EXIT_USAGE;
      }
      break;
    case 'A': o->autoclear = true; break;
    case 'S':
      if (!slice_name_valid (optarg)) {
        errorf (CMD ": --slice %s: must be NAME.slice (letters, digits and "
                "\"-_.:\", at most 64 characters) or none", optarg);
        return EXIT_USAGE;
      }
      o->slice = optarg;
      break;
    case 'W': o->swap = true; break;
    case 'H': o->shared = true; break;
    case 'n':
      if (!alias_valid (optarg) && !test_break ("any-name")) {
        errorf (CMD ": --name %s: must be 1 to %d letters, digits, \".\", "
                "\"_\" or \"-\", and not \".\" or \"..\"", optarg,
                ALIAS_MAX);
        return EXIT_USAGE;
      }
      o->alias = optarg;
      break;
    case 'X': o->tls_certificates = optarg; break;
    case 'K': o->tls_psk = optarg; break;
    case 'U': o->tls_username = optarg; break;
    case 'V': o->tls_verify_peer = 1; break;
    case 'v': o->tls_verify_peer = 0; break;
    case 'h': usage (stdout); exit (EXIT_OK);
    default: usage (stderr); return EXIT_USAGE;
    }
  o->image = one_operand (CMD, argc, argv, "IMAGE", usage);
  return o->image ? EXIT_OK : EXIT_USAGE;
}

/* The image exists and is a file or a block device; its real path and
 * its name (image_name).
 */
static bool
check_image (const char *image, char *real, char *name, size_t len)
{
  struct stat st;

  if (realpath (image, real) == NULL || stat (real, &st) == -1) {
    errorf (CMD ": %s: %m", image);
    return false;
  }
  if (S_ISDIR (st.st_mode)) {
    errorf (CMD ": %s: %s", image, strerror (EISDIR));
    return false;
  }
  if (!S_ISREG (st.st_mode) && !S_ISBLK (st.st_mode)) {
    errorf (CMD ": %s: not a regular file or block device", image);
    return false;
  }
  if (strchr (real, '\n')) {
    errorf (CMD ": %s: a newline in the path is not supported", image);
    return false;
  }
  if (!image_name (real, name, len)) {
    errorf (CMD ": %s: %m", image);
    return false;
  }
  return true;
}

static bool
check_tools (const struct attach_opts *o, struct attach *a)
{
  ssize_t n = readlink ("/proc/self/exe", a->self, sizeof a->self - 1);

  if (!o->nbdkit && n <= 0) {
    errorf (CMD ": cannot find pdio itself (/proc/self/exe): %m");
    return false;
  }
  a->self[n > 0 ? n : 0] = '\0';
  if (o->nbdkit &&
      !find_program ("PDIO_NBDKIT", "nbdkit", a->nbdkit, sizeof a->nbdkit)) {
    errorf (CMD ": nbdkit not found (%s): install it (apt-get install "
            "nbdkit)", a->nbdkit);
    return false;
  }
  return true;
}

static void
no_driver_message (void)
{
  errorf (CMD ": the kernel has no nbd driver: run 'modprobe nbd' (no "
          "%s/module/nbd, no %s/block/nbd0)", sysfs (), sysfs ());
}

/* --device: the device asked for is free (it need not exist: the kernel
 * makes it).  The kernel refuses one in use all the same; this names who
 * uses it.
 */
static bool
check_device (const struct attach_opts *o, const struct record *recs,
              size_t n)
{
  int idx = nbd_index (o->device);
  char why[PATH_MAX + 32];

  for (size_t i = 0; i < n; i++)
    if (nbd_index (recs[i].device) == idx && device_is_ours (&recs[i])) {
      errorf (CMD ": %s: is in use: %s is attached to it", o->device,
              recs[i].image);
      return false;
    }
  if (nbd_exists (idx) &&
      (nbd_connected (idx) || nbd_size (idx) != 0 ||
       nbd_busy (idx, why, sizeof why))) {
    errorf (CMD ": %s: is in use", o->device);
    return false;
  }
  return true;
}

static void
show_log (const char *log)
{
  char line[1024];
  FILE *fp = fopen (log, "re");

  if (fp == NULL)
    return;
  while (fgets (line, sizeof line, fp))
    fputs (line, stderr);
  fclose (fp);
}

/* Undoes whatever attach did, newest first.  Once the device has a
 * number, under the run directory's lock: the kernel may hand the number
 * to another attach as soon as it is disconnected.
 */
static void
undo (struct attach *a)
{
  struct record mine = a->rec;
  int lock = a->connected ? state_lock (CMD) : -1;
  char why[256];

  if (a->connected && a->rec.device[0] && device_is_ours (&a->rec) &&
      !device_disconnect (a->rec.device, why, sizeof why))
    errorf (CMD ": %s: %s", a->rec.device, why);
  if (a->rec.server_pid > 0)
    server_stop (a->rec.server_pid);
  /* The device's files are ours only once our record is written. */
  if (!a->recorded)
    mine.device[0] = '\0';
  state_remove (&mine);
  if (lock >= 0)
    close (lock);
  claim_drop (a->claim, a->rec.name);
  a->claim = -1;
}

static unsigned default_connections (void);
static unsigned request_timeout (const struct attach_opts *o,
                                 unsigned connections);

/* The server as a daemon (daemon.c), until it answers on its socket. */
static bool
start_server (const struct attach_opts *o, struct attach *a,
              struct server_info *info)
{
  const struct server_opts so =
    record_server_opts (&a->rec, a->self, a->nbdkit, a->pidfile);
  char why[PATH_MAX + 256] = "";

  a->rec.server_pid = server_start (&so, a->log, why, sizeof why);
  if (a->rec.server_pid <= 0) {
    a->rec.server_pid = 0;
    show_log (a->log);
    errorf (CMD ": %s", why);
    return false;
  }
  if (server_query (a->rec.socket, NULL, 30000, info, why, sizeof why))
    return true;
  show_log (a->log);
  errorf (CMD ": %s did not answer on %s within 30 s: %s",
          o->nbdkit ? "nbdkit" : "pdio serve",
          a->rec.socket, why);
  return false;
}

/* The device's block size: the advertised preferred size (the image's
 * direct-I/O alignment; pdio's minimum is 1), within the kernel's limits,
 * raised by --block-size.  0 if --block-size asks for less.
 */
static uint32_t
choose_block_size (const struct attach_opts *o, const struct attach *a,
                   const struct server_info *info)
{
  uint32_t min = info->dio_align ? info->dio_align : MIN_BLOCK_SIZE;
  uint32_t bs = min < MIN_BLOCK_SIZE ? MIN_BLOCK_SIZE : min;

  if (bs > MAX_BLOCK_SIZE) {
    /* align= above a page: correct at 4096, with read-modify-write. */
    warnf (CMD ": warning: %s needs %" PRIu32 "-byte blocks, more than the "
           "kernel's %d: attaching with %d", a->image, bs, MAX_BLOCK_SIZE,
           MAX_BLOCK_SIZE);
    bs = MAX_BLOCK_SIZE;
  }
  if (o->block_size) {
    if (o->block_size < bs) {
      errorf (CMD ": --block-size %lu: %s needs at least %" PRIu32 " (its "
              "direct-I/O alignment); --block-size can only raise it",
              o->block_size, a->image, bs);
      return 0;
    }
    bs = o->block_size;
  }
  if (info->size % bs)
    warnf (CMD ": warning: %s: size %" PRIu64 " is not a multiple of the "
           "block size %" PRIu32 ": its last %" PRIu64 " bytes are not on "
           "the device", a->image, info->size, bs, info->size % bs);
  return bs;
}

static unsigned
default_connections (void)
{
  long cpus = sysconf (_SC_NPROCESSORS_ONLN);
  long want = DEFAULT_CONNECTIONS;

  /* What pdio did before one connection and timeout 0 were the default. */
  if (test_break ("kernel-timeout-default"))
    want = 4;
  if (cpus < 1)
    cpus = 1;
  return cpus < want ? cpus : want;
}

/* The kernel's request timeout: --timeout, else the one that suits the
 * number of connections (pdio.h).
 */
static unsigned
request_timeout (const struct attach_opts *o, unsigned connections)
{
  if (test_break ("kernel-timeout-default"))
    return o->timeout != TIMEOUT_UNSET ? o->timeout : 15;
  /* The short requeue timer as a timeout that drops the connection. */
  if (test_break ("kernel-timeout-nonzero"))
    return 1;
  if (o->timeout != TIMEOUT_UNSET)
    return o->timeout;
  if (connections == 1)
    return DEFAULT_TIMEOUT;
  /* The multi-connection timeout pdio had; and one shorter than a slow
   * disk's requests.
   */
  if (test_break ("multi-timeout-long"))
    return 15;
  if (test_break ("multi-timeout-short"))
    return 2;
  return DEFAULT_MULTI_TIMEOUT;
}

/* The kernel gave us the number of an attachment that is gone (its
 * device was disconnected behind pdio's back): its record would be
 * overwritten by ours.  A live supervisor of it cleans up after itself
 * (it leaves a record that is no longer its own alone); otherwise this
 * stops its server and removes its files, as pdio detach would.
 */
static void
clear_stale (const struct record *old)
{
  struct claim_holder h;
  int claim;

  warnf (CMD ": warning: %s was %s's, whose device went away behind pdio's "
         "back: clearing its record", old->device, old->image);
  if (pid_is_supervisor (old->supervisor_pid))
    return;
  if (pid_alive (old->server_pid) && pid_is_server (old->server_pid))
    server_stop (old->server_pid);
  claim = claim_take (old->name, "detaching", 0, &h);
  state_remove (old);
  claim_drop (claim, old->name);
}

/* The device's name is no other device's: checked under the run
 * directory's lock, which every attach connects under, so two attaches
 * cannot both take one.  --name is refused; the image's own name is
 * dropped with a warning, so that images of one file name in different
 * directories still attach (the second with no name).
 */
static bool
alias_free (const struct attach_opts *o, struct attach *a)
{
  int idx = test_break ("name-unchecked") ? -1 : alias_holder (a->alias);

  if (idx < 0)
    return true;
  if (o->alias) {
    errorf (CMD ": --name %s: /dev/disk/by-pdio/%s is /dev/nbd%d's already: "
            "choose another name", o->alias, o->alias, idx);
    return false;
  }
  warnf (CMD ": warning: %s: /dev/disk/by-pdio/%s is /dev/nbd%d's already: "
         "this device gets no name (choose one with --name)", a->image,
         a->alias, idx);
  a->alias[0] = '\0';
  return true;
}

/* A connection dropped while attach still reads the partition table (a
 * request past the timeout of several connections): fresh ones from the
 * same server, as the supervisor would hand them.  A server that died,
 * or takes no new connection and is killed for it (as the supervisor
 * does), is the supervisor's to restart: its first act is to reap.
 */
static void
connection_dead (void *arg)
{
  struct attach *a = arg;
  char why[PATH_MAX + 256];

  if (!pid_alive (a->rec.server_pid))
    return;
  if (device_reconnect (&a->rec, why, sizeof why))
    warnf (CMD ": %s: a connection dropped while reading the partition "
           "table (a request past the %u s timeout): handed it a fresh one",
           a->rec.device, a->rec.timeout);
  else {
    warnf (CMD ": warning: %s: a connection dropped while reading the "
           "partition table, and the server (pid %d) takes no new one (%s): "
           "killing it to restart it", a->rec.device,
           (int) a->rec.server_pid, why);
    kill (a->rec.server_pid, SIGKILL);
  }
}

/* Connects the device over netlink and records it, under the run
 * directory's lock, so that the number the kernel hands us cannot be
 * the one a detach is still cleaning up after; partitions show;
 * autoclear is armed last (arming it first, the partition scan's close
 * would detach, and so would udev's probe of the new device: it is
 * waited for).
 */
static bool
connect_device (const struct attach_opts *o, struct attach *a)
{
  char why[PATH_MAX + 256];
  struct record old;
  int lock = state_lock (CMD);

  if (lock == -1)
    return false;
  if (a->alias[0] && !alias_free (o, a)) {
    close (lock);
    return false;
  }
  /* The server has the image open and locked: this is the file it
   * serves.
   */
  if (!backend_id (a->image, a->alias, a->rec.backend, why, sizeof why)) {
    errorf (CMD ": %s", why);
    close (lock);
    return false;
  }
  /* Listening from just before the connect: the kernel sends a LINK_DEAD
   * once, and one sent while attach is still at work is the supervisor's
   * to act on.  Not earlier: an event of the device that last had this
   * number would make it replace a healthy connection.  If this fails,
   * the supervisor tries again and says why.
   */
  if (!test_break ("events-late"))
    a->ev = nbdnl_events_open (why, sizeof why);
  a->connected = true;
  if (!device_connect (&a->rec, why, sizeof why)) {
    if (a->rec.device[0])
      errorf (CMD ": %s: %s", a->rec.device, why);
    else
      errorf (CMD ": cannot connect a device: %s", why);
    close (lock);
    return false;
  }
  /* Killed here, attach leaves an orphan (attachments.c). */
  if (test_break ("die-after-connect"))
    raise (SIGKILL);
  if (record_load_device (a->rec.device, &old) == 0)
    clear_stale (&old);
  if (record_write (&a->rec) == -1) {
    errorf (CMD ": cannot write the record of %s in %s: %m", a->rec.device,
            rundir ());
    close (lock);
    return false;
  }
  a->recorded = true;
  close (lock);
  claim_note (a->claim, "attached", a->rec.device);
  device_prepare (&a->rec, !test_break ("no-partscan"),
                  o->autoclear && !test_break ("no-udev-settle"),
                  test_break ("scan-inline") ? NULL : a->ev,
                  connection_dead, a);
  /* A failure after the device is up must be undone like any other. */
  if (test_break ("fail-after-connect")) {
    errorf (CMD ": injected failure after connecting %s", a->rec.device);
    return false;
  }
  if (o->autoclear && !device_autoclear (&a->rec, why, sizeof why)) {
    errorf (CMD ": %s: cannot arm autoclear: %s", a->rec.device, why);
    return false;
  }
  return true;
}

/* Claims the image: exactly one attachment of it at a time, whatever
 * the path.  Another attach of it still starting is waited for, to name
 * the device it got.
 */
static bool
claim_image (const struct attach_opts *o, struct attach *a)
{
  struct claim_holder h;

  a->claim = claim_take (a->rec.name, "attaching", CLAIM_WAIT_MS, &h);
  if (a->claim >= 0)
    return true;
  if (h.pid == 0)
    return false;
  if (strcmp (h.doing, "attached") == 0)
    errorf (CMD ": %s: already attached to %s by pid %d (pdio detach %s)",
            o->image, h.device, (int) h.pid, h.device);
  else
    errorf (CMD ": %s: pid %d is still %s it%s%s after %d s", o->image,
            (int) h.pid, h.doing, h.device[0] ? " on " : "", h.device,
            CLAIM_WAIT_MS / 1000);
  return false;
}

static int
attach_claimed (const struct attach_opts *o, struct attach *a)
{
  struct server_info info;
  struct record *recs;
  size_t n;

  /* A record outlives its supervisor (killed): the image may still be
   * attached without a claim held.  Nor has a device whose attach was
   * killed before it wrote its record (an orphan) a claim; its server
   * still holds the image.  Refused rather than adopted: what it was
   * attached with is not known, and a detach is a known way back.
   */
  recs = attachments_load (&n);
  for (size_t i = 0; i < n; i++) {
    if (strcmp (recs[i].name, a->rec.name) != 0 &&
        (recs[i].orphan || strcmp (recs[i].image, a->image) != 0))
      continue;
    if (recs[i].orphan)
      errorf (CMD ": %s: already connected to %s by an attach that was "
              "interrupted before it recorded it (pdio detach %s)", o->image,
              recs[i].device, recs[i].device);
    else
      errorf (CMD ": %s: already attached to %s (pdio detach %s)", o->image,
              recs[i].device, recs[i].device);
    free (recs);
    return EXIT_FAILED;
  }
  if (o->device && !check_device (o, recs, n)) {
    free (recs);
    return EXIT_FAILED;
  }
  free (recs);

  if (o->device)
    snprintf (a->rec.device, sizeof a->rec.device, "/dev/nbd%d",
              nbd_index (o->device));
  snprintf (a->rec.image, sizeof a->rec.image, "%s", a->image);
  state_path (a->rec.name, "sock", a->rec.socket, sizeof a->rec.socket);
  state_path (a->rec.name, "log", a->log, sizeof a->log);
  state_path (a->rec.name, "pid", a->pidfile, sizeof a->pidfile);
  a->rec.readonly = o->readonly;
  a->rec.nbdkit = o->nbdkit;
  a->rec.swap = o->swap;
  snprintf (a->rec.slice, sizeof a->rec.slice, "%s", o->slice);
  snprintf (a->rec.cgroup, sizeof a->rec.cgroup, "%s", a->prot.cgroup);
  snprintf (a->rec.plugin, sizeof a->rec.plugin, "%s", plugin_name (o->plugin));
  /* pdio's own server gets one worker thread per connection the kernel
   * will make: each worker has its own ring and pool, and more workers
   * than connections would only hold memory.
   */
  a->rec.threads = o->connections ? o->connections : default_connections ();

  /* A server of this image that was just stopped hard may hold its lock
   * a little longer; a live one will be named in the server's error.
   */
  image_lock_free (a->image, 500);
  if (!start_server (o, a, &info))
    goto fail;
  a->rec.readonly = info.readonly;
  a->rec.dio_align = info.dio_align;
  a->rec.size = info.size;
  a->rec.connections = o->connections ? o->connections : default_connections ();
  if (a->rec.connections > 1 && !info.multi_conn) {
    warnf (CMD ": warning: the server does not advertise multi-conn: using "
           "one connection");
    a->rec.connections = 1;
  }
  a->rec.timeout = request_timeout (o, a->rec.connections);
  a->rec.dead_timeout = o->dead_timeout;
  a->rec.autoclear = o->autoclear;
  a->rec.supervisor_pid = getpid ();
  a->rec.block_size = choose_block_size (o, a, &info);
  if (a->rec.block_size == 0)
    goto fail;
  if (!connect_device (o, a))
    goto fail;
  printf ("%s\n", a->rec.device);
  return EXIT_OK;

 fail:
  undo (a);
  return EXIT_FAILED;
}

/* The child attaches and stays as the supervisor: a subreaper in a session
 * of its own, so that the daemonized server becomes its child and it
 * learns how the server dies.  It tells the parent the device is up by
 * writing one byte on the pipe, after letting go of stdout (a caller
 * reading "$(pdio attach ...)" waits for every writer).
 */
static int
attach_forked (const struct attach_opts *o, struct attach *a)
{
  int p[2], status, r;
  char c;
  pid_t pid;

  if (pipe2 (p, O_CLOEXEC) == -1) {
    errorf (CMD ": pipe: %m");
    return EXIT_FAILED;
  }
  fflush (NULL);
  pid = fork ();
  if (pid == -1) {
    errorf (CMD ": fork: %m");
    return EXIT_FAILED;
  }
  if (pid == 0) {
    close (p[0]);
    setsid ();
    prctl (PR_SET_CHILD_SUBREAPER, 1);
    if (!claim_image (o, a))
      _exit (EXIT_FAILED);
    /* Before the server starts: it inherits all of it. */
    protect_supervisor (o->slice, o->swap, a->image, &a->prot);
    r = attach_claimed (o, a);
    fflush (NULL);
    if (r != EXIT_OK) {
      claim_drop (a->claim, a->rec.name);     /* if undo() has not */
      placement_leave (a->prot.cgroup);
      _exit (r);
    }
    {
      const struct server_opts so =
        record_server_opts (&a->rec, a->self, a->nbdkit, a->pidfile);

#ifdef PDIO_TEST_BREAKS
      test_break_link ();
#endif
      supervise (&a->rec, &so, p[1], a->claim, false, a->ev, &a->prot);
    }
  }
  close (p[1]);
  if (read (p[0], &c, 1) == 1)
    return EXIT_OK;
  while (waitpid (pid, &status, 0) == -1)
    if (errno != EINTR)
      return EXIT_FAILED;
  return WIFEXITED (status) ? WEXITSTATUS (status) : EXIT_FAILED;
}

/* A URI: what of the options applies to a remote export. */
static int
attach_uri (const struct attach_opts *o)
{
  const struct remote_opts ro = {
    .uri = o->image, .readonly = o->readonly, .block_size = o->block_size,
    .timeout = test_break ("kernel-timeout-nonzero") ? 1
               : o->timeout == TIMEOUT_UNSET ? DEFAULT_TIMEOUT : o->timeout,
    .dead_timeout = o->dead_timeout, .autoclear = o->autoclear,
    .device = o->device, .shared = o->shared, .slice = o->slice,
    .swap = o->swap, .tls_certificates = o->tls_certificates,
    .tls_psk = o->tls_psk, .tls_username = o->tls_username,
    .tls_verify_peer = o->tls_verify_peer, .alias = o->alias,
  };

  if (o->nbdkit || o->plugin) {
    errorf (CMD ": %s: --nbdkit and --plugin start a server of a local "
            "image; a URI names a server already running", o->image);
    return EXIT_USAGE;
  }
  if (o->connections > 1) {
    errorf (CMD ": %s: one connection per remote device (-C %lu)", o->image,
            o->connections);
    return EXIT_USAGE;
  }
  {
    struct nbd_uri u;
    char why[512];

    /* A URI that cannot be used is a usage error, wherever it is given. */
    if (!nbd_uri_parse (o->image, &u, why, sizeof why)) {
      errorf (CMD ": %s: %s", o->image, why);
      return EXIT_USAGE;
    }
    if (!u.tls && (o->tls_certificates || o->tls_psk || o->tls_username ||
                   o->tls_verify_peer >= 0)) {
      errorf (CMD ": %s: the --tls options are for nbds:// and nbds+unix:// "
              "URIs", o->image);
      return EXIT_USAGE;
    }
  }
  if (!need_root (CMD))
    return EXIT_NOT_ROOT;
  if (!nbd_driver_present ()) {
    no_driver_message ();
    return EXIT_NO_DRIVER;
  }
  return remote_attach (&ro);
}

int
cmd_attach (int argc, char **argv)
{
  struct attach_opts o;
  struct attach a = { .claim = -1 };
  sigset_t stop;
  int r;

  r = parse (argc, argv, &o);
  if (r != EXIT_OK)
    return r;
  if ((o.tls_certificates || o.tls_psk || o.tls_username ||
       o.tls_verify_peer >= 0) && !nbd_uri_is (o.image)) {
    errorf (CMD ": the --tls options are for nbds:// URIs; a local image "
            "is served on a unix socket without TLS");
    return EXIT_USAGE;
  }
  if (o.shared && !nbd_uri_is (o.image)) {
    errorf (CMD ": --shared is for a remote export (a URI); an image is "
            "attached once");
    return EXIT_USAGE;
  }
  if (nbd_uri_is (o.image)) {
    /* As below: the supervisor takes them from a signalfd. */
    sigemptyset (&stop);
    sigaddset (&stop, SIGINT);
    sigaddset (&stop, SIGTERM);
    sigaddset (&stop, SIGHUP);
    sigprocmask (SIG_BLOCK, &stop, NULL);
    return attach_uri (&o);
  }
  if (!need_root (CMD))
    return EXIT_NOT_ROOT;
  if (!check_image (o.image, a.image, a.rec.name, sizeof a.rec.name) ||
      !check_tools (&o, &a))
    return EXIT_FAILED;
  /* The name the user gave the image, not where its links lead. */
  if (o.alias)
    snprintf (a.alias, sizeof a.alias, "%s", o.alias);
  else
    alias_of_image (o.image, a.alias);
  if (!nbd_driver_present ()) {
    no_driver_message ();
    return EXIT_NO_DRIVER;
  }
  /* Ctrl-C in the middle must not leave a server or a device behind:
   * pdio holds the signals (a child that gets one fails, and attach
   * undoes its work) and exits when done.
   */
  sigemptyset (&stop);
  sigaddset (&stop, SIGINT);
  sigaddset (&stop, SIGTERM);
  sigaddset (&stop, SIGHUP);
  sigprocmask (SIG_BLOCK, &stop, NULL);

  return attach_forked (&o, &a);
}
