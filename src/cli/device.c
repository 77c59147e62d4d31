/* SPDX-License-Identifier: BSD-3-Clause */
/* /dev/nbdN connected by pdio itself: negotiate the connections with the
 * server (negotiate.c), hand them to the kernel over netlink
 * (nbd_netlink.c), show the partitions, arm autoclear, resize,
 * disconnect.  What attach, detach, resize, the supervisor and mount.pdio
 * share.  Every change after the connect repeats the image's identity
 * (the record's backend): the kernel refuses one that does not.
 */
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <dirent.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <sys/pidfd.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>
#include <linux/fs.h>
#include <linux/nbd.h>

#include "pdio.h"

/* How long the kernel has to show a connect or a new size in sysfs (it
 * does both before the netlink call returns; this is a bound, not an
 * expected wait).
 */
#define DEVICE_WAIT_MS 10000
/* How long a connect to a device asked for by number retries while the
 * kernel calls it in use (device_connect_fds), and how often.
 */
#define BUSY_WAIT_MS 5000
#define BUSY_RETRY_MS 100

/* The identifier every reconfigure must repeat, or NULL if the device was
 * connected without one.
 */
static const char *
backend_of (const struct record *r)
{
  return r->backend[0] ? r->backend : NULL;
}

bool
alias_valid (const char *alias)
{
  size_t n = strlen (alias);

  return n > 0 && n <= ALIAS_MAX && strcmp (alias, ".") != 0 &&
    strcmp (alias, "..") != 0 &&
    strspn (alias, ALIAS_CHARS) == n;
}

void
alias_of_image (const char *image, char *alias)
{
  const char *base = strrchr (image, '/');
  const char *dot;
  size_t n;

  base = base ? base + 1 : image;
  /* "disk.img" is "disk"; ".hidden" keeps its only dot. */
  dot = strrchr (base, '.');
  n = dot && dot != base ? (size_t) (dot - base) : strlen (base);
  if (n > ALIAS_MAX)
    n = ALIAS_MAX;
  for (size_t i = 0; i < n; i++)
    alias[i] = strchr (ALIAS_CHARS, base[i]) && base[i] ? base[i] : '_';
  alias[n] = '\0';
  if (!alias_valid (alias))
    alias[0] = '\0';
}

bool
backend_id (const char *image, const char *alias, char *buf, char *why,
            size_t len)
{
  struct stat st;
  size_t plen = strlen (image);
  const char *path = image;
  int n;

  if (stat (image, &st) == -1) {
    snprintf (why, len, "%s: %s", image, strerror (errno));
    return false;
  }
  if (S_ISBLK (st.st_mode))
    n = snprintf (buf, BACKEND_ID_MAX, "pdio:%u:%u:0:", major (st.st_rdev),
                  minor (st.st_rdev));
  else
    n = snprintf (buf, BACKEND_ID_MAX, "pdio:%u:%u:%llu:", major (st.st_dev),
                  minor (st.st_dev), (unsigned long long) st.st_ino);
  /* Before the path, which is absolute: an identifier of an older pdio
   * has a "/" where this has the name, and a name has no "/".
   */
  if (alias && alias[0] && !test_break ("no-alias"))
    n += snprintf (buf + n, BACKEND_ID_MAX - n, "%s:", alias);
  /* A path too long to show keeps its end, which names the file. */
  if (n + plen >= BACKEND_ID_MAX)
    path = image + plen - (BACKEND_ID_MAX - n - 1);
  snprintf (buf + n, BACKEND_ID_MAX - n, "%s", path);
  return true;
}

/* Past "pdio:MAJOR:MINOR:INODE:" in a pdio identifier, its name into
 * alias ("" if it has none); the path.  NULL if it is not pdio's.
 */
static const char *
backend_split (const char *backend, unsigned *maj, unsigned *min,
               unsigned long long *ino, char *alias)
{
  const char *rest, *colon;
  int end = 0;

  alias[0] = '\0';
  if (sscanf (backend, "pdio:%u:%u:%llu:%n", maj, min, ino, &end) != 3 ||
      end == 0)
    return NULL;
  rest = backend + end;
  colon = strchr (rest, ':');
  if (rest[0] != '/' && colon && (size_t) (colon - rest) <= ALIAS_MAX) {
    memcpy (alias, rest, colon - rest);
    alias[colon - rest] = '\0';
    if (alias_valid (alias))
      return colon + 1;
    alias[0] = '\0';
  }
  return rest;
}

