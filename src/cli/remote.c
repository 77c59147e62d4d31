/* SPDX-License-Identifier: BSD-3-Clause */
/* pdio attach nbd://HOST[:PORT]/EXPORT, nbd+unix:///EXPORT?socket=PATH:
 * a device of an export another machine (or another server) serves.
 *
 * There is no server of ours and no image to lock: attach negotiates with
 * the remote server itself (negotiate.c, the one protocol module), takes
 * the device's block size from the preferred size the export advertises
 * (NBD_INFO_BLOCK_SIZE; 512 if none), its read-only state from the
 * export's flags or --read-only, and hands the socket to the kernel over
 * netlink like a local attach.  The export is claimed under its canonical
 * URI (claim.c), so that two attaches of it from one host are refused --
 * two writers through two page caches would corrupt a file system --
 * unless both say --shared, which needs the server's multi-conn promise.
 * The child that attaches stays as the device's supervisor (link.c),
 * which reconnects when the link dies.  An nbds:// URI negotiates in TLS
 * (negotiate.c, tls_client.c), and the kernel's socket is encrypted by
 * the kernel (kTLS) or by a relay in the supervisor (link_hand_over).
 */
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "pdio.h"
#include "proto.h"

#define CMD "pdio attach"
/* The first connect of an attach: a host that does not answer SYNs for
 * this long is refused rather than waited for.
 */
#define ATTACH_CONNECT_MS 10000
#define CLAIM_WAIT_MS 60000

/* FNV-1a: a short, stable name for a canonical URI in the run directory
 * (the claim's file name), which has no room for the URI itself.
 */
static uint64_t
fnv1a (const char *s)
{
  uint64_t h = 0xcbf29ce484222325ULL;

  for (; *s; s++)
    h = (h ^ (unsigned char) *s) * 0x100000001b3ULL;
  return h;
}

/* The device's block size: the export's preferred one within the
 * kernel's limits, raised by --block-size; 0 (said why) if --block-size
 * asks for less than the export's minimum.
 */
static uint32_t
remote_block_size (const struct remote_opts *o, const struct nbd_offer *e)
{
  uint32_t bs = e->block_preferred ? e->block_preferred : MIN_BLOCK_SIZE;

  if (bs < MIN_BLOCK_SIZE || !is_power_of_two (bs))
    bs = MIN_BLOCK_SIZE;
  if (bs > MAX_BLOCK_SIZE) {
    warnf (CMD ": warning: %s prefers %" PRIu32 "-byte blocks, more than "
           "the kernel's %d: attaching with %d", o->uri, bs, MAX_BLOCK_SIZE,
           MAX_BLOCK_SIZE);
    bs = MAX_BLOCK_SIZE;
  }
  if (e->block_min > MAX_BLOCK_SIZE) {
    errorf (CMD ": %s: its minimum block size %" PRIu32 " is more than the "
            "kernel's %d", o->uri, e->block_min, MAX_BLOCK_SIZE);
    return 0;
  }
  if (e->block_min > bs)
    bs = e->block_min < MIN_BLOCK_SIZE ? MIN_BLOCK_SIZE : e->block_min;
  if (o->block_size) {
    if (o->block_size < e->block_min) {
      errorf (CMD ": --block-size %lu: %s needs at least %" PRIu32,
              o->block_size, o->uri, e->block_min);
      return 0;
    }
    bs = o->block_size;
  }
  if (e->size % bs)
    warnf (CMD ": warning: %s: size %" PRIu64 " is not a multiple of the "
           "block size %" PRIu32 ": its last %" PRIu64 " bytes are not on "
           "the device", o->uri, e->size, bs, e->size % bs);
  return bs;
}

/* Another attachment of the export: refused, unless both are --shared. */
static bool
check_others (const struct remote_opts *o, const char *canon)
{
  struct record *recs;
  size_t n;
  bool ok = true;

  recs = attachments_load (&n);
  for (size_t i = 0; i < n && ok; i++)
    if (recs[i].remote && strcmp (recs[i].image, canon) == 0 &&
        !(o->shared && recs[i].shared)) {
      errorf (CMD ": %s: already attached to %s%s (pdio detach %s)", o->uri,
              recs[i].device, o->shared ? " without --shared" : "",
              recs[i].device);
      ok = false;
    }
  free (recs);
  return ok;
}

