/* pdio(1)'s side of the kernel's nbd driver (issue 12): the NBD client
 * handshake pdio does itself, the generic netlink commands that hand the
 * negotiated sockets to /dev/nbdN, the supervisor that keeps a device
 * served, and the one place a server is started.  Kept out of pdio.h so
 * that the older commands' header stays as it was.
 */
#ifndef PDIO_CLI_KERNEL_H
#define PDIO_CLI_KERNEL_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "pdio.h"

/* Dead-connection timeout: how long the kernel holds requests while a
 * device has no live connection, waiting for the supervisor to hand it
 * new ones.  Long enough for a restart that has to wait for the dead
 * server's lock, short enough that a server that cannot come back turns
 * into I/O errors rather than a hang.
 */
#define DEFAULT_DEAD_TIMEOUT 60

/* --- nbd_handshake.c: the client side of the NBD handshake ------------------ */
struct nbd_export {
  uint64_t size;
  uint16_t flags;               /* transmission flags (NBD_FLAG_*) */
  uint32_t block_min, block_pref, block_max;   /* 0: not advertised */
};
/* Connects to the unix socket and negotiates (fixed newstyle, NBD_OPT_GO
 * for the default export, asking for block sizes): the returned fd is in
 * the transmission phase, ready for the kernel.  -1 with why set.
 */
extern int nbd_handshake (const char *socket, struct nbd_export *e,
                          char *why, size_t len);
/* n connections (all must agree on size and flags); false with why set
 * and nothing left open.
 */
extern bool nbd_handshake_n (const char *socket, unsigned n, int *fds,
                             struct nbd_export *e, char *why, size_t len);

/* --- nbd_netlink.c: the driver's generic netlink family ------------------------ */
struct nbdnl_device {
  int index;
  uint64_t size;
  uint32_t block_size;
  uint64_t server_flags;
  unsigned timeout;             /* request timeout, seconds */
  unsigned dead_timeout;        /* NBD_ATTR_DEAD_CONN_TIMEOUT, seconds */
};
/* NBD_CMD_CONNECT with fds[0..n); the kernel owns them on success (close
 * ours afterwards either way).  false with why set.
 */
extern bool nbdnl_connect (const struct nbdnl_device *d, const int *fds, unsigned n,
                        char *why, size_t len);
extern bool nbdnl_disconnect (int index, char *why, size_t len);
/* NBD_CMD_RECONFIGURE: fresh sockets for the dead connections (extra ones
 * are refused by the kernel and closed), and/or client flags (autoclear:
 * -1 leaves them alone).
 */
extern bool nbdnl_reconfigure (int index, const int *fds, unsigned n,
                            int64_t client_flags, char *why, size_t len);
/* NBD_CMD_STATUS: 1 connected, 0 not, -1 error (why set). */
extern int nbdnl_status (int index, char *why, size_t len);
/* A socket subscribed to the driver's multicast group (NBD_CMD_LINK_DEAD);
 * nbdnl_events_fd() to poll it.  nbdnl_events_read() reads what is pending
 * (without blocking) and returns the index of a device whose link died,
 * -2 if what it read was of no interest, -3 if nothing was pending, -1 on
 * error.
 */
struct nl_sock;
extern struct nl_sock *nbdnl_events_open (char *why, size_t len);
extern int nbdnl_events_fd (struct nl_sock *s);
extern int nbdnl_events_read (struct nl_sock *s);

/* --- device.c: /dev/nbdN connected by pdio ------------------------------------ */
/* Handshakes r->connections sockets on r->socket and connects r->device
 * with r's size, block size and timeouts; waits for it to come up.
 */
extern bool device_connect (const struct record *r, char *why, size_t len);
/* Fresh connections for a live device (after a restart, or a dead link). */
extern bool device_reconnect (const struct record *r, char *why, size_t len);
extern void device_scan_partitions (const char *device);
/* Waits for udev's probes of the devices it saw change, if udev runs. */
extern void device_settle (void);
/* After a disconnect: nbdNp1... go away. */
extern void device_drop_partitions (const char *device);
/* The device disconnects when its last opener closes it. */
extern bool device_autoclear (const char *device, char *why, size_t len);
extern bool device_disconnect (const char *device, char *why, size_t len);
/* NBD_CMD_STATUS: the device has a configuration (sysfs if no netlink). */
extern bool device_connected (int idx);

/* --- frontend.c: start a server for IMAGE on SOCKET ---------------------------- */
/* The one function a new server type plugs into: starts it in the
 * background serving o->image on o->socket, logging to log, and returns its
 * pid once it listens (it may still be opening the image), or -1 with why
 * set (its log has the details).  The caller must be its parent or its
 * subreaper to learn how it dies.
 */
extern pid_t frontend_start (const struct server_opts *o, const char *log,
                             char *why, size_t len);
/* How the server of a record is started: its front end, plugin, threads,
 * image, socket and read-only come from the record.
 */
extern struct server_opts record_server_opts (const struct record *r,
                                              const char *pdio,
                                              const char *nbdkit,
                                              const char *pidfile);

/* --- supervise.c ---------------------------------------------------------- */
/* Runs in attach's child once the device is connected: writes a byte on
 * notify_fd once stdout is let go, then supervises; never returns.  so is
 * how attach started the server (front end, programs, threads); image,
 * socket, pid file and read-only come from the record.  adopt: started by
 * pdio restart because the device's supervisor is gone; it records itself
 * and first replaces the server with a child of its own.
 */
extern void supervise (const struct record *r, const struct server_opts *so,
                       int notify_fd, bool adopt)
  __attribute__ ((noreturn));
/* The process is a supervisor (comm "pdio-supervise"): the pid in a
 * record was not reused.
 */
extern bool pid_is_supervisor (pid_t pid);
/* "killed by SIGKILL", "exited with status 1"... */
extern void describe_status (int status, char *buf, size_t len);

/* Tests only: PDIO_TEST_BREAK is a comma-separated list of deliberate
 * breakages (no-restart, no-give-up, server-exits-with-supervisor,
 * no-autoclear, no-partscan, no-take-over, no-udev-settle,
 * no-umount-helper) with which the guest tests are run to show that each
 * fails without the feature it tests.
 */
extern bool test_break (const char *what);

/* --- the commands -------------------------------------------------------------- */
extern int cmd_restart (int argc, char **argv);
extern int cmd_mount (int argc, char **argv);
extern int cmd_umount (int argc, char **argv);

#endif /* PDIO_CLI_KERNEL_H */
