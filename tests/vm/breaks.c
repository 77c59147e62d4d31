/* SPDX-License-Identifier: BSD-3-Clause */
/* The break points of vm/pdio-broken: pdio(1) built from the same sources
 * with -DPDIO_TEST_BREAKS and this file, never installed.  The guest
 * (run.sh --break LIST) runs it in place of pdio to show that each test
 * fails without the feature it tests; the frontend scenario runs it for
 * an attach that fails after the device is connected.  In pdio itself
 * test_break() is false and the names below are not compiled in.
 *
 * $PDIO_TEST_BREAK is a comma-separated list of:
 *   no-restart            the supervisor records a death, starts no server
 *   no-give-up            the supervisor never gives up
 *   handover-off          pdio restart does not hand the connections over:
 *                         the supervisor kills the server and reconnects,
 *                         as for nbdkit
 *   handover-stall        the successor stops for 3 s right after it took
 *                         the connections over: a hand-over that holds the
 *                         kernel's requests
 *   server-exits-with-supervisor  (--nbdkit) nbdkit -f --exit-with-parent
 *                         as the supervisor's child, dying with it
 *   no-autoclear          mount.pdio does not arm autoclear
 *   no-partscan           attach does not read the partition table
 *   scan-inline           attach answers no LINK_DEAD while the partition
 *                         table is read, as when it read it itself
 *   no-take-over          pdio restart refuses a device whose supervisor
 *                         is gone
 *   no-udev-settle        attach --autoclear does not wait for udev
 *   no-umount-helper      mount.pdio does not mark its mounts helper=pdio
 *   fail-after-connect    attach fails once the device is connected
 *   die-after-connect     attach is killed (SIGKILL) once the device is
 *                         connected, before it records it: an orphan
 *   no-backend            attach gives the kernel no backend identifier
 *   backend-mismatch      resize's reconfigure names another image
 *   resize-no-reconfigure resize does not tell the kernel the new size
 *   resize-no-shrink-check  resize shrinks a device in use
 *   resize-no-restart     resize does not restart an nbdkit server
 *   no-identity-check     the supervisor serves whatever file the image's
 *                         path names now
 *   supervisor-stale-size the supervisor keeps the record it started with
 *                         (so a restart after a resize writes back the
 *                         size of the attach)
 *   attach-no-lock        attach takes no claim on the image: concurrent
 *                         attaches of one image are not told the winner
 *   ktls-off              pdio serve keeps TLS in user space (GnuTLS)
 *                         where the kernel could take the session
 *   no-destroy-flag       devices made on demand are not destroyed on
 *                         disconnect (NBD_CFLAG_DESTROY_ON_DISCONNECT)
 *   kernel-timeout-default  attach as before timeout 0 was the default:
 *                         request timeout 15 s, one connection per CPU
 *                         up to 4
 *   kernel-timeout-nonzero  attach gives the kernel a request timeout of
 *                         1 s (the requeue timer as a timeout that drops
 *                         the connection), a remote device's too
 *   multi-timeout-long    attach -C N > 1 gives the kernel the 15 s
 *                         request timeout pdio had
 *   multi-timeout-short   attach -C N > 1 gives it 2 s, less than the
 *                         crash scenario's slow disk takes
 *   no-busy-retry         attach --device does not retry a connect the
 *                         kernel refuses as in use (EBUSY)
 *   no-watchdog           the supervisor never probes its server
 *   no-reconnect          a remote device's supervisor records a dead link
 *                         but never reconnects
 *   no-export-check       a remote device's supervisor hands the device
 *                         whatever export the URI reaches now
 *   no-ktls               an nbds:// device never gets kTLS: the relay
 *                         carries its TLS
 *   relay-flip            the TLS relay flips a bit at the end of each
 *                         chunk of more than 4 KiB that the kernel sends
 *                         (a write's data) before the server gets it
 *   no-shared-check       attach of a remote export neither refuses a
 *                         second attachment of it nor asks multi-conn of
 *                         the server for --shared
 *   link-dead-at-attach   attach shuts the device's first connection down
 *                         right before it becomes the supervisor: a
 *                         LINK_DEAD the kernel sends while attach works
 *   events-late           the supervisor subscribes to the driver's events
 *                         only once it runs, as it used to: a LINK_DEAD
 *                         sent during attach is missed
 *   no-io-flusher         neither the supervisor nor pdio serve sets
 *                         PR_SET_IO_FLUSHER
 *   no-oom-adjust         the supervisor (and so attach's servers) and
 *                         pdio serve --oom-protect keep the default
 *                         oom_score_adj
 *   child-keeps-protection  a program pdio runs (udevadm, mount, busctl...)
 *                         keeps PR_SET_IO_FLUSHER and oom_score_adj -1000
 *   watchdog-ignores-stall  the watchdog replaces a server that has not
 *                         answered for 10 s however stalled (D state,
 *                         memory pressure) it is, as it used to
 *   no-alias              attach leaves the device's name out of its
 *                         backend identifier: no /dev/disk/by-pdio link
 *   any-name              attach --name takes any name, however invalid
 *   name-unchecked        attach takes a name another device has
 *   no-udev-change        attach sends udev no change event once the
 *                         backend identifier is set
 *   no-max-request        attach leaves the driver's largest request
 *                         (max_sectors_kb) at its 128 KiB
 *   no-reserve            pdio serve's workers keep no pool reserve: an
 *                         idle server pins nothing, and the first write
 *                         after its pool went back faults a chunk in
 *   ktls-rx-refused       a remote device's supervisor (and attach) puts
 *                         only the send side of a TLS session in the
 *                         kernel, and takes the receive side as refused:
 *                         a socket that kTLS left unusable, once per
 *                         process
 *   supervisor-exits-late a remote device's supervisor, told to exit,
 *                         ends its main thread at once and the process a
 *                         second later: a zombie main thread whose process
 *                         still holds the claim
 *
 * And two test settings, each read from its own variable:
 * PDIO_BOUNCE_CANARY=1 has pdio serve fill free bounce pages with 0xa5
 * (engine/canary.tap and engine/inject.tap with pdio's own server;
 * tests/lib/common.sh runs this program for them); PDIO_SYSFS=DIR has
 * pdio read DIR in place of /sys (cli/cli.tap's fake nbd devices on a
 * host without the driver; cli/lib.sh runs this program for them).
 */