/* The first connection was lost to kTLS (link_hand_over's -2): a new
 * one to the same export, handed over through the relay.  *fd and *tls
 * are replaced (-1 and NULL if the new connection failed); the socket to
 * give the kernel, or -1 with why set.
 */
static int
connect_again (const struct remote_opts *o, const struct nbd_uri *u,
               const struct nbd_offer *first, int *fd,
               struct tls_client **tls, struct relay **relay, char *mode,
               size_t mlen, char *note, size_t nlen, char *why, size_t len)
{
  struct nbd_offer again;
  int kfd;

  warnf (CMD ": %s: %s: connecting again", o->uri, why);
  tls_client_free (*tls);
  close (*fd);
  *fd = nbd_handshake_uri (u, ATTACH_CONNECT_MS, &again, tls, why, len);
  if (*fd == -1) {
    *tls = NULL;
    return -1;
  }
  if (!link_same_export (first, &again, first->size, why, len))
    return -1;
  kfd = link_hand_over (*fd, *tls, relay, mode, mlen, note, nlen, why,
                        len);
  return kfd < 0 ? -1 : kfd;
}

/* In attach's child: everything up to a connected, recorded device and
 * its supervisor.
 */
static int
remote_attached (const struct remote_opts *o, const struct nbd_uri *u,
                 const char *canon, int notify_fd)
{
  struct record rec = { .connections = 1 };
  struct protection prot;
  struct nbd_offer e;
  struct nl_sock *ev = NULL;
  struct tls_client *tls = NULL;
  struct relay *relay = NULL;
  char note[256];
  struct claim_holder h;
  char why[PATH_MAX + 256];
  uint64_t hash = fnv1a (canon);
  int fd, link_fd, claim = -1, lock;

  if (o->shared)
    snprintf (rec.name, sizeof rec.name, "nbd-%016" PRIx64 "-%d", hash,
              (int) getpid ());
  else
    snprintf (rec.name, sizeof rec.name, "nbd-%016" PRIx64, hash);
  claim = claim_take (rec.name, "attaching", CLAIM_WAIT_MS, &h);
  if (claim < 0) {
    if (h.pid && strcmp (h.doing, "attached") == 0)
      errorf (CMD ": %s: already attached to %s by pid %d (pdio detach %s)",
              o->uri, h.device, (int) h.pid, h.device);
    else if (h.pid)
      errorf (CMD ": %s: pid %d is still %s it", o->uri, (int) h.pid,
              h.doing);
    return EXIT_FAILED;
  }
  if (!test_break ("no-shared-check") && !check_others (o, canon))
    goto fail_claim;
  protect_supervisor (o->slice, o->swap, canon, &prot);

  fd = nbd_handshake_uri (u, ATTACH_CONNECT_MS, &e, &tls, why, sizeof why);
  if (fd == -1) {
    errorf (CMD ": %s", why);
    goto fail_claim;
  }
  if (o->shared && !(e.eflags & NBD_FLAG_CAN_MULTI_CONN) &&
      !test_break ("no-shared-check")) {
    errorf (CMD ": --shared: %s does not advertise multi-conn "
            "(NBD_FLAG_CAN_MULTI_CONN): another client's writes might not "
            "be seen by this one", o->uri);
    tls_client_free (tls);
    close (fd);
    goto fail_claim;
  }
  if (e.size < MIN_BLOCK_SIZE) {
    errorf (CMD ": %s: the export has %" PRIu64 " bytes, less than a block",
            o->uri, e.size);
    tls_client_free (tls);
    close (fd);
    goto fail_claim;
  }
  rec.remote = true;
  rec.shared = o->shared;
  snprintf (rec.image, sizeof rec.image, "%s", canon);
  rec.readonly = o->readonly || (e.eflags & NBD_FLAG_READ_ONLY);
  rec.size = e.size;
  rec.block_size = remote_block_size (o, &e);
  rec.dio_align = e.block_preferred;
  rec.timeout = o->timeout;
  rec.dead_timeout = o->dead_timeout;
  rec.autoclear = o->autoclear;
  rec.supervisor_pid = getpid ();
  snprintf (rec.slice, sizeof rec.slice, "%s", o->slice);
  snprintf (rec.cgroup, sizeof rec.cgroup, "%s", prot.cgroup);
  snprintf (rec.link, sizeof rec.link, "connected");
  rec.link_since = time (NULL);
  /* The device's identity for the kernel: this attachment (its name is
   * unique while it lives), the device's --name for udev's
   * /dev/disk/by-pdio (60-pdio.rules), then as much of the URI as fits.
   */
  {
    int n = snprintf (rec.backend, sizeof rec.backend, "pdio-nbd:%s:",
                      rec.name);
    size_t room, clen = strlen (canon);

    if (o->alias && !test_break ("no-alias"))
      n += snprintf (rec.backend + n, sizeof rec.backend - n, "%s:",
                     o->alias);
    room = sizeof rec.backend - n - 1;
    memcpy (rec.backend + n, canon, clen < room ? clen : room);
    rec.backend[n + (clen < room ? clen : room)] = '\0';
  }
  if (o->device)
    snprintf (rec.device, sizeof rec.device, "/dev/nbd%d",
              nbd_index (o->device));
  if (rec.block_size == 0) {
    tls_client_free (tls);
    close (fd);
    goto fail_claim;
  }
  {
    int kfd = link_hand_over (fd, tls, &relay, rec.tls, sizeof rec.tls,
                              note, sizeof note, why, sizeof why);

    /* kTLS took the send side and refused the receive side: that
     * connection is lost, but the relay can carry a new one, as it
     * would a reconnect's.
     */
    if (kfd == -2)
      kfd = connect_again (o, u, &e, &fd, &tls, &relay, rec.tls,
                           sizeof rec.tls, note, sizeof note, why,
                           sizeof why);
    if (kfd < 0) {
      errorf (CMD ": %s: %s", o->uri, why);
      tls_client_free (tls);
      if (fd >= 0)
        close (fd);
      goto fail_claim;
    }
    if (note[0])
      warnf (CMD ": %s: TLS through a relay in the supervisor: %s", o->uri,
             note);
    fd = kfd;
  }
  /* The supervisor keeps its own reference to the socket it hands the
   * kernel: an error on it is a dead link, and shutting it down is how a
   * hung one is made dead for the kernel (which ignores a new socket
   * aimed at a live one).
   */
  link_fd = dup (fd);
  lock = state_lock (CMD);
  if (lock == -1) {
    close (fd);
    close (link_fd);
    relay_stop (relay);
    goto fail_claim;
  }
  /* Under the run directory's lock, which every attach connects under:
   * two cannot both take one name.
   */
  if (o->alias && !test_break ("name-unchecked")) {
    int holder = alias_holder (o->alias);

    if (holder >= 0) {
      errorf (CMD ": --name %s: /dev/disk/by-pdio/%s is /dev/nbd%d's "
              "already: choose another name", o->alias, o->alias, holder);
      close (lock);
      close (fd);
      close (link_fd);
      relay_stop (relay);
      goto fail_claim;
    }
  }
  ev = nbdnl_events_open (why, sizeof why);
  {
    int fds[1] = { fd };
    uint16_t flags = e.eflags | (o->readonly ? NBD_FLAG_READ_ONLY : 0);

    if (!device_connect_fds (&rec, fds, flags, e.block_max, why,
                             sizeof why)) {
      errorf (CMD ": %s: %s", rec.device[0] ? rec.device : o->uri, why);
      if (rec.device[0] && device_is_ours (&rec))
        device_disconnect (rec.device, why, sizeof why);
      close (lock);
      close (link_fd);
      relay_stop (relay);
      goto fail_claim;
    }
  }
  if (record_write (&rec) == -1) {
    errorf (CMD ": cannot write the record of %s in %s: %m", rec.device,
            rundir ());
    device_disconnect (rec.device, why, sizeof why);
    close (lock);
    close (link_fd);
    relay_stop (relay);
    goto fail_claim;
  }
  close (lock);
  claim_note (claim, "attached", rec.device);
  device_scan_partitions (rec.device);
  if (o->autoclear) {
    device_settle ();
    if (!device_autoclear (&rec, why, sizeof why)) {
      errorf (CMD ": %s: cannot arm autoclear: %s", rec.device, why);
      lock = state_lock (CMD);
      device_disconnect (rec.device, why, sizeof why);
      state_remove (&rec);
      if (lock >= 0)
        close (lock);
      close (link_fd);
      relay_stop (relay);
      goto fail_claim;
    }
  }
  printf ("%s\n", rec.device);
  fflush (NULL);
  supervise_link (&rec, u, &e, notify_fd, claim, ev, link_fd, relay, &prot);

 fail_claim:
  claim_drop (claim, rec.name);
  return EXIT_FAILED;
}

