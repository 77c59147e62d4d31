/* SPDX-License-Identifier: BSD-3-Clause */
/* pdio(1): attach, detach, list, restart and serve images, losetup-style;
 * mount.pdio and umount.pdio.  The server of an attachment is a daemon --
 * pdio's own (pdio serve, which runs the engine and src/server/ in its
 * process) or, with --nbdkit, nbdkit with pdio.so.  The side that attaches
 * never opens the image (the server holds its lock): it negotiates with
 * the server, hands the connections to the kernel's nbd driver over
 * netlink, leaves a supervisor per device, and keeps a record of each
 * attachment in the run directory.
 *
 * The sections go from the bottom up: each file uses only those above it.
 */
#ifndef PDIO_CLI_H
#define PDIO_CLI_H

#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include "ispowerof2.h"
#include "server.h"

/* Exit codes (documented in pdio(1) and --help). */
enum {
  EXIT_OK = 0,
  EXIT_FAILED = 1,              /* failed; the reason is printed */
  EXIT_USAGE = 2,               /* bad command line */
  EXIT_NO_DRIVER = 3,           /* the kernel has no nbd driver */
  EXIT_NOT_ROOT = 4,            /* not root: attach, detach, restart,
                                   resize; list of /run/pdio */
};

/* Defaults, each with its reason in pdio(1).
 *
 * Connections: one.  Linux 6.1's nbd driver treats a request that
 * outlives its timer differently with one connection and with several
 * (nbd_xmit_timeout): with several it always resends the request on
 * another connection and drops the one it was on, whatever the request
 * timeout, so slow I/O on a live server tears connections down; with one
 * and a request timeout of 0 it resends only requests whose connection
 * was replaced, and leaves a live one alone.  Only the latter lets a
 * crash cost just the restart (REQUEUE_MS) while a slow disk costs
 * nothing.  -C N (multi-conn, one blk-mq hardware queue per connection,
 * capped at the CPU count) remains for those who want the parallelism.
 */
#define DEFAULT_CONNECTIONS 1
#define MAX_CONNECTIONS 16
/* Kernel request timeout (NBD_ATTR_TIMEOUT) with one connection: 0, "never
 * give up on a live connection".  A hung server is then the supervisor's
 * to notice (watchdog.c), and the requests that were in flight on a dead
 * connection are resent at the first expiry of their timer after the
 * supervisor has handed the device a new one (the connection's cookie
 * changed): that timer is /sys/block/nbdN/queue/io_timeout, which pdio
 * sets to REQUEUE_MS.  The block layer rounds expiries up to whole
 * seconds, so requests wait 1-2 s past the hand-over at most.  Each
 * expiry on a live connection logs one "Possible stuck request" line
 * (dev_info, not rate-limited): a request slower than REQUEUE_MS costs
 * one line per second it takes, nothing more.
 */
#define DEFAULT_TIMEOUT 0
#define REQUEUE_MS 1000
/* With several connections (-C N > 1) a request's expiry drops its
 * connection and resends the request whatever the timeout (see above),
 * and the requests in flight at a server's death are resent only at
 * their timer's expiry: one value is both the longest pause a crash
 * costs such a device (the timeout rounded up to a whole second, or the
 * restart if that takes longer) and the slowest request a live
 * connection keeps.  5 s: a third of the 15 s pdio had, and still past
 * what a disk that is merely slow takes (the guest's crash scenario
 * holds every request of a dm-delay device 3 s and must see no
 * connection dropped).  A request slower than that on a live server
 * drops its connection and is resent on another; storage slower than the
 * timeout on every request drops them all and is resent for as long as
 * it stays that slow.  While attach still reads the partition table,
 * attach hands the fresh connections itself (device_prepare).
 */
#define DEFAULT_MULTI_TIMEOUT 5
/* The largest request pdio asks the kernel to send (max_sectors_kb), if
 * the server advertises at least that much: the driver's default is 128
 * KiB.  Measured on the kernel path (bench/kernel.sh), 1 MiB requests
 * moved 1 MiB sequential writes faster than 128 KiB (median 1.5x) and
 * reads a little; larger ones did not, and a longer request is a longer
 * one for the io_timeout timer
 * (REQUEUE_MS, and DEFAULT_MULTI_TIMEOUT with several connections) to
 * outlast on a slow link.  Below MIN_REQUEST_BYTES (a page) the kernel
 * refuses the setting.
 */
#define MAX_REQUEST_BYTES (1024u * 1024)
#define MIN_REQUEST_BYTES 4096u
/* Dead-connection timeout: how long the kernel holds requests while a
 * device has no live connection, waiting for the supervisor to hand it
 * new ones.  Long enough for a restart that has to wait for the dead
 * server's lock, short enough that a server that cannot come back turns
 * into I/O errors rather than a hang.
 */
#define DEFAULT_DEAD_TIMEOUT 60
/* nbdkit worker threads per connection (nbdkit -t); 16 is nbdkit's own
 * default.  The one place to tune it.
 */
#define NBDKIT_THREADS 16
/* The kernel nbd driver takes block sizes from 512 to the page size. */
#define MIN_BLOCK_SIZE 512
#define MAX_BLOCK_SIZE 4096
/* What a device's cgroup is guaranteed (memory.min; placement.c): what an
 * idle device holds, its server's reserve included -- the bound the
 * per-device memory test asserts for server and supervisor together.
 */
#define DEVICE_MEMORY_MIN (4 << 20)
/* The slice attach puts a device's cgroup in (--slice). */
#define DEFAULT_SLICE "pdio.slice"
/* The image's identity as the kernel is told it (NBD_ATTR_BACKEND_IDENTIFIER,
 * shown in /sys/block/nbdN/backend), with its terminating NUL.  The kernel
 * sets no limit, but sysfs shows at most a page, and it is meant to be
 * read: the identity is in the first few dozen bytes, the rest is the path.
 */
#define BACKEND_ID_MAX 256
/* A device's name, /dev/disk/by-pdio/NAME (60-pdio.rules): at most this
 * many of these characters, which need no quoting in a path, a shell or a
 * udev rule.
 */
#define ALIAS_MAX 64
#define ALIAS_CHARS "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz" \
  "0123456789._-"

/* --- util.c: messages, parsing, environment ------------------------------ */
extern void errorf (const char *fmt, ...)
  __attribute__ ((format (printf, 1, 2)));
extern void warnf (const char *fmt, ...)
  __attribute__ ((format (printf, 1, 2)));
/* Parses a decimal number in [min, max]; false if it is not one. */
extern bool parse_uint (const char *s, unsigned long min, unsigned long max,
                        unsigned long *out);
/* Parses a size in bytes, with an optional K, M, G, T or P (powers of
 * 1024, "KiB" and "K" alike); false if it is not one or overflows.
 */
extern bool parse_size (const char *s, uint64_t *out);
/* $PDIO_RUNDIR or /run/pdio: sockets, pid files, logs and records. */
extern const char *rundir (void);
/* Makes the run directory, or makes it root-only (0700) if it was not:
 * it holds the servers' sockets.  false with the error printed.
 */
