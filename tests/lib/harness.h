/* SPDX-License-Identifier: BSD-3-Clause */
/* Shared pieces of the integration clients (shadow_io, interleave_io,
 * nbdreq): a reproducible PRNG, connecting to a unix socket with libnbd,
 * and one poll loop that drives several connections at once.
 *
 * Every failure is fatal: the clients are tests, and the first wrong byte
 * or unexpected error ends the run with a message that says how to
 * reproduce it.  Exit status 1 = the server misbehaved, 99 = the test
 * itself could not run (bad arguments, out of memory, no image).
 */
#ifndef PDIO_TEST_HARNESS_H
#define PDIO_TEST_HARNESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <libnbd.h>

#define EXIT_SERVER_BUG 1
#define EXIT_HARD_ERROR 99

extern const char *progname;

/* Report and exit.  fail(): the server is wrong.  hard_error(): the test
 * could not run.  nbd_fail(): a libnbd call failed (its message is added).
 */
extern void fail (const char *fmt, ...)
  __attribute__ ((noreturn, format (printf, 1, 2)));
extern void hard_error (const char *fmt, ...)
  __attribute__ ((noreturn, format (printf, 1, 2)));
extern void nbd_fail (const char *what) __attribute__ ((noreturn));
/* "usage: PROGNAME SYNOPSIS" and exit 99 (a wrong command line). */
extern void usage_exit (const char *synopsis) __attribute__ ((noreturn));
/* Exits with status after letting the tracked connections wind down. */
extern void fail_exit (int status) __attribute__ ((noreturn));
/* The connections fail_exit() should drain and close: an abrupt hang-up
 * with replies pending crashes nbdkit 1.32.5, and the crash would hide the
 * failure being reported.
 */
extern void track_handles (struct nbd_handle **hs, int n);

/* Errno names as request scripts spell them ("EIO", "ENOSPC", ...):
 * parse_errname() exits on an unknown name; errname() falls back to
 * strerror().  has_word(): is word among f[from..n)?
 */
extern int parse_errname (const char *s);
extern const char *errname (int err);
extern bool has_word (char **f, int n, int from, const char *word);

/* Splits a request word "op:field:...[!ERRNAME|?ERRNAME]" in place: its
 * ':'-separated fields into f[0..max) (returns how many; exits on none),
 * the errno it must fail with into *want (0: must succeed) and whether
 * that failure is only allowed ('?') rather than required ('!').
 */
extern int split_request (char *req, char **f, int max, int *want,
                          bool *optional);

extern void *xmalloc (size_t n);
extern void *xcalloc (size_t n, size_t size);
extern uint64_t parse_u64 (const char *s, const char *what);

/* splitmix64: tiny, fast, and the same sequence on every machine. */
struct rng {
  uint64_t s;
};
extern uint64_t rng_next (struct rng *r);
/* Uniform in [0, n); n > 0. */
extern uint64_t rng_below (struct rng *r, uint64_t n);
/* Uniform in [lo, hi]. */
extern uint64_t rng_range (struct rng *r, uint64_t lo, uint64_t hi);
extern void rng_fill (struct rng *r, void *buf, size_t len);
/* A seed from the clock, for runs without -s. */
extern uint64_t seed_from_clock (void);

/* Opens a handle on the unix socket.  Unaligned requests are the point of
 * these tests, so libnbd's client-side alignment check (STRICT_ALIGN) is
 * turned off: the server must accept them whatever block sizes it
 * advertises.  base:allocation is requested, for block status.
 */
/* sock: a unix socket's path, or an NBD URI (nbds://... with its TLS
 * credentials as query parameters).
 */
extern struct nbd_handle *connect_socket (const char *sock);
extern int nbd_connect_unix_or_uri (struct nbd_handle *h, const char *where);

/* Fails the test unless the export is exactly size bytes (the image). */
extern void expect_export_size (struct nbd_handle *h, uint64_t size);

/* Disconnects cleanly: nothing may be in flight (an abrupt hang-up with
 * replies queued crashes nbdkit 1.32.5, see field notes).
 */
extern void disconnect (struct nbd_handle *h);

/* One round of poll(2) over every handle that has commands in flight,
 * then the matching nbd_aio_notify_*().  Completion callbacks run inside
 * this.  Fails the test if nothing happens for timeout_s seconds while
 * commands are in flight: a hung server is a bug, not a reason to wait
 * for make's patience to run out.
 */
#define MAX_HANDLES 64
extern void poll_handles (struct nbd_handle **hs, int n, int timeout_s);

/* Total commands in flight over the handles. */
extern unsigned in_flight (struct nbd_handle **hs, int n);

/* A command's completion, for the clients that poll for it: the first
 * member of their per-command struct, whose address is the completion
 * callback's user_data; note_completion is that callback.
 */
struct completion {
  bool done;
  int err;
};
extern int note_completion (void *opaque, int *error);

/* Reads the whole image file into buf, bypassing the page cache when the
 * file system allows (O_DIRECT), so that loading the initial shadow does
 * not itself leave the image cached.  Fails if the file's size is not
 * expect_size (the export's).
 */
extern void load_image (const char *path, void *buf, uint64_t expect_size);
/* Writes len bytes of buf to a new file at path. */
extern void save_file (const char *path, const void *buf, uint64_t len);

/* Compares got[0..len) with want; on a difference prints where (absolute
 * offset = base + i), the first differing bytes and how many differ, and
 * returns the index of the first difference, or -1 if equal.
 */
extern int64_t report_mismatch (const char *what, uint64_t base,
                                const uint8_t *want, const uint8_t *got,
                                size_t len);

#endif /* PDIO_TEST_HARNESS_H */
