/* SPDX-License-Identifier: BSD-3-Clause */
/* churn: connect/disconnect cycles with I/O in flight, watching the
 * server's resources (churn.sh runs it; its header says why two modes).
 *
 *   churn -p PID -m graceful|abrupt -f FIRST -n CYCLES [-w WARMUP] [-k]
 *         [-j JOURNAL] SOCKET
 *   churn -v -j JOURNAL -n SLOTS SOCKET
 *
 * Cycle i (FIRST <= i < FIRST+CYCLES) connects, sends four writes into its
 * own 4 KiB slot i (900 bytes each at unaligned offsets, so they share
 * 512-byte blocks and take the read-modify-write path under the range
 * lock) and four reads of other slots, then
 *   graceful: waits for two writes' replies, then nbd_shutdown() with the
 *             rest still in flight (libnbd sends NBD_CMD_DISC and reads
 *             every reply until the server closes);
 *   abrupt:   waits for two writes' replies, then nbd_close() with the
 *             rest in flight: the socket is gone before the server replies.
 * Every acknowledged write is appended to JOURNAL.
 *
 * Before the first cycle, after WARMUP cycles and every 100 cycles after
 * that, once the server has wound the connections down (its thread count
 * is back to the idle count, within 5 s), it samples /proc/PID: open fds,
 * io_uring fds among them, threads and VmRSS; it prints one line per
 * sample (threads not counting io_uring's kernel workers, iou-*), and at
 * the end "flat: ..." or "GROWTH: ..." comparing the last
 * sample with the one after warm-up (tolerance: fds, io_uring fds and
 * threads exactly equal, RSS within 4 MiB).
 *
 * -k: the server keeps its threads and io_uring rings between
 * connections (pdio's own server: one worker thread and ring each, for
 * its lifetime): threads and rings are judged against the warm-up sample
 * alone, not against the idle count and zero.
 *
 * -w 0: no samples, no judgement (cycles that may be cut short by a
 * server abort).  If the server goes away, it prints "server gone at
 * cycle N" (N did not finish) and exits 3; the script decides what that
 * was.
 *
 * -v verifies: each acknowledged write in JOURNAL must read back exactly;
 * every other byte of slots 0..SLOTS-1 must be 0 or the value of the one
 * cycle that wrote there (an unacknowledged write may have landed, in
 * part or not at all).
 *
 * Exit status: 0 pass, 1 server bug or growth, 3 server gone, 99 could not
 * run.
 */
#include <config.h>

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

#define SLOT 4096
#define NWRITES 4
#define NREADS 4
#define WLEN 900

static uint8_t
slot_value (uint64_t cycle)
{
  return 1 + cycle % 251;
}

static uint64_t
write_off (uint64_t cycle, int j)
{
  return cycle * SLOT + 7 + j * 1000;
}

struct sample {
  long fds, rings, threads, rss_kib;
};

static long
status_field (int pid, const char *key)
{
  char path[64], line[256];
  FILE *fp;
  long v = -1;

  snprintf (path, sizeof path, "/proc/%d/status", pid);
  fp = fopen (path, "r");
  if (!fp)
    return -1;
  while (fgets (line, sizeof line, fp))
    if (strncmp (line, key, strlen (key)) == 0 && line[strlen (key)] == ':')
      v = strtol (line + strlen (key) + 1, NULL, 10);
  fclose (fp);
  return v;
}

/* io_uring's kernel workers (iou-wrk-*, iou-sqp-*) show up as threads of
 * the process that owns the ring; the kernel starts them for operations
 * that must block and reaps them when idle.  They are not the server's
 * threads, so they are not counted.
 */
static long
io_wq_threads (int pid)
{
  char path[PATH_MAX], comm[64];
  struct dirent *e;
  long n = 0;
  DIR *d;

  snprintf (path, sizeof path, "/proc/%d/task", pid);
  d = opendir (path);
  if (!d)
    return 0;
  while ((e = readdir (d))) {
    FILE *fp;

    if (e->d_name[0] == '.')
      continue;
    snprintf (path, sizeof path, "/proc/%d/task/%s/comm", pid, e->d_name);
    fp = fopen (path, "re");
    if (fp == NULL)
      continue;
    if (fgets (comm, sizeof comm, fp) && strncmp (comm, "iou-", 4) == 0)
      n++;
    fclose (fp);
  }
  closedir (d);
  return n;
}