extern bool make_rundir (const char *cmd);
/* /sys (the test build: or a fake tree, test_sysfs). */
extern const char *sysfs (void);
/* What nbdkit loads (--nbdkit): the --plugin option, else $PDIO_PLUGIN,
 * else "pdio" (nbdkit-pdio-plugin.so).
 */
extern const char *plugin_name (const char *option);
/* The one operand after a command's options (argv[optind], what it is
 * named in the message), or NULL with the error said and usage shown.
 */
extern const char *one_operand (const char *cmd, int argc, char **argv,
                                const char *what, void (*usage) (FILE *));
/* False, with a message naming cmd, if not run as root. */
extern bool need_root (const char *cmd);
/* For backoffs only, where nothing announces the end of the wait: a wait
 * for an event is wait.c's.
 */
extern void msleep (unsigned ms);
/* poll itself failed (no memory for its table): a supervisor's loop
 * tries again after this; there is no event to wait on.
 */
#define POLL_RETRY_MS 1000
/* The first line of a small file (a sysfs or /proc one), without its
 * newline; false if it cannot be read or is empty of lines.
 */
extern bool read_line (const char *path, char *buf, size_t len);

/* --- spawn.c: running programs, watching processes ----------------------- */
/* The program's path, from $ENV if set, else from PATH, into buf; false
 * if it is not there (buf then holds the last path tried).
 */
extern bool find_program (const char *env, const char *name, char *buf,
                          size_t len);
/* Runs argv and waits: its exit status, 128+signal, or -1 if it could not
 * run.  out_fd >= 0 replaces its stdout and stderr (-1: inherited).  The
 * program runs without pdio's protections (protect.c): no
 * PR_SET_IO_FLUSHER, no negative oom_score_adj.
 */
extern int run_wait (char *const argv[], int out_fd);
/* The same, its output kept and shown on stderr only if it fails. */
extern int run_quiet (char *const argv[]);
/* Starts argv in the background, in a session of its own, stdin from
 * /dev/null and stdout and stderr to log (or inherited if NULL): the
 * server of an attachment, which outlives pdio, and keeps its
 * protections.  Its pid or -1.
 */
extern pid_t run_background (char *const argv[], const char *log);
/* Like run_background, but stays in pdio's session (serve --nbdkit's
 * server).
 */
extern pid_t run_child (char *const argv[]);
/* In a forked child that is no server, before it runs another program or
 * anything that allocates freely: no PR_SET_IO_FLUSHER, and a protective
 * oom_score_adj back to 0.  System calls only.
 */
extern void unprotect_child (void);
extern bool pid_alive (pid_t pid);
/* The process's comm is "nbdkit" or "pdio" (pdio's own server): the pid
 * in a record was not reused.
 */
extern bool pid_is_server (pid_t pid);
/* The process's comm, without the newline, in comm; false if none. */
extern bool proc_comm (pid_t pid, char *comm, size_t len);

/* --- wait.c: waiting for what the kernel announces, under a deadline ---- */
/* The monotonic clock in ms, and the time ms from now on it. */
extern long now_ms (void);
extern long deadline_in (unsigned ms);
/* Until ready (arg) or the deadline end (false then): ready is asked at
 * the start, whenever fd (an inotify, uevent or pidfd descriptor) has
 * something to read, and for a short while after (the kernel announces
 * some changes just before it makes them).  fd -1, nothing to watch:
 * ready is asked after a backoff.
 */
extern bool wait_until (int fd, bool (*ready) (void *), void *arg, long end);
/* A non-blocking inotify descriptor watching path for mask, or -1. */
extern int inotify_on (const char *path, uint32_t mask);
/* The same for the directory that holds path (for a file to appear). */
extern int inotify_on_dir (const char *path, uint32_t mask);
/* A non-blocking socket of the kernel's uevents (a block device's "change"
 * at connect, resize and disconnect), or -1.
 */
extern int uevents_open (void);
/* Until ready (idx, arg) for /dev/nbdIDX, asked at each uevent; false
 * after ms.
 */
extern bool wait_nbd (int idx, bool (*ready) (int idx, void *arg), void *arg,
                      unsigned ms);
/* Until pid (not necessarily our child) is gone, by its pidfd; false
 * after ms.
 */
extern bool wait_gone (pid_t pid, unsigned ms);
/* The same, but until every thread of pid has exited, not only its main
 * thread: its files closed and its fcntl locks (a claim) let go.
 */
extern bool wait_exited (pid_t pid, unsigned ms);

/* --- procmem.c: what a process holds ------------------------------------- */
/* Its RSS and PSS in bytes (/proc/PID/smaps_rollup); false if they cannot
 * be read (gone, or not ours to look at).
 */
extern bool proc_memory (pid_t pid, uint64_t *rss, uint64_t *pss);

/* --- proctask.c: a process's threads ------------------------------------ */
/* Calls fn for each thread of pid with its state (R, S, D, T...) and its
 * kernel flags (PF_*), until fn returns false.  The number of threads
 * seen, or -1 if pid's threads cannot be read (gone).
 */
extern int proc_each_task (pid_t pid,
                           bool (*fn) (pid_t tid, char state, unsigned flags,
                                       void *arg),
                           void *arg);

/* --- systemd.c: systemd's manager, over its private socket -------------- */
/* systemd is the init system (sd_booted). */
extern bool systemd_runs (void);
/* StartTransientUnit: a slice with DefaultDependencies=no; a scope of
 * pid in slice, with MemoryMin and DefaultDependencies=no.
 * SetUnitProperties (runtime): a unit's MemoryMin.  false with systemd's
 * answer in why.
 */
extern bool systemd_make_slice (const char *slice, const char *description,
                                char *why, size_t len);
extern bool systemd_make_scope (const char *scope, const char *slice,
                                const char *description, pid_t pid,
                                uint64_t memory_min, char *why, size_t len);
extern bool systemd_set_memory_min (const char *unit, uint64_t bytes,
                                    char *why, size_t len);

/* --- placement.c: the cgroup of a device's processes --------------------- */
/* Where cgroup v2 is mounted (/sys/fs/cgroup, or its unified directory
 * beside v1 controllers), or NULL.
 */
extern const char *cgroup2_root (void);
/* pid's cgroup v2 path ("/pdio.slice/pdio-42.scope"); false if none. */
extern bool proc_cgroup (pid_t pid, char *buf, size_t len);
/* NAME.slice (letters, digits, "-_.:"), or "none". */
extern bool slice_name_valid (const char *name);
/* Moves this process into a cgroup of its own in slice, with memory.min
 * DEVICE_MEMORY_MIN: a systemd scope pdio-PID.scope, or without systemd
 * the cgroup v2 directory SLICE/pdio-PID.  Its path in cg.  false, with
 * why, if it stays where it is (slice "none", not root, no cgroup v2 with
 * the memory controller, systemd refused).  what describes it (the
 * image).
 */