/* One TLS setting from an option and the URI: the same, or only one. */
static bool
tls_path (const char *opt, const char *what, char *in_uri, size_t size,
          const char *uri)
{
  char real[PATH_MAX];

  if (opt) {
    if (in_uri[0] && strcmp (in_uri, opt) != 0) {
      errorf (CMD ": %s %s: the URI says %s", what, opt, in_uri);
      return false;
    }
    snprintf (in_uri, size, "%s", opt);
  }
  if (in_uri[0] == '\0')
    return true;
  /* The supervisor reads it again at each reconnect, from wherever. */
  if (realpath (in_uri, real) == NULL) {
    errorf (CMD ": %s: %s %s: %m", uri, what, in_uri);
    return false;
  }
  snprintf (in_uri, size, "%s", real);
  return true;
}

/* The --tls options joined to the URI's tls-* parameters in u. */
static bool
tls_settings (const struct remote_opts *o, struct nbd_uri *u)
{
  if (!tls_path (o->tls_certificates, "--tls-certificates",
                 u->tls_certificates, sizeof u->tls_certificates, o->uri) ||
      !tls_path (o->tls_psk, "--tls-psk", u->tls_psk_file,
                 sizeof u->tls_psk_file, o->uri))
    return false;
  if (u->tls_certificates[0] && u->tls_psk_file[0]) {
    errorf (CMD ": %s: certificates (%s) or a PSK (%s), not both", o->uri,
            u->tls_certificates, u->tls_psk_file);
    return false;
  }
  if (strcmp (u->tls_type, "psk") == 0 && u->tls_psk_file[0] == '\0') {
    errorf (CMD ": %s: tls-type=psk needs --tls-psk FILE", o->uri);
    return false;
  }
  if (o->tls_username) {
    if (u->user[0] && strcmp (u->user, o->tls_username) != 0) {
      errorf (CMD ": --tls-username %s: the URI says %s", o->tls_username,
              u->user);
      return false;
    }
    if (strlen (o->tls_username) >= sizeof u->user) {
      errorf (CMD ": --tls-username: too long");
      return false;
    }
    snprintf (u->user, sizeof u->user, "%s", o->tls_username);
  }
  if (o->tls_verify_peer >= 0) {
    if (u->tls_verify_peer >= 0 && u->tls_verify_peer != o->tls_verify_peer) {
      errorf (CMD ": --%stls-verify-peer: the URI says tls-verify-peer=%d",
              o->tls_verify_peer ? "" : "no-", u->tls_verify_peer);
      return false;
    }
    u->tls_verify_peer = o->tls_verify_peer;
  }
  if (u->tls_verify_peer == 0 && !tls_client_mode_psk (u))
    warnf (CMD ": warning: %s: the server's certificate is not checked: "
           "anyone on the path can pretend to be the server", o->uri);
  return true;
}

int
remote_attach (const struct remote_opts *o)
{
  struct nbd_uri u;
  char why[512], canon[PATH_MAX];
  int p[2], status;
  pid_t pid;
  char c;

  if (!nbd_uri_parse (o->uri, &u, why, sizeof why)) {
    errorf (CMD ": %s: %s", o->uri, why);
    return EXIT_USAGE;
  }
  if (u.tls && !tls_settings (o, &u))
    return EXIT_USAGE;
  if (!nbd_uri_canonical (&u, canon, sizeof canon)) {
    errorf (CMD ": %s: too long to record (more than %d bytes once "
            "written out)", o->uri, PATH_MAX - 1);
    return EXIT_USAGE;
  }
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
    _exit (remote_attached (o, &u, canon, p[1]));
  }
  close (p[1]);
  if (read (p[0], &c, 1) == 1)
    return EXIT_OK;
  while (waitpid (pid, &status, 0) == -1)
    if (errno != EINTR)
      return EXIT_FAILED;
  return WIFEXITED (status) ? WEXITSTATUS (status) : EXIT_FAILED;
}