#include <config.h>

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "pdio.h"

bool
test_break (const char *what)
{
  const char *v = getenv ("PDIO_TEST_BREAK");
  size_t n = strlen (what);

  while (v && *v) {
    size_t len = strcspn (v, ",");

    if (len == n && strncmp (v, what, n) == 0)
      return true;
    v += len;
    if (*v == ',')
      v++;
  }
  return false;
}

bool
test_bounce_canary (void)
{
  const char *v = getenv ("PDIO_BOUNCE_CANARY");

  return v != NULL && strcmp (v, "1") == 0;
}

const char *
test_sysfs (void)
{
  const char *v = getenv ("PDIO_SYSFS");

  return v && *v ? v : NULL;
}

static int kept_link = -1;

void
test_keep_link (int fd)
{
  kept_link = fd;
}

void
test_break_link (void)
{
  if (kept_link >= 0) {
    shutdown (kept_link, SHUT_RDWR);
    close (kept_link);
    kept_link = -1;
  }
}

static void *
exit_later (void *arg)
{
  msleep (1000);
  exit ((int) (intptr_t) arg);
}

void
test_exit_late (int status)
{
  pthread_t t;

  if (pthread_create (&t, NULL, exit_later, (void *) (intptr_t) status) != 0)
    exit (status);
  pthread_exit (NULL);
}

/* The design in which a device dies with its supervisor: the guest's
 * "supervisor killed" test must fail with it.
 */
pid_t
test_start_server_tied (const struct server_opts *o, const char *log,
                        char *why, size_t len)
{
  struct server_opts fg = *o;
  struct server_cmd cmd;
  pid_t pid;

  fg.pidfile = NULL;
  unlink (o->socket);
  server_argv (&fg, &cmd);
  pid = run_background ((char **) cmd.argv, log);
  for (unsigned t = 0; pid > 0 && access (o->socket, F_OK) == -1; t += 20) {
    if (t >= 10000 || waitpid (pid, NULL, WNOHANG) == pid) {
      snprintf (why, len, "nbdkit could not serve %s (see %s)", o->image,
                log);
      return -1;
    }
    msleep (20);
  }
  return pid;
}