extern bool place_self (const char *slice, const char *what, char *cg,
                        size_t cglen, char *why, size_t len);
/* This process, the last in cgroup cg, is on its way out: a cgroup pdio
 * made is removed; the slice's memory.min no longer counts it.
 */
extern void placement_leave (const char *cg);
/* The processes of cgroup cg are gone (pdio detach stopped them): the
 * same, from outside.
 */
extern void placement_remove (const char *cg);

/* --- protect.c: the I/O path under memory pressure ----------------------- */
/* PR_SET_IO_FLUSHER on the calling thread (and so on the threads it
 * creates and its children, across exec).  false with why set.
 */
extern bool set_io_flusher (char *why, size_t len);
/* oom_score_adj -1000 for this process (inherited by its children). */
extern bool set_oom_protected (char *why, size_t len);
/* PR_SET_THP_DISABLE for this process and its children, across exec. */
extern void no_huge_pages (void);
/* mlockall(MCL_CURRENT | MCL_FUTURE). */
extern bool lock_memory (char *why, size_t len);
/* 1 if every thread of pid has PF_MEMALLOC_NOIO and PF_LOCAL_THROTTLE
 * (what PR_SET_IO_FLUSHER sets), 0 if one lacks them, -1 if they cannot
 * be read.
 */
extern int proc_io_flusher (pid_t pid);
extern bool proc_oom_score_adj (pid_t pid, int *adj);

/* What a supervisor did to protect itself before it started a server:
 * why each protection was refused ("" if it was not), and its cgroup.
 */
struct protection {
  char io_flusher[192];
  char oom[192];
  char lock[192];               /* --swap: mlockall */
  char cgroup[PATH_MAX];        /* where it lives now */
  char placed[256];             /* why it stayed where it was, or "" */
};
/* A device's supervisor, at its start: PR_SET_IO_FLUSHER, oom_score_adj
 * -1000, with swap mlockall, then its own cgroup in slice (place_self).
 */
extern void protect_supervisor (const char *slice, bool swap,
                                const char *image, struct protection *p);

/* --- pressure.c: is a silent server stalled? ----------------------------- */
/* PSI's "some" line for memory: the share of about the last 10 s in which
 * a task waited for memory (percent), and that time in all (µs).
 */
struct psi_some {
  bool have;                    /* read; the rest is 0 if not */
  double avg10;
  uint64_t total_us;
};
struct stall_reading {
  pid_t d_tid;                  /* a thread of the server in D state, or 0 */
  struct psi_some system;       /* /proc/pressure/memory */
  struct psi_some cgroup;       /* the server's cgroup's memory.pressure */
};
/* What /proc says now of server, for watchdog_stalled. */
extern void stall_read (pid_t server, struct stall_reading *r);

/* --- json.c: JSON output -------------------------------------------------- */
/* s as a JSON string, quotes included: escapes what JSON needs, controls
 * and DEL as \u00XX; valid UTF-8 as is, any other byte as \udcXX (as
 * Python's os.fsdecode, so the bytes can be recovered).
 */
extern void json_string (FILE *fp, const char *s);

/* --- uri.c: NBD URIs (doc/uri.md of the NBD project) --------------------- */
#define NBD_URI_DEFAULT_PORT "10809"
/* The longest URI taken: an export name of the protocol's 4096 bytes,
 * every byte percent-encoded, and a socket's path.
 */
#define NBD_URI_MAX 16384
struct nbd_uri {
  bool tls;                     /* nbds://, nbds+unix:// */
  bool unix_socket;             /* nbd+unix://, nbds+unix:// */
  char host[256];               /* TCP: a name (lower case), an IPv4
                                   address, or an IPv6 one without its
                                   brackets ("fe80::1%eth0"); "" never:
                                   none given is localhost */
  char port[6];                 /* TCP: 1..65535, default 10809 */
  char export_name[4097];       /* decoded; "" the default export */
  char socket[108];             /* unix: the socket's path, as given */
  char user[256];               /* before "@", or tls-username=; "" */
  char tls_certificates[PATH_MAX], tls_psk_file[PATH_MAX];
  char tls_hostname[256];
  char tls_type[8];             /* "", "x509", "psk", "anon" */
  int tls_verify_peer;          /* -1 not given, 0, 1 */
};
/* s starts with one of the four schemes: it is meant as a URI (and not
 * as an image's path), whether or not it parses.
 */
extern bool nbd_uri_is (const char *s);
/* Parses uri into *u; false with why naming what is wrong, and where. */
extern bool nbd_uri_parse (const char *uri, struct nbd_uri *u, char *why,
                           size_t len);
/* One spelling per export: scheme, host (lower case, IPv6 as inet_ntop
 * writes it), explicit port, export and socket percent-encoded alike, no
 * TLS parameters.  What identifies a remote export among attachments.
 * false if it does not fit in buf.
 */
extern bool nbd_uri_canonical (const struct nbd_uri *u, char *buf,
                               size_t len);

/* --- sysfs.c: /dev/nbdN as the kernel sees it ---------------------------- */
extern bool nbd_driver_present (void);
/* "/dev/nbd3" or "nbd3" -> 3; -1 if it does not name an nbd device. */
extern int nbd_index (const char *name);
extern bool nbd_exists (int idx);
/* Connected: the kernel has a client task for it (/sys/block/nbdN/pid). */
extern bool nbd_connected (int idx);
extern uint64_t nbd_size (int idx);
/* The module's nbds_max: nbd0 .. nbd(nbds_max-1) exist from the start
 * and stay; a device past them was made on demand.  16 if unknown (the
 * module's default).
 */
extern int nbd_nbds_max (void);
/* /sys/block/nbdN/backend, present while the device is configured: the
 * identifier it was connected with, into buf; false if none.
 */
extern bool nbd_backend (int idx, char *buf, size_t len);
/* /sys/block/nbdN/queue/io_timeout: the block layer's timer of the
 * requests that start from now on, in ms.  false (errno set) if it cannot
 * be written.
 */
extern bool nbd_set_io_timeout (int idx, unsigned ms);
/* /sys/block/nbdN/queue/max_sectors_kb, the largest request the kernel
 * sends: bytes, or the driver's own limit (max_hw_sectors_kb) if that is
 * lower, in *kb.  false (errno set) if it cannot be read or written.
 */
extern bool nbd_set_max_request (int idx, uint32_t bytes, unsigned *kb);
/* /sys/block/nbdN/inflight: the device has requests in flight (true too
 * if that cannot be read: the caller then errs on the side of looking).
 */
extern bool nbd_in_flight (int idx);
/* A change event for the device and each of its partitions, as udevadm
 * trigger makes: udev reads them again (60-pdio.rules names them).
 */
extern void nbd_announce (int idx);
/* Non-zero if the device or a partition of it is mounted or held (by
 * device-mapper, md...): what describes where, in buf.
 */
extern bool nbd_busy (int idx, char *buf, size_t len);