bool
backend_parse (const char *backend, char *name, size_t len,
               const char **image)
{
  char alias[ALIAS_MAX + 1];
  unsigned maj, min;
  unsigned long long ino;

  *image = backend_split (backend, &maj, &min, &ino, alias);
  if (*image == NULL)
    return false;
  /* backend_id gives a block device inode 0, which no file has. */
  identity_name (ino == 0, makedev (maj, min), ino, name, len);
  return true;
}

/* A remote device's identifier is pdio-nbd:ATTACHMENT:[NAME:]URI
 * (remote.c); a URI's scheme is followed by "://", a name by the URI.
 */
static void
remote_alias (const char *backend, char *alias)
{
  const char *rest = strchr (backend + strlen ("pdio-nbd:"), ':'), *colon;

  alias[0] = '\0';
  if (rest == NULL || (colon = strchr (++rest, ':')) == NULL ||
      strncmp (colon, "://", 3) == 0 || (size_t) (colon - rest) > ALIAS_MAX)
    return;
  memcpy (alias, rest, colon - rest);
  alias[colon - rest] = '\0';
  if (!alias_valid (alias))
    alias[0] = '\0';
}

void
backend_alias (const char *backend, char *alias)
{
  unsigned maj, min;
  unsigned long long ino;

  if (strncmp (backend, "pdio-nbd:", strlen ("pdio-nbd:")) == 0)
    remote_alias (backend, alias);
  else
    backend_split (backend, &maj, &min, &ino, alias);
}

int
alias_holder (const char *alias)
{
  char path[PATH_MAX], backend[BACKEND_ID_MAX], other[ALIAS_MAX + 1];
  struct dirent *d;
  DIR *dir;
  int found = -1;

  snprintf (path, sizeof path, "%s/block", sysfs ());
  dir = opendir (path);
  if (dir == NULL)
    return -1;
  while (found < 0 && (d = readdir (dir)) != NULL) {
    int idx = nbd_index (d->d_name);

    if (idx < 0 || !nbd_backend (idx, backend, sizeof backend))
      continue;
    backend_alias (backend, other);
    if (strcmp (other, alias) == 0)
      found = idx;
  }
  closedir (dir);
  return found;
}

/* The flags a device keeps: a device past nbds_max was made for us and
 * goes when it is disconnected, so that none pile up; the module's own
 * nbd0 .. nbd(nbds_max-1) stay, as users of other clients expect.
 */
static uint64_t
keep_flags (const struct record *r)
{
  return r->on_demand && !test_break ("no-destroy-flag")
    ? NBD_CFLAG_DESTROY_ON_DISCONNECT : 0;
}

static bool
came_up (int idx, void *arg)
{
  (void) arg;
  return nbd_connected (idx) && nbd_size (idx);
}

static bool
sized (int idx, void *arg)
{
  return nbd_size (idx) == *(const uint64_t *) arg;
}

bool
device_connect (struct record *r, char *why, size_t len)
{
  int fds[MAX_CONNECTIONS];
  struct nbd_offer e;

  if (!nbd_handshake_n (r->socket, r->connections, fds, &e, why, len))
    return false;
  return device_connect_fds (r, fds, e.eflags, e.block_max, why, len);
}