static bool
take_sample (int pid, struct sample *s)
{
  char path[64], link[PATH_MAX], target[256];
  DIR *d;
  struct dirent *e;

  snprintf (path, sizeof path, "/proc/%d/fd", pid);
  d = opendir (path);
  if (!d)
    return false;
  s->fds = s->rings = 0;
  while ((e = readdir (d))) {
    ssize_t n;
    if (e->d_name[0] == '.')
      continue;
    s->fds++;
    snprintf (link, sizeof link, "%s/%s", path, e->d_name);
    n = readlink (link, target, sizeof target - 1);
    if (n > 0) {
      target[n] = 0;
      if (strstr (target, "io_uring"))
        s->rings++;
    }
  }
  closedir (d);
  s->threads = status_field (pid, "Threads") - io_wq_threads (pid);
  s->rss_kib = status_field (pid, "VmRSS");
  return s->threads > 0;
}

/* Waits until the server is back to its idle thread count (connections
 * torn down), then samples.  Returns false if the process is gone.
 */
static bool
settled_sample (int pid, long idle_threads, struct sample *s)
{
  for (int i = 0; i < 500; i++) {
    if (!take_sample (pid, s))
      return false;
    if (idle_threads < 0 || s->threads <= idle_threads)
      break;
    usleep (10000);
  }
  /* A moment more for the last fds and frees after the threads went. */
  usleep (20000);
  return take_sample (pid, s);
}

static void
print_sample (const char *label, uint64_t cycle, const struct sample *s)
{
  printf ("%-9s cycle %5" PRIu64 ": fds=%ld io_uring_fds=%ld threads=%ld"
          " rss=%ld KiB\n", label, cycle, s->fds, s->rings, s->threads,
          s->rss_kib);
  fflush (stdout);
}

struct cmd {
  bool is_write;
  bool done;
  int err;
  uint64_t off;
};

static int
on_complete (void *opaque, int *error)
{
  struct cmd *c = opaque;

  c->done = true;
  c->err = *error;
  return 1;
}

/* Polls h until at least want writes completed.  Returns false if the
 * connection died first (the server went away).
 */
static bool
wait_writes (struct nbd_handle *h, struct cmd *cmds, int want)
{
  time_t start = time (NULL);

  for (;;) {
    int done = 0;
    for (int j = 0; j < NWRITES; j++)
      done += cmds[j].done && cmds[j].err == 0;
    if (done >= want)
      return true;
    if (nbd_aio_is_dead (h) || nbd_aio_is_closed (h))
      return false;
    if (time (NULL) - start > 30)
      fail ("no reply to the writes in 30 s");

    unsigned dir = nbd_aio_get_direction (h);
    struct pollfd pfd = {
      .fd = nbd_aio_get_fd (h),
      .events = (dir & LIBNBD_AIO_DIRECTION_READ ? POLLIN : 0) |
                (dir & LIBNBD_AIO_DIRECTION_WRITE ? POLLOUT : 0),
    };
    if (pfd.fd == -1)
      return false;
    if (poll (&pfd, 1, 1000) == -1 && errno != EINTR)
      hard_error ("poll: %m");
    if (pfd.revents & (POLLIN | POLLHUP | POLLERR)) {
      if (nbd_aio_notify_read (h) == -1)
        return false;
    }
    else if (pfd.revents & POLLOUT) {
      if (nbd_aio_notify_write (h) == -1)
        return false;
    }
  }
}

/* The server went away in cycle i (what: how the client found out):
 * churn.sh reads the "server gone" line and decides whether that was
 * allowed.  Closes the handle and the journal; the caller returns 3.
 */
static void
server_gone (struct nbd_handle *h, FILE *jf, uint64_t i, const char *what)
{
  fprintf (stderr, "churn: cycle %" PRIu64 ": %s\n", i, what);
  printf ("server gone at cycle %" PRIu64 "\n", i);
  nbd_close (h);
  fclose (jf);
}