/* --- state.c: the run directory ------------------------------------------ */
struct record {
  char device[32];              /* /dev/nbdN */
  /* The attachment's name, after the image's identity (image_name):
   * the server's socket, pid file and log are RUNDIR/NAME.*, made before
   * the kernel picks the device.  Records of an older pdio have none:
   * their files are nbdN.*, and record_read sets name to "nbdN".
   */
  char name[64];
  /* What the device was connected with (NBD_ATTR_BACKEND_IDENTIFIER,
   * /sys/block/nbdN/backend): the image's identity (backend_id), which
   * only this attachment can have while it lives (one attachment per
   * image: claim.c), so that a device number the kernel has given to
   * another attachment since is never taken for this one.  Every
   * NBD_CMD_RECONFIGURE repeats it.  "" in records of an older pdio, or
   * attached without one.
   */
  char backend[BACKEND_ID_MAX];
  bool on_demand;               /* past nbds_max: destroyed on disconnect */
  char image[PATH_MAX];         /* realpath */
  char socket[PATH_MAX];
  bool readonly;
  unsigned connections;
  uint32_t block_size;          /* the device's, as given to the kernel */
  uint32_t dio_align;           /* the preferred block size the server
                                   advertises: pdio's direct-I/O alignment */
  uint64_t size;                /* the image's, as served (pdio resize
                                   changes it); the device has it rounded
                                   down to block_size */
  pid_t server_pid;
  /* The supervisor, and what it has done. */
  pid_t supervisor_pid;
  unsigned timeout, dead_timeout;       /* seconds, as given to the kernel */
  bool autoclear;
  unsigned restarts;
  char reason[256];             /* why the last restart, "" if none */
  bool gave_up;                 /* the server could not be brought back */
  /* How the server is started, for a supervisor that pdio restart starts
   * when the first one is gone.
   */
  bool nbdkit;                  /* nbdkit + plugin, else pdio serve */
  char plugin[PATH_MAX];        /* with nbdkit: the plugin */
  unsigned threads;             /* pdio serve: worker threads */
  bool swap;                    /* --swap: memory locked, never given back */
  /* Where the supervisor and the server live (placement.c): the slice
   * asked for ("none": the caller's cgroup; "" in records of an older
   * pdio), and the cgroup the supervisor moved into ("" if it stayed).
   */
  char slice[72];
  char cgroup[PATH_MAX];
  /* A remote export (pdio attach nbd://...; remote.c, link.c): image is
   * its canonical URI (nbd_uri_canonical), and there is no server of
   * ours (socket "", server_pid 0).  shared: attached with --shared
   * (the export advertises multi-conn; other attachments of it may be).
   * The link's state: "connected", "reconnecting" or "failed", since
   * link_since (seconds since the epoch), link_why what went wrong;
   * outages counts the link's deaths, last_outage_ms the last one's
   * length (from the death to the device's new connection).
   */
  bool remote, shared;
  char link[16];
  long long link_since;
  char link_why[256];
  unsigned outages;
  long last_outage_ms;
  /* An nbds:// link: how the kernel's socket is encrypted, "ktls" (by the
   * kernel) or "relay" (relay.c); "" for a plain link.
   */
  char tls[8];
  /* Not read from the run directory: an orphan (attachments.c). */
  bool orphan;
};
/* Creates the run directory and takes its lock, which orders the changes
 * of device numbers: attach holds it from NBD_CMD_CONNECT until the
 * record is written, detach for its whole run, a supervisor while it
 * removes the state of a device that went away.  So a number the kernel
 * hands out again is never in two attachments' hands at once.  Returns
 * the lock's fd (close it to release) or -1.
 */
extern int state_lock (const char *cmd);
/* The same without a message, for up to ms; -1 if not had then. */
extern int state_lock_within (unsigned ms);
/* "RUNDIR/BASE.EXT" for BASE "/dev/nbdN" (-> nbdN) or an attachment's
 * name.
 */
extern void state_path (const char *base, const char *ext, char *buf,
                        size_t len);
extern int record_write (const struct record *r);
/* Every record, sorted by device number; *n is set.  NULL with *n = 0 if
 * there are none (or no run directory).
 */
extern struct record *records_load (size_t *n);
/* Room for v[n] in v, an array of cap records, grown as needed (v and
 * cap updated); NULL if out of memory.
 */
extern struct record *records_slot (struct record **v, size_t *cap,
                                    size_t n);
/* By device number, as records_load gives them. */
extern void records_sort (struct record *v, size_t n);
/* The record of one device ("/dev/nbdN"); -1 if there is none. */
extern int record_load_device (const char *device, struct record *r);
/* Removes every file of the attachment in the run directory but its
 * claim: socket, pid file, logs and record.  The one place that does.
 */
extern void state_remove (const struct record *r);
extern void state_forget_device (const struct record *rec, int idx,
                                 unsigned lock_ms);

/* --- claim.c: one attachment per image ----------------------------------- */
/* An image's identity, as a file name: "img-DEV-INO" for a file (any path
 * or hard link to it), "blk-MAJ-MIN" for a block device.  false (errno
 * set) if it cannot be stat'ed.
 */
extern bool image_name (const char *image, char *name, size_t len);
/* The same name from the identity's parts: a block device's number (blk),
 * or a file's file system and inode.
 */
extern void identity_name (bool blk, dev_t dev, unsigned long long ino,
                           char *name, size_t len);
/* Who holds a claim: the process, and the device once it has one. */
struct claim_holder {
  pid_t pid;
  char device[32];              /* "" while attaching */
  char doing[16];               /* "attached", "attaching", "detaching" */
};
/* Claims the image NAME: a write lock (fcntl, so the kernel names its
 * holder) on RUNDIR/NAME.claim, held by one process for as long as an
 * attachment of the image lives: attach's child, which stays as the
 * supervisor, or a detach tearing it down.  It goes with its process,
 * however that ends: never stale.  Waits up to wait_ms while the holder
 * is attaching or detaching; an fd, or -1 with *h naming the holder
 * (h->pid 0: an error, printed).
 */
extern int claim_take (const char *name, const char *doing, unsigned wait_ms,
                       struct claim_holder *h);
/* Someone (not this process) holds the claim of NAME: true, *h naming
 * them.  Takes nothing.
 */
extern bool claim_held (const char *name, struct claim_holder *h);
/* What the holder is doing and on which device, for the others. */
extern void claim_note (int fd, const char *doing, const char *device);
/* Removes the claim file and lets go (the attachment is gone). */
extern void claim_drop (int fd, const char *name);