bool
device_connect_fds (struct record *r, int *fds, uint16_t eflags,
                    uint32_t block_max, char *why, size_t len)
{
  int idx = r->device[0] ? nbd_index (r->device) : -1;
  struct nbd_offer e = { .eflags = eflags };
  struct nbdnl_device d;

  if (r->connections > 1 && !(e.eflags & NBD_FLAG_CAN_MULTI_CONN)) {
    snprintf (why, len, "%s: the server does not advertise multi-conn",
              r->remote ? r->image : r->socket);
    idx = -1;
  }
  else {
    /* Destroyed on disconnect from the start, so that a device the kernel
     * makes for us cannot outlive us even if we die right after; a
     * module's device has the flag taken off at once below.
     */
    r->on_demand = true;
    d = (struct nbdnl_device) {
      .index = idx, .size = r->size - r->size % r->block_size,
      .block_size = r->block_size, .server_flags = e.eflags,
      .client_flags = keep_flags (r),
      .timeout = r->timeout, .dead_timeout = r->dead_timeout,
      .backend = test_break ("no-backend") ? NULL : backend_of (r),
    };
    /* A device asked for by number can be held open for a moment by
     * someone who does not use it: udev's worker opens each block device
     * it handles an event of (in the guest: the change event of the
     * detach just before, its probe still reading), and an open of an
     * unconnected nbd device gives it a configuration, so the kernel
     * refuses the connect ("nbdN already in use", EBUSY).  attach found it free
     * (check_device): wait that open out, within a bound.  Without a
     * number the kernel itself moves on to another device.
     */
    for (unsigned t = 0;; t += BUSY_RETRY_MS) {
      idx = nbdnl_connect (&d, fds, r->connections, why, len);
      if (idx >= 0 || d.index < 0 || errno != EBUSY || t >= BUSY_WAIT_MS ||
          test_break ("no-busy-retry"))
        break;
      msleep (BUSY_RETRY_MS);
    }
  }
  /* The kernel holds its own references to the sockets. */
  for (unsigned i = 0; i < r->connections; i++) {
#ifdef PDIO_TEST_BREAKS
    if (i == 0 && idx >= 0 && test_break ("link-dead-at-attach")) {
      test_keep_link (fds[0]);
      continue;
    }
#endif
    close (fds[i]);
  }
  if (idx < 0)
    return false;
  snprintf (r->device, sizeof r->device, "/dev/nbd%d", idx);
  r->on_demand = idx >= nbd_nbds_max ();
  if (!r->on_demand) {
    const struct nbdnl_change c = {
      .backend = backend_of (r), .client_flags = keep_flags (r),
    };

    if (!nbdnl_reconfigure (idx, &c, why, len))
      return false;
  }
  if (!wait_nbd (idx, came_up, NULL, DEVICE_WAIT_MS)) {
    snprintf (why, len, "%s: connected over netlink but the device did "
              "not come up within %d s", r->device, DEVICE_WAIT_MS / 1000);
    return false;
  }
  /* The driver sends at most 128 KiB a request whatever the server
   * takes, so a 1 MiB read went out as eight; larger requests measured
   * faster (docs/performance.md), up to MAX_REQUEST_BYTES (pdio.h).  A
   * server that advertises no maximum keeps the driver's.
   */
  if (block_max >= MIN_REQUEST_BYTES && !test_break ("no-max-request")) {
    unsigned kb;

    if (!nbd_set_max_request (idx, block_max < MAX_REQUEST_BYTES
                              ? block_max : MAX_REQUEST_BYTES, &kb))
      warnf ("pdio: warning: %s: cannot set queue/max_sectors_kb (%m): "
             "requests stay at the driver's 128 KiB", r->device);
  }
  /* Timeout 0 on one connection: the requests of a dead connection are
   * resent at their timer's first expiry after the hand-over (pdio.h,
   * DEFAULT_TIMEOUT).  The kernel left the timer at 30 s.
   */
  if (r->timeout == 0 && r->connections == 1 &&
      !nbd_set_io_timeout (idx, REQUEUE_MS))
    warnf ("pdio: warning: %s: cannot set queue/io_timeout to %u ms (%m): "
           "requests in flight when its server dies wait 30 s", r->device,
           REQUEUE_MS);
  return true;
}

void
device_scan_partitions (const char *device)
{
  /* The kernel reads the partition table at the next open after the
   * size is set; with no udev to open it, nobody would.  BLKRRPART makes
   * it explicit (as losetup -P does); EINVAL means no partitions allowed
   * (nbd loaded with max_part=0).
   */
  int fd = open (device, O_RDONLY | O_CLOEXEC);

  if (fd >= 0) {
    if (ioctl (fd, BLKRRPART) == -1 && errno != EINVAL)
      warnf ("pdio: warning: %s: cannot read its partition table: %m",
             device);
    close (fd);
  }
  /* The connect's own change event comes before the kernel shows the
   * backend identifier, so udev may have read the device without it:
   * once more now, partitions included, for /dev/disk/by-pdio.
   */
  if (!test_break ("no-udev-change"))
    nbd_announce (nbd_index (device));
}