static int
do_churn (const char *sock, int pid, bool abrupt, uint64_t first,
          uint64_t cycles, uint64_t warmup, const char *journal, bool keeps)
{
  static uint8_t wbuf[NWRITES][WLEN], rbuf[NREADS][SLOT];
  struct sample s0 = { 0 }, sw = { 0 }, s = { 0 }, lo, hi;
  long idle_threads;
  FILE *jf = fopen (journal, "a");
  struct rng r = { first * 7919 + 1 };
  bool have_warm = false;
  uint64_t eshutdown = 0;

  if (!jf)
    hard_error ("open %s: %m", journal);
  if (!settled_sample (pid, -1, &s0))
    hard_error ("no process %d", pid);
  idle_threads = keeps ? -1 : s0.threads;
  print_sample ("idle", first, &s0);
  lo = hi = s0;

  for (uint64_t i = first; i < first + cycles; i++) {
    struct nbd_handle *h = nbd_create ();
    struct cmd cmds[NWRITES + NREADS];

    if (!h)
      nbd_fail ("nbd_create");
    /* Unaligned writes are the point (see connect_socket). */
    if (nbd_set_strict_mode (h, nbd_get_strict_mode (h) &
                             ~LIBNBD_STRICT_ALIGN) == -1)
      nbd_fail ("nbd_set_strict_mode");
    if (nbd_connect_unix (h, sock) == -1) {
      server_gone (h, jf, i, nbd_get_error ());
      return 3;
    }
    memset (cmds, 0, sizeof cmds);
    for (int j = 0; j < NWRITES + NREADS; j++) {
      nbd_completion_callback cb = { .callback = on_complete,
                                     .user_data = &cmds[j] };
      int64_t cookie;

      if (j < NWRITES) {
        cmds[j].is_write = true;
        cmds[j].off = write_off (i, j);
        memset (wbuf[j], slot_value (i), WLEN);
        cookie = nbd_aio_pwrite (h, wbuf[j], WLEN, cmds[j].off, cb, 0);
      }
      else {
        cmds[j].off = rng_below (&r, first + cycles) * SLOT;
        cookie = nbd_aio_pread (h, rbuf[j - NWRITES], SLOT, cmds[j].off,
                                cb, 0);
      }
      if (cookie == -1) {
        /* The server died between connect and here. */
        server_gone (h, jf, i, nbd_get_error ());
        return 3;
      }
    }
    if (!wait_writes (h, cmds, 2)) {
      server_gone (h, jf, i, nbd_get_error () ? nbd_get_error ()
                                              : "connection closed");
      return 3;
    }
    /* Once, with a connection open: proves the counters see the worker
     * threads and their rings at all.
     */
    if (i - first + 1 == warmup && take_sample (pid, &s))
      print_sample ("busy", i, &s);
    if (abrupt)
      nbd_close (h);            /* with replies still due */
    else {
      if (nbd_shutdown (h, 0) == -1) {
        server_gone (h, jf, i, nbd_get_error ());
        return 3;
      }
      nbd_close (h);
    }
    /* Only what the client saw acknowledged is promised. */
    for (int j = 0; j < NWRITES + NREADS; j++) {
      if (!cmds[j].done)
        continue;
      /* nbdkit answers ESHUTDOWN to requests it had not started when it
       * processed NBD_CMD_DISC (pdio never returns it): not performed, so
       * not acknowledged either.  Anything else is a failure.
       */
      if (cmds[j].err == ESHUTDOWN)
        eshutdown++;
      else if (cmds[j].err && !abrupt)
        fail ("cycle %" PRIu64 ": request %d failed: %s", i, j,
              strerror (cmds[j].err));
      if (cmds[j].is_write && cmds[j].err == 0)
        fprintf (jf, "%" PRIu64 " %" PRIu64 " %d %u\n", i, cmds[j].off,
                 WLEN, slot_value (i));
    }
    fflush (jf);

    uint64_t n = i - first + 1;
    if (warmup && (n == warmup || (n > warmup && (n - warmup) % 100 == 0) ||
                   n == cycles)) {
      if (!settled_sample (pid, idle_threads, &s)) {
        printf ("server gone at cycle %" PRIu64 "\n", i + 1);
        fclose (jf);
        return 3;
      }
      print_sample (n == warmup ? "warm" : "sample", i + 1, &s);
      if (n == warmup) {
        sw = s;
        have_warm = true;
      }
      if (s.rss_kib > hi.rss_kib)
        hi = s;
    }
  }
  fclose (jf);
  printf ("%" PRIu64 " requests were answered ESHUTDOWN (sent before the"
          " disconnect, refused by nbdkit while it shut the connection"
          " down)\n", eshutdown);

  if (warmup == 0) {
    printf ("done: %" PRIu64 " cycles, resources not judged (-w 0)\n",
            cycles);
    return 0;
  }
  if (!have_warm)
    hard_error ("fewer cycles than the warm-up");
  bool flat = s.fds == sw.fds && s.rings == sw.rings &&
    s.threads == sw.threads &&
    (keeps || (s.threads == s0.threads && s.rings == 0)) &&
    s.rss_kib - sw.rss_kib <= 4096;
  printf ("%s: after warm-up: fds %ld -> %ld, io_uring fds %ld -> %ld,"
          " threads %ld -> %ld (idle %ld), rss %ld -> %ld KiB (%+ld KiB,"
          " peak sample %ld KiB)\n", flat ? "flat" : "GROWTH",
          sw.fds, s.fds, sw.rings, s.rings, sw.threads, s.threads,
          s0.threads, sw.rss_kib, s.rss_kib, s.rss_kib - sw.rss_kib,
          hi.rss_kib);
  (void) lo;
  return flat ? 0 : EXIT_SERVER_BUG;
}