/* --- negotiate.c: the client side of the NBD handshake ------------------- */
#define NBD_OFFER_STRING 256
/* What a server's replies to NBD_OPT_GO offered. */
struct nbd_offer {
  uint64_t size;
  uint16_t eflags;              /* transmission flags (NBD_FLAG_*) */
  uint32_t block_min, block_preferred, block_max;   /* 0: not advertised */
  /* NBD_INFO_NAME and NBD_INFO_DESCRIPTION, asked of remote exports only
   * (cut to NBD_OFFER_STRING - 1 bytes): part of what makes it the same
   * export after a reconnect.
   */
  bool has_name, has_description;
  char name[NBD_OFFER_STRING], description[NBD_OFFER_STRING];
};
/* Connects to the unix socket and negotiates (fixed newstyle, NBD_OPT_GO
 * for the default export, asking for block sizes): the returned fd is in
 * the transmission phase, ready for the kernel.  -1 with why set.
 */
extern int nbd_handshake (const char *socket, struct nbd_offer *o,
                          char *why, size_t len);
/* n connections (all must agree on size and flags); false with why set
 * and nothing left open.
 */
extern bool nbd_handshake_n (const char *socket, unsigned n, int *fds,
                             struct nbd_offer *o, char *why, size_t len);
/* Connects to the export u names -- TCP (each connect given connect_ms)
 * or a unix socket -- and negotiates NBD_OPT_GO for it, asking for its
 * block sizes, name and description: a socket in the transmission phase,
 * or -1 with why set.  For nbds:// URIs, NBD_OPT_STARTTLS first and the
 * rest inside the TLS session, returned in *tls (which may be NULL for a
 * plain URI only).
 */
struct tls_client;
extern int nbd_handshake_uri (const struct nbd_uri *u, unsigned connect_ms,
                              struct nbd_offer *o, struct tls_client **tls,
                              char *why, size_t len);

/* --- tls_client.c: GnuTLS for nbds:// ------------------------------------ */
/* x509 (tls-certificates=, or the system's CAs) or PSK (tls-psk-file=):
 * a session on fd, not yet shaken hands; NULL with why set.
 */
extern struct tls_client *tls_client_new (const struct nbd_uri *u, int fd,
                                          char *why, size_t len);
extern bool tls_client_mode_psk (const struct nbd_uri *u);
/* false with why naming the cause (certificate, host name, PSK). */
extern bool tls_client_handshake (struct tls_client *t,
                                  const struct nbd_uri *u, char *why,
                                  size_t len);
/* All of n bytes on a blocking socket; false with errno. */
extern bool tls_client_read (struct tls_client *t, void *buf, size_t n);
extern bool tls_client_write (struct tls_client *t, const void *buf,
                              size_t n);
/* Nothing received and not yet given out: the socket can be handed on. */
extern bool tls_client_idle (struct tls_client *t);
/* "TLS1.3, AES-256-GCM" */
extern void tls_client_describe (struct tls_client *t, char *buf,
                                 size_t len);
extern void *tls_client_session (struct tls_client *t); /* gnutls_session_t */
extern int tls_client_fd (struct tls_client *t);
/* Non-blocking: bytes, 0 at the end, -EAGAIN, or another -errno. */
extern ssize_t tls_client_recv_some (struct tls_client *t, void *buf,
                                     size_t n);
extern ssize_t tls_client_send_some (struct tls_client *t, const void *buf,
                                     size_t n);
extern size_t tls_client_pending (struct tls_client *t);
/* After -EAGAIN: the session waits to write (else to read). */
extern bool tls_client_wants_write (struct tls_client *t);
extern void tls_client_free (struct tls_client *t);

/* --- relay.c: TLS for the kernel where kTLS is not to be had ------------- */
/* Starts a relay (one thread, one poll loop) between a socketpair and t,
 * which it then owns: *kernel_fd is the end for the kernel.  NULL with
 * why set.  The relay ends when either side ends, shutting down the
 * other, so that the kernel sees a dead link when the TLS one dies.
 */
struct relay;
extern struct relay *relay_start (struct tls_client *t, int *kernel_fd,
                                  char *why, size_t len);
/* Stops it (if still running) and frees it with its session. */
extern void relay_stop (struct relay *r);
/* Runs the relay's loop in the calling thread until either side ends:
 * for tests that drive it directly.  0, or -errno of what ended it.
 */
extern int relay_run (struct tls_client *t, int local_fd, int stop_fd);
/* What the server on the unix socket, or on localhost:port if socket is
 * NULL, offers (NBD_OPT_INFO), leaving no connection behind.  false with
 * why set.
 */
extern bool nbd_query (const char *socket, const char *port,
                       struct nbd_offer *o, char *why, size_t len);

/* --- nbd_netlink.c: the driver's generic netlink family ------------------ */
struct nbdnl_device {
  int index;                    /* -1: the kernel picks or makes one */
  uint64_t size;
  uint32_t block_size;
  uint64_t server_flags;
  unsigned timeout;             /* request timeout, seconds */
  unsigned dead_timeout;        /* NBD_ATTR_DEAD_CONN_TIMEOUT, seconds */
  uint64_t client_flags;        /* NBD_CFLAG_* */
  const char *backend;          /* NBD_ATTR_BACKEND_IDENTIFIER, or NULL */
};
/* NBD_CMD_CONNECT with fds[0..n); the kernel owns them on success (close
 * ours afterwards either way).  The device's index (the kernel's answer:
 * the one asked for, or the one it picked), or -1 with why set, and
 * errno EBUSY if the kernel found the device asked for in use.
 */
extern int nbdnl_connect (const struct nbdnl_device *d, const int *fds,
                          unsigned n, char *why, size_t len);
extern bool nbdnl_disconnect (int index, char *why, size_t len);
/* NBD_CMD_RECONFIGURE of a connected device.  Once a device has a backend
 * identifier, the kernel refuses (EINVAL) a reconfigure that does not
 * repeat it exactly: it is for the device, not for one change.
 */
struct nbdnl_change {
  const char *backend;          /* as given at connect, or NULL if none */
  const int *fds;               /* fresh sockets for the dead connections */
  unsigned n;                   /* (extra ones are refused and closed) */
  /* -1 leaves them alone; given, they replace both DISCONNECT_ON_CLOSE
   * and DESTROY_ON_DISCONNECT.
   */
  int64_t client_flags;
  uint64_t size;                /* NBD_ATTR_SIZE_BYTES; 0 leaves it */
};
extern bool nbdnl_reconfigure (int index, const struct nbdnl_change *c,
                               char *why, size_t len);
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

/* --- device.c: /dev/nbdN connected by pdio ------------------------------- */
/* Handshakes r->connections sockets on r->socket and connects a device
 * with r's size, block size, timeouts and backend: r->device if set, else
 * the one the kernel picks or makes (set in r->device).  A device past
 * nbds_max is destroyed when it is disconnected (r->on_demand).  Waits
 * for it to come up.
 */
extern bool device_connect (struct record *r, char *why, size_t len);
/* The same with connections already negotiated (a remote export's):
 * fds[0..r->connections) with the export's transmission flags and
 * advertised maximum block size (0: none); they are closed either way
 * (the kernel holds its own references).
 */
extern bool device_connect_fds (struct record *r, int *fds, uint16_t eflags,
                                uint32_t block_max, char *why, size_t len);
/* Fresh connections for a live device (after a restart, or a dead link);
 * the server must serve at least the device's size.
 */