static void
scan_and_settle (const char *device, bool scan, bool settle)
{
  if (scan)
    device_scan_partitions (device);
  if (settle)
    device_settle ();
}

/* The scan's reads wait on the device like any other request.  With
 * several connections, one slower than the timeout drops its connection
 * and waits for a fresh one, which only this process can hand over yet:
 * scanning inline, it would answer the LINK_DEAD only after the
 * dead-connection timeout had failed the reads.  So a child scans, and
 * waits for udev's probe with settle, while this process answers.
 */
void
device_prepare (const struct record *r, bool scan, bool settle,
                struct nl_sock *ev, void (*on_dead) (void *arg), void *arg)
{
  int idx = nbd_index (r->device), pfd, status;
  pid_t pid;

  fflush (NULL);
  pid = fork ();
  if (pid == 0) {
    scan_and_settle (r->device, scan, settle);
    fflush (NULL);
    _exit (0);
  }
  if (pid == -1) {
    warnf ("pdio: warning: %s: fork: %m: reading the partition table here",
           r->device);
    scan_and_settle (r->device, scan, settle);
    return;
  }
  /* Without a pidfd (a kernel before 5.3), a tick sees the child end. */
  pfd = pidfd_open (pid, 0);
  while (waitpid (pid, &status, WNOHANG) == 0) {
    struct pollfd p[2] = {
      { .fd = pfd, .events = POLLIN },
      { .fd = ev ? nbdnl_events_fd (ev) : -1, .events = POLLIN },
    };
    bool dead = false;
    int i;

    if (poll (p, 2, pfd >= 0 ? -1 : 100) == -1 && errno != EINTR) {
      warnf ("pdio: warning: %s: poll: %m", r->device);
      msleep (100);
    }
    if (p[1].revents & POLLIN)
      while ((i = nbdnl_events_read (ev)) >= -2)
        if (i == idx)
          dead = true;
    if (dead)
      on_dead (arg);
  }
  if (pfd >= 0)
    close (pfd);
}

/* udev probes a device it sees change (blkid opens and closes it), a
 * little after the change; with autoclear armed, that close would be the
 * last one and detach it.  So wait for udev to be done, if it runs here.
 */
void
device_settle (void)
{
  char udevadm[PATH_MAX];
  char *argv[] = { udevadm, (char *) "settle", (char *) "--timeout=10",
                   NULL };

  if (access ("/run/udev/control", F_OK) == 0 &&
      find_program (NULL, "udevadm", udevadm, sizeof udevadm))
    run_quiet (argv);
}

void
device_drop_partitions (const char *device)
{
  /* The kernel keeps nbdNp1... after a disconnect; opening the device,
   * now of size 0, rereads the (empty) table and removes them.  Not if
   * the device is still in use (detach --force of a mounted one).
   */
  int fd = open (device, O_RDONLY | O_CLOEXEC);

  if (fd >= 0) {
    if (nbd_size (nbd_index (device)) == 0)
      ioctl (fd, BLKRRPART);
    close (fd);
  }
}

/* The kernel sets both client flags from what a reconfigure carries:
 * DESTROY_ON_DISCONNECT is repeated, or it would be dropped.
 */
bool
device_autoclear (const struct record *r, char *why, size_t len)
{
  const struct nbdnl_change c = {
    .backend = backend_of (r),
    .client_flags = NBD_CFLAG_DISCONNECT_ON_CLOSE | keep_flags (r),
  };

  return nbdnl_reconfigure (nbd_index (r->device), &c, why, len);
}

bool
device_connected (int idx)
{
  char why[256];
  int r = nbdnl_status (idx, why, sizeof why);

  /* No netlink family (no driver, or a fake sysfs in the tests): what
   * sysfs says, which is the same fact (the pid file exists while the
   * device has a configuration).
   */
  return r >= 0 ? r == 1 : nbd_connected (idx);
}