static int
do_verify (const char *sock, const char *journal, uint64_t slots)
{
  uint8_t *img = xmalloc (slots * SLOT), *acked = xcalloc (slots * SLOT, 1);
  struct nbd_handle *h = connect_socket (sock);
  FILE *jf = fopen (journal, "r");
  uint64_t cycle, off, nacked = 0, landed = 0, partial = 0, bad = 0;
  unsigned len, val;

  if (!jf)
    hard_error ("open %s: %m", journal);
  if (nbd_pread (h, img, slots * SLOT, 0, 0) == -1)
    nbd_fail ("nbd_pread");
  disconnect (h);

  while (fscanf (jf, "%" SCNu64 " %" SCNu64 " %u %u", &cycle, &off, &len,
                 &val) == 4) {
    nacked++;
    if (off + len > slots * SLOT)
      hard_error ("journal entry past the slots");
    memset (acked + off, 1, len);
    for (unsigned k = 0; k < len; k++)
      if (img[off + k] != val) {
        if (bad++ == 0)
          fprintf (stderr, "churn: FAIL: acknowledged write of cycle %"
                   PRIu64 " at %" PRIu64 "+%u: byte %" PRIu64 " is 0x%02x,"
                   " not 0x%02x\n", cycle, off, len, off + k, img[off + k],
                   val);
      }
  }
  fclose (jf);
  for (uint64_t sl = 0; sl < slots; sl++)
    for (int j = 0; j < NWRITES; j++) {
      uint64_t o = write_off (sl, j), nz = 0;
      if (acked[o])
        continue;
      for (unsigned k = 0; k < WLEN; k++)
        nz += img[o + k] != 0;
      landed += nz == WLEN;
      partial += nz > 0 && nz < WLEN;
    }
  /* Bytes outside every write must still be zero; bytes of a write hold 0
   * or its cycle's value.
   */
  for (uint64_t p = 0; p < slots * SLOT; p++) {
    uint64_t sl = p / SLOT, in = p % SLOT;
    bool inside = in >= 7 && (in - 7) % 1000 < WLEN && (in - 7) / 1000 < NWRITES;
    if (img[p] != 0 && (!inside || img[p] != slot_value (sl))) {
      if (bad++ == 0)
        fprintf (stderr, "churn: FAIL: byte %" PRIu64 " is 0x%02x: nobody"
                 " wrote that there\n", p, img[p]);
    }
  }
  printf ("verify: %" PRIu64 " acknowledged writes intact%s; of the"
          " unacknowledged ones %" PRIu64 " landed whole, %" PRIu64
          " in part\n", nacked, bad ? " - NOT" : "", landed, partial);
  return bad ? EXIT_SERVER_BUG : 0;
}

static void
usage (void)
{
  fprintf (stderr, "usage: churn -p PID -m graceful|abrupt -f FIRST -n CYCLES"
           " [-w WARMUP] [-k] -j JOURNAL SOCKET\n"
           "       churn -v -j JOURNAL -n SLOTS SOCKET\n");
  exit (EXIT_HARD_ERROR);
}

int
main (int argc, char *argv[])
{
  const char *mode = NULL, *journal = NULL;
  uint64_t first = 0, cycles = 0, warmup = 100;
  bool verify = false, keeps = false;
  int pid = 0, c;

  progname = "churn";
  while ((c = getopt (argc, argv, "p:m:f:n:w:j:vk")) != -1) {
    switch (c) {
    case 'p': pid = parse_u64 (optarg, "-p"); break;
    case 'm': mode = optarg; break;
    case 'f': first = parse_u64 (optarg, "-f"); break;
    case 'n': cycles = parse_u64 (optarg, "-n"); break;
    case 'w': warmup = parse_u64 (optarg, "-w"); break;
    case 'j': journal = optarg; break;
    case 'v': verify = true; break;
    case 'k': keeps = true; break;
    default: usage ();
    }
  }
  if (optind != argc - 1 || !journal || cycles == 0)
    usage ();
  if (verify)
    return do_verify (argv[optind], journal, cycles);
  if (!pid || !mode || (strcmp (mode, "graceful") && strcmp (mode, "abrupt")))
    usage ();
  return do_churn (argv[optind], pid, strcmp (mode, "abrupt") == 0, first,
                   cycles, warmup, journal, keeps);
}