extern bool device_reconnect (const struct record *r, char *why, size_t len);
/* The device's size becomes size rounded down to its block size; the
 * kernel sends a uevent (for resize2fs and xfs_growfs).  Waits until
 * sysfs shows it.
 */
extern bool device_resize (const struct record *r, uint64_t size, char *why,
                           size_t len);
/* The image's identity, "pdio:MAJOR:MINOR:INODE:PATH" (a block device:
 * its device number and inode 0), into buf (BACKEND_ID_MAX); false with
 * why set if it cannot be stat'ed.  The same file gives the same string
 * for as long as it exists, under any name; another file at that path
 * gives another.  With an alias (the device's name, not NULL or ""),
 * "pdio:MAJOR:MINOR:INODE:ALIAS:PATH": 60-pdio.rules makes
 * /dev/disk/by-pdio/ALIAS of it.
 */
extern bool backend_id (const char *image, const char *alias, char *buf,
                        char *why, size_t len);
/* The other way: the attachment's name (image_name) and the image's path
 * (its end, if it was too long) in an identifier backend_id made, with
 * or without an alias; false if it is not one of pdio's.
 */
extern bool backend_parse (const char *backend, char *name, size_t len,
                           const char **image);
/* The alias in an identifier (ALIAS_MAX + 1 bytes), "" if it has none or
 * is not pdio's.
 */
extern void backend_alias (const char *backend, char *alias);
/* 1 to ALIAS_MAX of ALIAS_CHARS, and not "." or "..". */
extern bool alias_valid (const char *alias);
/* The default alias (ALIAS_MAX + 1 bytes): the image's file name without
 * its extension, each character not in ALIAS_CHARS made "_"; "" if
 * nothing valid is left.
 */
extern void alias_of_image (const char *image, char *alias);
/* The nbd device whose identifier has this alias, or -1. */
extern int alias_holder (const char *alias);
/* Someone uses the device: mounted or held (nbd_busy), or open in a
 * process (/proc/PID/fd); what and who, in buf.
 */
extern bool device_in_use (int idx, char *buf, size_t len);
extern void device_scan_partitions (const char *device);
/* Waits for udev's probes of the devices it saw change, if udev runs. */
extern void device_settle (void);
/* After a disconnect: nbdNp1... go away. */
extern void device_drop_partitions (const char *device);
/* device_scan_partitions if scan, and device_settle if settle, while
 * on_dead(arg) answers each LINK_DEAD of the device from ev (with ev
 * NULL, the events wait in their socket until the scan is done).
 */
extern void device_prepare (const struct record *r, bool scan, bool settle,
                            struct nl_sock *ev, void (*on_dead) (void *arg),
                            void *arg);
/* The device disconnects when its last opener closes it. */
extern bool device_autoclear (const struct record *r, char *why, size_t len);
extern bool device_disconnect (const char *device, char *why, size_t len);
/* NBD_CMD_STATUS: the device has a configuration (sysfs if no netlink). */
extern bool device_connected (int idx);
/* The device is connected as r's attachment: the backend it was
 * connected with is r's (for a record without one: connected at all).
 */
extern bool device_is_ours (const struct record *r);

/* --- server_cmd.c: how an attachment's server is run --------------------- */
struct server_opts {
  const char *nbdkit;           /* with nbdkit: its path */
  const char *plugin;           /* with nbdkit: "pdio" or a path to pdio.so */
  const char *image;
  const char *socket;           /* unix socket, or NULL with port */
  const char *port;             /* TCP port (serve only), or NULL */
  const char *bind;             /* with port: nbdkit's -i address */
  bool readonly;
  const char *pidfile;          /* a daemon writing this pid file, or NULL
                                   (nbdkit only): in the foreground, dying
                                   with pdio */
  const char *align, *backend;  /* nbdkit: plugin parameters, or NULL */
  bool native;                  /* pdio's own server: pdio serve */
  const char *pdio;             /* native: this pdio's path */
  unsigned threads;             /* native: worker threads (0: default) */
  char handover[PATH_MAX];      /* native: where the server listens for a
                                   successor (RUNDIR/NAME.handover), or "" */
  bool take_over;               /* native: start as the successor of the
                                   server listening on handover */
  bool swap;                    /* --swap: lock its memory, keep it */
  char stats[PATH_MAX];         /* native: the counters' file
                                   (RUNDIR/NAME.stats), or "" */
};
/* The server's command line, and the strings it points into. */
struct server_cmd {
  const char *argv[24];
  char file_arg[PATH_MAX + 8];
  char align_arg[32], backend_arg[32], threads_arg[16];
};
extern void server_argv (const struct server_opts *o, struct server_cmd *c);
/* How the server of a record is started: its front end, plugin, threads,
 * image, socket and read-only come from the record.
 */
extern struct server_opts record_server_opts (const struct record *r,
                                              const char *pdio,
                                              const char *nbdkit,
                                              const char *pidfile);

/* --- break points: tests/vm/breaks.c, in the test build only ------------- */
/* The guest's negative tests run vm/pdio-broken, this program compiled
 * with -DPDIO_TEST_BREAKS and tests/vm/breaks.c: test_break ("no-restart")
 * is true there when $PDIO_TEST_BREAK lists it.  In pdio itself it is
 * false and its argument is not compiled in.
 */
#ifdef PDIO_TEST_BREAKS
extern bool test_break (const char *what);
/* server-exits-with-supervisor: nbdkit as our child, dying with us. */
extern pid_t test_start_server_tied (const struct server_opts *o,
                                     const char *log, char *why, size_t len);
/* link-dead-at-attach: device_connect keeps the device's first socket
 * open; test_break_link shuts it down, as a kernel that gave up on the
 * connection would.
 */
extern void test_keep_link (int fd);
extern void test_break_link (void);
/* supervisor-exits-late: the main thread ends at once, and another ends
 * the process with status a second later (as a relay thread that takes
 * its time to exit would): the process holds its files, and its claim,
 * while its main thread is already a zombie.
 */
extern void test_exit_late (int status) __attribute__ ((noreturn));
/* Not a break but a test setting: $PDIO_BOUNCE_CANARY=1 has pdio serve
 * fill free bounce pages with PDIO_CANARY (the plugin's -D
 * pdio.canary=1), so that stale bounce memory reaching a client shows.
 */
extern bool test_bounce_canary (void);
/* Another test setting: $PDIO_SYSFS, a fake sysfs tree for the host's
 * tests (this machine has no nbd driver), or NULL.
 */
extern const char *test_sysfs (void);
#else
#define test_break(what) false
#define test_bounce_canary() false
#define test_sysfs() NULL
#endif