bool
device_is_ours (const struct record *r)
{
  char backend[sizeof r->backend];
  int idx = nbd_index (r->device);

  if (backend_of (r) == NULL)
    return device_connected (idx);
  return nbd_backend (idx, backend, sizeof backend) &&
    strcmp (backend, r->backend) == 0;
}

bool
device_disconnect (const char *device, char *why, size_t len)
{
  return nbdnl_disconnect (nbd_index (device), why, len);
}

bool
device_reconnect (const struct record *r, char *why, size_t len)
{
  int fds[MAX_CONNECTIONS];
  struct nbd_offer e;
  bool ok;

  if (!nbd_handshake_n (r->socket, r->connections, fds, &e, why, len))
    return false;
  /* An image that grew since (pdio resize not run yet) is served whole,
   * and the device still sees its old size: harmless.  Smaller, the end
   * of the device would be gone.
   */
  if (e.size < r->size) {
    snprintf (why, len, "the new server's size %llu is less than the "
              "device's %llu (the image shrank?)",
              (unsigned long long) e.size, (unsigned long long) r->size);
    ok = false;
  }
  else {
    /* No client flags: the ones the device has stay. */
    const struct nbdnl_change c = {
      .backend = backend_of (r), .fds = fds, .n = r->connections,
      .client_flags = -1,
    };

    ok = nbdnl_reconfigure (nbd_index (r->device), &c, why, len);
  }
  for (unsigned i = 0; i < r->connections; i++)
    close (fds[i]);
  return ok;
}

bool
device_resize (const struct record *r, uint64_t size, char *why, size_t len)
{
  int idx = nbd_index (r->device);
  const struct nbdnl_change c = {
    .backend = test_break ("backend-mismatch") ? "pdio:another-image"
                                               : backend_of (r),
    .client_flags = -1, .size = size - size % r->block_size,
  };

  if (c.size == 0) {
    snprintf (why, len, "%llu bytes is less than one block (%u bytes)",
              (unsigned long long) size, (unsigned) r->block_size);
    return false;
  }
  if (!nbdnl_reconfigure (idx, &c, why, len))
    return false;
  if (!wait_nbd (idx, sized, (void *) &c.size, DEVICE_WAIT_MS)) {
    snprintf (why, len, "the kernel took the new size, but the device "
              "shows %llu bytes, not %llu, after %d s",
              (unsigned long long) nbd_size (idx),
              (unsigned long long) c.size, DEVICE_WAIT_MS / 1000);
    return false;
  }
  return true;
}

/* Whether a /proc/PID/fd link names the device or one of its partitions:
 * "/dev/nbd3", "/dev/nbd3p1", not "/dev/nbd31".
 */
static bool
names_device (const char *link, int idx)
{
  char dev[32];
  size_t n = snprintf (dev, sizeof dev, "/dev/nbd%d", idx);

  return strncmp (link, dev, n) == 0 && (link[n] == '\0' || link[n] == 'p');
}

bool
device_in_use (int idx, char *buf, size_t len)
{
  DIR *proc;
  struct dirent *p;
  bool found = false;

  if (nbd_busy (idx, buf, len))
    return true;
  proc = opendir ("/proc");
  if (proc == NULL)
    return false;
  while (!found && (p = readdir (proc)) != NULL) {
    char dir[300], path[PATH_MAX], link[PATH_MAX], comm[64];
    struct dirent *f;
    DIR *fds;
    ssize_t n;

    if (p->d_name[0] < '1' || p->d_name[0] > '9')
      continue;
    snprintf (dir, sizeof dir, "/proc/%s/fd", p->d_name);
    fds = opendir (dir);
    if (fds == NULL)
      continue;
    while (!found && (f = readdir (fds)) != NULL) {
      snprintf (path, sizeof path, "%s/%s", dir, f->d_name);
      n = readlink (path, link, sizeof link - 1);
      if (n <= 0)
        continue;
      link[n] = '\0';
      if (names_device (link, idx)) {
        if (!proc_comm (atoi (p->d_name), comm, sizeof comm))
          snprintf (comm, sizeof comm, "?");
        snprintf (buf, len, "open by %s (pid %s)", comm, p->d_name);
        found = true;
      }
    }
    closedir (fds);
  }
  closedir (proc);
  return found;
}