/* --- daemon.c: the server of an attachment, as a daemon ------------------ */
struct server_info {
  uint64_t size;
  uint32_t block_min;           /* 0 if not advertised; 1 from pdio */
  uint32_t dio_align;           /* the preferred block size: pdio's direct-
                                   I/O alignment, the smallest logical block
                                   the kernel may use; 0 if not advertised */
  bool readonly;
  bool multi_conn;
};
/* The one function a new server type plugs into: starts it in the
 * background serving o->image on o->socket, logging to log, and returns its
 * pid once it listens, or -1 with why set (its log has the details).  The
 * caller must be its parent or its subreaper to learn how it dies.
 */
extern pid_t server_start (const struct server_opts *o, const char *log,
                           char *why, size_t len);
/* Asks the server (nbd_query: on the unix socket, or on localhost:port if
 * socket is NULL) until it answers, for up to ms.
 */
extern bool server_query (const char *socket, const char *port, unsigned ms,
                          struct server_info *info, char *why, size_t len);
/* The pid in a server's pid file; 0 if none. */
extern pid_t read_pidfile (const char *path);
/* SIGTERM, up to 10 s, then SIGKILL; waits for it to be gone. */
extern void server_stop (pid_t pid);
/* Waits up to ms until no process holds a lock on the image. */
extern bool image_lock_free (const char *image, unsigned ms);
/* Bytes of the image in the page cache (mincore), or -1. */
extern int64_t image_cached_bytes (const char *image);

/* --- attachments.c: the records and the orphans ------------------------ */
/* Every record (records_load) and every orphan: a device connected with
 * a pdio identifier (backend_parse) that no record is of, and whose image
 * nobody claims -- an attach was killed between NBD_CMD_CONNECT and its
 * record.  An orphan is a record of its own (orphan set) made from what
 * is left -- the identifier, the attachment's files it names, sysfs --
 * so that list, detach and attach treat it as they treat a recorded one.
 * Sorted by device number; *n is set.  No orphans if the run directory
 * cannot be read (then neither can the records).
 */
extern struct record *attachments_load (size_t *n);
/* The attachment in recs that a DEVICE or IMAGE argument names (an image
 * by any of its paths, or by the path attached if it is gone), or NULL.
 */
extern const struct record *attachments_match (const char *what,
                                               const struct record *recs,
                                               size_t n);
/* The recorded attachment a DEVICE or IMAGE argument of cmd names; false,
 * with a message, if there is none, if it is an orphan (which only
 * detach handles) or a remote export (no server of pdio's).
 */
extern bool record_find (const char *cmd, const char *what,
                         struct record *out);
/* The command line's one DEVICE or IMAGE operand, as root, to its
 * record: EXIT_OK, or the exit status with the error said.
 */
extern int record_operand (const char *cmd, int argc, char **argv,
                           void (*usage) (FILE *), struct record *out);

/* --- announce.c: what pdio serve prints ---------------------------------- */
/* The "uri: ..." and "attach: nbd-client ..." lines, for either server. */
/* socket, or TCP: bind (NULL: loopback) and port; tls is what the server
 * asks of a client, or NULL without TLS.
 */
extern void print_uri_and_attach (const char *socket, const char *bind,
                                  const char *port,
                                  const struct pdio_tls_config *tls,
                                  uint32_t dio_align, bool readonly);

/* --- serve_native.c: pdio's own NBD server (src/server/) ----------------- */
struct native_serve {
  const char *image;            /* realpath */
  const char *socket;           /* unix socket, or NULL with port */
  const char *port;
  bool readonly;
  uint32_t align;               /* 0: as found */
  int backend;                  /* enum pdio_backend */
  unsigned threads;             /* 0: one per CPU */
  const char *pidfile;          /* daemon mode (pdio attach), or NULL */
  bool exit_with_parent;        /* SIGTERM when the parent dies */
  const char *bind;             /* TCP: the address; NULL: loopback */
  bool plain_beyond_loopback;   /* --tls=off spelled out */
  mode_t socket_mode;           /* 0: 0600 */
  gid_t socket_gid;             /* (gid_t) -1: the creator's */
  unsigned max_connections, handshake_secs;  /* 0: the defaults */
  struct pdio_tls_config tls;
  const char *handover;         /* listen there for a successor, or NULL */
  const char *take_over;        /* take over from the server listening
                                   for a successor there (its listening
                                   sockets and connections), or NULL */
  bool oom_protect;             /* oom_score_adj -1000 */
  bool swap;                    /* mlockall, and no pool memory given back */
  const char *stats;            /* the counters' file (pdio stats), or NULL */
};
/* Serves in this process until SIGINT/SIGTERM/SIGHUP; an exit code. */
extern int serve_native (const struct native_serve *o);
/* A server, before it creates any thread: PR_SET_IO_FLUSHER, and with
 * oom_protect oom_score_adj -1000; a refusal said once on stderr (its
 * log).
 */
extern void serve_protect (bool oom_protect);

/* --- watchdog.c: does a live server still answer? ------------------------ */
/* A probe (one block read at offset 0 on the supervisor's own connection)
 * every WATCHDOG_PROBE_MS while the device has requests in flight; a
 * server that owes an answer, to a probe or to a connection attempt, for
 * WATCHDOG_HUNG_MS is hung.  Far beyond a slow
 * disk's seconds (the guest's slow-storage test delays I/O by 3 s), well
 * within the kernel's dead-connection timeout.
 */
#define WATCHDOG_PROBE_MS 1000
#define WATCHDOG_HUNG_MS 10000
/* Unless it is stalled rather than hung (watchdog_stalled): a thread of
 * it waits in the kernel (D state), or tasks wait for memory at least
 * WATCHDOG_PRESSURE_PCT percent of the time, system-wide or in its cgroup
 * (PSI's "some": avg10, or the total's growth since the last look).
 * Killing such a server frees nothing (SIGKILL does not end a D-state
 * wait) and its successor would have to allocate, fork and exec under the
 * same pressure.  It gets WATCHDOG_EXTEND_MS more at a time, up to
 * WATCHDOG_STALL_MAX_MS in all: the kernel's own hung-task report
 * (hung_task_timeout_secs) comes at 120 s, and a stall that long is no
 * longer one the system gets out of by itself.  A stopped server (state
 * T) or one spinning in user space, with no memory pressure, is replaced
 * at WATCHDOG_HUNG_MS as before.  10 %: an idle system's avg10 is 0.00; a
 * writer reclaiming from a full cgroup shows tens of percent.
 */
#define WATCHDOG_EXTEND_MS 10000
#define WATCHDOG_STALL_MAX_MS 120000
#define WATCHDOG_PRESSURE_PCT 10.0
struct watchdog {
  int fd;                       /* the probe connection, or -1 */
  uint32_t len;                 /* bytes a probe reads */
  uint64_t cookie;              /* of the last probe sent */
  bool sent;                    /* a probe awaits its answer */
  size_t got;                   /* bytes of its reply read */
  long due;                     /* when the next probe goes out (ms) */
  long owed_since;              /* since when an answer is owed, or -1 */
  long deadline;                /* owed this long (ms), it is judged */
  long looked;                  /* the last stall reading's time, or -1 */
  struct psi_some system, cgroup;       /* what it read */
  uint8_t reply[16 + MAX_BLOCK_SIZE];   /* simple reply + one block */
};
enum watchdog_verdict { WATCHDOG_OK, WATCHDOG_HUNG };
/* Times are CLOCK_MONOTONIC milliseconds, passed in. */
extern void watchdog_init (struct watchdog *w);
/* fd: a connection in the transmission phase (nbd_handshake); a probe
 * reads len bytes (the device's block size).
 */
extern void watchdog_attach (struct watchdog *w, int fd, uint32_t len,
                             long now);
/* A connection attempt begun at asked failed: the server owes an answer
 * since then (unless it owed one already).
 */
extern void watchdog_unreachable (struct watchdog *w, long asked);
/* Reads any answer, sends a probe when one is due and the device is busy
 * (has requests in flight), and judges: WATCHDOG_HUNG once an answer has
 * been owed past the deadline (WATCHDOG_HUNG_MS, or later once
 * watchdog_stalled moved it).
 */
extern enum watchdog_verdict watchdog_run (struct watchdog *w, long now,
                                           bool busy);
/* watchdog_run said hung: is the server stalled instead, going by r (what
 * /proc said at now: stall_read)?  true: the deadline moved
 * WATCHDOG_EXTEND_MS on, and why says what was seen ("thread 42 in D
 * state, system memory some avg10=23.50"); false: it is hung (nothing
 * seen, or WATCHDOG_STALL_MAX_MS reached).  Pure: no clock, no /proc.
 */
extern bool watchdog_stalled (struct watchdog *w, long now,
                              const struct stall_reading *r, char *why,
                              size_t len);
/* How long the caller may sleep before watchdog_run has work. */
extern long watchdog_wait_ms (const struct watchdog *w, long now);
/* How long an answer has been owed (0: none is). */
extern long watchdog_owed_ms (const struct watchdog *w, long now);
/* Hangs up politely (waits up to 1 s for an outstanding answer). */
extern void watchdog_close (struct watchdog *w);
/* The server is dead: drop the connection and what it owed. */
extern void watchdog_forget (struct watchdog *w);

/* --- supervise.c: the supervisor of a device ----------------------------- */
/* Runs in attach's child once the device is connected: writes a byte on
 * notify_fd once stdout is let go, then supervises; never returns.  so is
 * how attach started the server (front end, programs, threads); image,
 * socket, pid file and read-only come from the record.  claim: the
 * image's claim (claim.c), held until the device is gone.  adopt: started
 * by pdio restart because the device's supervisor is gone; it records
 * itself, claims the image and first replaces the server with a child of
 * its own.  ev: the driver's events (nbdnl_events_open), opened by attach
 * before it connected the device so that a connection dying in between
 * is not missed; NULL to open them here.  p: how the caller protected
 * itself (protect_supervisor) before it started any server, for the log;
 * the cgroup it moved into is recorded.
 */
extern void supervise (const struct record *r, const struct server_opts *so,
                       int notify_fd, int claim, bool adopt,
                       struct nl_sock *ev, const struct protection *p)
  __attribute__ ((noreturn));
/* The process is a supervisor (comm "pdio-supervise"): the pid in a
 * record was not reused.
 */
extern bool pid_is_supervisor (pid_t pid);
/* "killed by SIGKILL", "exited with status 1"... */
extern void describe_status (int status, char *buf, size_t len);

/* --- remote.c: pdio attach nbd://... ------------------------------------ */
struct remote_opts {
  const char *uri;              /* as given */
  bool readonly;
  unsigned long block_size;     /* 0: the export's preferred, or 512 */
  unsigned timeout, dead_timeout;
  bool autoclear;
  const char *device;           /* --device, or NULL */
  bool shared;                  /* --shared */
  const char *slice;
  bool swap;
  /* nbds://: --tls-certificates, --tls-psk, --tls-username (NULL: not
   * given) and --[no-]tls-verify-peer (-1: not given); they join the
   * URI's own tls-* parameters, and may not contradict them.
   */
  const char *tls_certificates, *tls_psk, *tls_username;
  int tls_verify_peer;
  const char *alias;            /* --name, or NULL */
};
/* Attaches the export the URI names; prints the device.  An exit code. */
extern int remote_attach (const struct remote_opts *o);

/* --- link.c: the supervisor of a remote device --------------------------- */
/* Runs in attach's child once the device is connected with r's record:
 * writes a byte on notify_fd, then keeps the link to the export u names,
 * which was first as offered; link_fd is a reference of its own to the
 * socket the device has.  Never returns.
 */
extern void supervise_link (const struct record *r, const struct nbd_uri *u,
                            const struct nbd_offer *first, int notify_fd,
                            int claim, struct nl_sock *ev, int link_fd,
                            struct relay *relay, const struct protection *p)
  __attribute__ ((noreturn));
/* The socket to give the kernel for a negotiated connection fd with TLS
 * session t (NULL: plain, fd itself): fd with the session's keys in the
 * kernel (mode "ktls"), else a socketpair's end with *relay running
 * (mode "relay"; note says why not kTLS).  The session and fd are then
 * the relay's, or gone; -1 with why set and both still the caller's;
 * -2 the same, but kTLS took the socket's send side and refused its
 * receive side: this connection cannot go on, and the next one made in
 * this process goes through the relay.
 */
extern int link_hand_over (int fd, struct tls_client *t,
                           struct relay **relay, char *mode, size_t mlen,
                           char *note, size_t nlen, char *why, size_t len);
/* link_policy.c: the wait before reconnect attempt attempt + 1 (0: after
 * the first failure), in ms: exponential, jitter (any number) adding up to a
 * quarter, never above 2 s.  Pure.
 */
extern long link_backoff_ms (unsigned attempt, unsigned jitter);
/* A new connection reached the export the device had: the same size and
 * transmission flags, the same name and description where both offers
 * have them.  false with why.  Pure.
 */
extern bool link_same_export (const struct nbd_offer *was,
                              const struct nbd_offer *now, uint64_t size,
                              char *why, size_t len);

/* --- restart.c ------------------------------------------------------------ */
/* What pdio restart does, for pdio resize too: the supervisor replaces the
 * server (one is started if it is gone), and this waits until the record
 * names the new one.  r is reloaded.  false with a message.
 */
extern bool restart_server (const char *cmd, struct record *r);

/* --- the commands: attach.c detach.c list.c serve.c restart.c resize.c ----
 * mount_pdio.c (mount.pdio) umount_pdio.c (umount.pdio); main.c picks one.
 */
extern int cmd_attach (int argc, char **argv);
extern int cmd_detach (int argc, char **argv);
extern int cmd_list (int argc, char **argv);
extern int cmd_serve (int argc, char **argv);
extern int cmd_restart (int argc, char **argv);
extern int cmd_resize (int argc, char **argv);
extern int cmd_stats (int argc, char **argv);
extern int cmd_mount (int argc, char **argv);
extern int cmd_umount (int argc, char **argv);

#endif /* PDIO_CLI_H */
