/* SPDX-License-Identifier: BSD-3-Clause */
/* crash_io: the client side of the crash-consistency test (crash.sh).
 *
 *   crash_io run -s SEED -j JOURNAL [-m MODE] [-c CONNS] [-q DEPTH] SOCKET
 *       Writes until the server dies: CONNS connections, DEPTH requests in
 *       flight on each, writes of 1 byte .. 256 KiB at aligned and
 *       unaligned offsets (many near the image's unaligned tail), one in
 *       eight with FUA, and a flush now and then on a random connection.
 *       MODE "flush" sends no FUA writes, "fua" no flushes, "mixed" (the
 *       default) both: a FUA write's sync makes every earlier write
 *       durable too, so only rounds that rely on one mechanism alone show
 *       that mechanism missing.
 *       Prints "running" once connected.  When the connections die it
 *       writes JOURNAL: every write (range, FUA, whether and when it was
 *       acknowledged) and every flush (when it was sent, whether it
 *       completed).  Exits 0 after a server death, 1 if the server
 *       answered a request with an error while alive.
 *
 *   crash_io verify -s SEED -j JOURNAL -b BASE SOCKET
 *       Reads the whole export (the restarted server) and checks it
 *       against BASE (the image before the run) and the journal.
 *
 * The rule checked, byte by byte.  A write is *durable* if it was
 * acknowledged with FUA, or acknowledged before a flush was sent that then
 * completed (on any connection: pdio advertises multi-conn, which promises
 * exactly that).  Writes that overlap are never in flight together, so the
 * writes covering a byte are ordered.  If D is the last durable write
 * covering it, the byte must hold D's value or the value of a write to it
 * issued after D (one acknowledged but not yet flushed, or in flight at the
 * kill: the disk may have kept any of them, or any part of one - torn
 * within its own range).  A byte no durable write covers must hold BASE's
 * value or that of one of its writes.  So a lost durable write, a write
 * that landed outside its range, or a stale read-modify-write shows as a
 * byte with a value nobody wrote there.  Data comes from (seed, write id,
 * position), so a byte of one write cannot pass for another's.
 *
 * Exit status: 0 pass, 1 the server lost or corrupted data, 99 the test
 * could not run.
 */
#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

struct wr {
  uint64_t off, len;
  int conn;
  bool fua;
  bool done;                    /* the callback ran */
  int err;                      /* its error, 0 = acknowledged */
  uint64_t issue_seq, ack_seq;
};

struct fl {
  int conn;
  bool done;
  int err;
  uint64_t issue_seq, ack_seq;
};

static uint64_t seed;
static uint64_t seq;            /* one clock for issues and completions */
static struct wr *w;
static size_t nw, w_cap;
static struct fl *f;
static size_t nf, f_cap;

/* Byte p of write id's data. */
static inline uint8_t
data_byte (uint64_t id, uint64_t p)
{
  struct rng r = { seed ^ (id * UINT64_C (0xd6e8feb86659fd93))
                   ^ ((p >> 3) * UINT64_C (0xa0761d6478bd642f)) };
  return rng_next (&r) >> (8 * (p & 7));
}

static void
fill_data (uint64_t id, uint8_t *buf, uint64_t off, uint64_t len)
{
  for (uint64_t i = 0; i < len; i++)
    buf[i] = data_byte (id, off + i);
}

/* ---- run ----------------------------------------------------------------- */

struct cmd {
  bool is_write;
  size_t idx;                   /* into w[] or f[] */
  uint8_t *buf;
};

static int
on_complete (void *opaque, int *error)
{
  struct cmd *c = opaque;

  if (c->is_write) {
    w[c->idx].done = true;
    w[c->idx].err = *error;
    w[c->idx].ack_seq = ++seq;
  }
  else {
    f[c->idx].done = true;
    f[c->idx].err = *error;
    f[c->idx].ack_seq = ++seq;
  }
  free (c->buf);
  free (c);
  return 1;
}

static uint64_t size;

static void
pick_range (struct rng *r, uint64_t *offp, uint64_t *lenp)
{
  uint64_t p = rng_below (r, 100), len, off;

  if (p < 10)
    len = rng_range (r, 1, 64);
  else if (p < 40)
    len = rng_range (r, 1, 8192);
  else if (p < 70)
    len = 512 * rng_range (r, 1, 256);
  else
    len = 4096 * rng_range (r, 1, 64);
  if (len > size)
    len = size;
  p = rng_below (r, 100);
  if (p < 30)
    off = 4096 * rng_below (r, size / 4096 + 1);
  else if (p < 50)
    off = 512 * rng_below (r, size / 512 + 1);
  else if (p < 90)
    off = rng_below (r, size);
  else
    off = size - len - (rng_below (r, 2) ? 0 : rng_below (r, 4096));
  if (off >= size)
    off = size - 1;
  if (len > size - off)
    len = size - off;
  *offp = off;
  *lenp = len;
}

/* Is a write overlapping [off, off+len) still in flight? */
static bool
conflicts (uint64_t off, uint64_t len, size_t first_open)
{
  for (size_t i = first_open; i < nw; i++)
    if (!w[i].done && off < w[i].off + w[i].len && w[i].off < off + len)
      return true;
  return false;
}

static void
write_journal (const char *path, int nconns)
{
  FILE *fp = fopen (path, "w");

  if (!fp)
    hard_error ("create %s: %m", path);
  fprintf (fp, "crash_io seed %" PRIu64 " size %" PRIu64 " conns %d writes %zu"
           " flushes %zu\n", seed, size, nconns, nw, nf);
  for (size_t i = 0; i < nw; i++)
    fprintf (fp, "W %zu %" PRIu64 " %" PRIu64 " %d %d %d %d %" PRIu64 " %"
             PRIu64 "\n", i, w[i].off, w[i].len, w[i].conn, w[i].fua,
             w[i].done, w[i].err, w[i].issue_seq, w[i].ack_seq);
  for (size_t i = 0; i < nf; i++)
    fprintf (fp, "F %zu %d %d %d %" PRIu64 " %" PRIu64 "\n", i, f[i].conn,
             f[i].done, f[i].err, f[i].issue_seq, f[i].ack_seq);
  if (fclose (fp) == EOF)
    hard_error ("write %s: %m", path);
}

/* The errors a command gets when the connection dies under it. */
static bool
death_errno (int e)
{
  return e == ENOTCONN || e == ECONNRESET || e == EPIPE || e == ESHUTDOWN ||
    e == ECONNABORTED || e == EIO;
}

static int
do_run (const char *sock, const char *journal, int nconns, int depth,
        bool use_flush, bool use_fua)
{
  struct nbd_handle *h[MAX_HANDLES];
  bool dead[MAX_HANDLES] = { false };
  struct rng r = { seed };
  size_t first_open = 0;        /* writes before this are all done */
  int ndead = 0, server_errors = 0;
  time_t start = time (NULL), died = 0;

  for (int i = 0; i < nconns; i++)
    h[i] = connect_socket (sock);
  size = nbd_get_size (h[0]);
  if ((int64_t) size <= 0)
    nbd_fail ("nbd_get_size");
  if (nbd_can_fua (h[0]) != 1 || nbd_can_flush (h[0]) != 1 ||
      (nconns > 1 && nbd_can_multi_conn (h[0]) != 1))
    fail ("the server does not advertise FUA, flush and multi-conn");
  printf ("running: seed=%" PRIu64 " size=%" PRIu64 " conns=%d depth=%d\n",
          seed, size, nconns, depth);
  fflush (stdout);

  for (;;) {
    for (int c = 0; c < nconns; c++)
      if (!dead[c] && (nbd_aio_is_dead (h[c]) || nbd_aio_is_closed (h[c]))) {
        dead[c] = true;
        if (ndead++ == 0) {
          died = time (NULL);
          fprintf (stderr, "crash_io: conn %d died\n", c);
        }
      }
    if (ndead == nconns)
      break;

    /* Fill every live connection up to depth. */
    for (int c = 0; c < nconns && ndead == 0; c++) {
      while (nbd_aio_in_flight (h[c]) < depth) {
        nbd_completion_callback cb = { .callback = on_complete };
        struct cmd *cmd = xcalloc (1, sizeof *cmd);
        int64_t cookie;

        cb.user_data = cmd;
        if (use_flush && rng_below (&r, 100) < 4) {
          if (nf == f_cap) {
            f_cap = f_cap ? 2 * f_cap : 1024;
            f = realloc (f, f_cap * sizeof *f);
            if (!f)
              hard_error ("out of memory");
          }
          f[nf] = (struct fl) { .conn = c, .issue_seq = ++seq };
          cmd->idx = nf++;
          cookie = nbd_aio_flush (h[c], cb, 0);
        }
        else {
          uint64_t off, len;
          int tries = 0;

          do
            pick_range (&r, &off, &len);
          while (conflicts (off, len, first_open) && ++tries < 20);
          if (tries == 20) {
            free (cmd);
            break;              /* busy: let some complete first */
          }
          if (nw == w_cap) {
            w_cap = w_cap ? 2 * w_cap : 4096;
            w = realloc (w, w_cap * sizeof *w);
            if (!w)
              hard_error ("out of memory");
          }
          w[nw] = (struct wr) { .off = off, .len = len, .conn = c,
                                .fua = use_fua && rng_below (&r, 8) == 0 };
          cmd->is_write = true;
          cmd->idx = nw;
          cmd->buf = xmalloc (len);
          fill_data (nw, cmd->buf, off, len);
          w[nw].issue_seq = ++seq;
          nw++;
          cookie = nbd_aio_pwrite (h[c], cmd->buf, len, off, cb,
                                   w[nw-1].fua ? LIBNBD_CMD_FLAG_FUA : 0);
        }
        if (cookie == -1) {
          /* The connection is already gone: nothing was sent. */
          fprintf (stderr, "crash_io: conn %d: %s\n", c, nbd_get_error ());
          if (cmd->is_write)
            w[cmd->idx].done = true, w[cmd->idx].err = ENOTCONN;
          else
            f[cmd->idx].done = true, f[cmd->idx].err = ENOTCONN;
          free (cmd->buf);
          free (cmd);
          dead[c] = true;
          if (ndead++ == 0)
            died = time (NULL);
          break;
        }
      }
    }
    while (first_open < nw && w[first_open].done)
      first_open++;

    /* One round of poll over the live connections. */
    struct pollfd fds[MAX_HANDLES];
    for (int c = 0; c < nconns; c++) {
      unsigned dir = dead[c] ? 0 : nbd_aio_get_direction (h[c]);
      fds[c].fd = dead[c] ? -1 : nbd_aio_get_fd (h[c]);
      fds[c].events = (dir & LIBNBD_AIO_DIRECTION_READ ? POLLIN : 0) |
        (dir & LIBNBD_AIO_DIRECTION_WRITE ? POLLOUT : 0);
      fds[c].revents = 0;
    }
    if (poll (fds, nconns, 1000) == -1 && errno != EINTR)
      hard_error ("poll: %m");
    for (int c = 0; c < nconns; c++) {
      int rr = 0;
      if (dead[c] || !fds[c].revents)
        continue;
      if (fds[c].revents & (POLLIN | POLLHUP | POLLERR))
        rr = nbd_aio_notify_read (h[c]);
      else if (fds[c].revents & POLLOUT)
        rr = nbd_aio_notify_write (h[c]);
      if (rr == -1 || nbd_aio_is_dead (h[c]) || nbd_aio_is_closed (h[c])) {
        dead[c] = true;
        if (ndead++ == 0) {
          died = time (NULL);
          fprintf (stderr, "crash_io: conn %d died: %s\n", c,
                   nbd_get_error () ? nbd_get_error () : "closed");
        }
      }
    }
    if (ndead == nconns)
      break;
    if (ndead && time (NULL) - died > 10)
      hard_error ("the other connections outlived the first by 10 s");
    if (!ndead && time (NULL) - start > 60)
      hard_error ("the server was not killed within 60 s");
  }

  /* Everything still in flight died with the server. */
  for (int c = 0; c < nconns; c++)
    nbd_close (h[c]);

  uint64_t acked = 0, fua_acked = 0, flushed = 0, lost = 0;
  for (size_t i = 0; i < nw; i++) {
    if (w[i].done && w[i].err == 0) {
      acked++;
      fua_acked += w[i].fua;
    }
    else if (w[i].done && !death_errno (w[i].err)) {
      fprintf (stderr, "crash_io: FAIL: write %zu (%" PRIu64 "+%" PRIu64
               ") failed while the server was alive: %s\n", i, w[i].off,
               w[i].len, strerror (w[i].err));
      server_errors++;
    }
    else
      lost++;
  }
  for (size_t i = 0; i < nf; i++) {
    if (f[i].done && f[i].err == 0)
      flushed++;
    else if (f[i].done && !death_errno (f[i].err)) {
      fprintf (stderr, "crash_io: FAIL: flush %zu failed: %s\n", i,
               strerror (f[i].err));
      server_errors++;
    }
  }
  printf ("killed after %zu writes issued: %" PRIu64 " acknowledged (%"
          PRIu64 " FUA), %" PRIu64 " unanswered; %zu flushes issued, %"
          PRIu64 " completed\n", nw, acked, fua_acked, lost, nf, flushed);
  write_journal (journal, nconns);
  return server_errors ? EXIT_SERVER_BUG : 0;
}

/* ---- verify -------------------------------------------------------------- */

static void
read_journal (const char *path)
{
  FILE *fp = fopen (path, "r");
  char line[512];
  uint64_t jseed;
  int conns;

  if (!fp)
    hard_error ("open %s: %m", path);
  if (!fgets (line, sizeof line, fp) ||
      sscanf (line, "crash_io seed %" SCNu64 " size %" SCNu64 " conns %d"
              " writes %zu flushes %zu", &jseed, &size, &conns, &nw, &nf) != 5)
    hard_error ("%s: bad header", path);
  if (jseed != seed)
    hard_error ("%s was written with seed %" PRIu64 ", not %" PRIu64, path,
                jseed, seed);
  w = xcalloc (nw, sizeof *w);
  f = xcalloc (nf, sizeof *f);
  for (size_t i = 0; i < nw; i++) {
    size_t id;
    int fua, done;
    if (!fgets (line, sizeof line, fp) ||
        sscanf (line, "W %zu %" SCNu64 " %" SCNu64 " %d %d %d %d %" SCNu64
                " %" SCNu64, &id, &w[i].off, &w[i].len, &w[i].conn, &fua,
                &done, &w[i].err, &w[i].issue_seq, &w[i].ack_seq) != 9 ||
        id != i)
      hard_error ("%s: bad write line %zu", path, i);
    w[i].fua = fua;
    w[i].done = done;
  }
  for (size_t i = 0; i < nf; i++) {
    size_t id;
    int done;
    if (!fgets (line, sizeof line, fp) ||
        sscanf (line, "F %zu %d %d %d %" SCNu64 " %" SCNu64, &id, &f[i].conn,
                &done, &f[i].err, &f[i].issue_seq, &f[i].ack_seq) != 6 ||
        id != i)
      hard_error ("%s: bad flush line %zu", path, i);
    f[i].done = done;
  }
  fclose (fp);
}

static int
do_verify (const char *sock, const char *journal, const char *base_path)
{
  read_journal (journal);

  uint8_t *base = xmalloc (size), *got = xmalloc (size);
  load_image (base_path, base, size);

  struct nbd_handle *h = connect_socket (sock);
  if ((uint64_t) nbd_get_size (h) != size)
    fail ("the restarted export is %" PRId64 " bytes, was %" PRIu64,
          nbd_get_size (h), size);
  for (uint64_t off = 0; off < size; off += 1 << 20) {
    uint64_t n = size - off < (1 << 20) ? size - off : (1 << 20);
    if (nbd_pread (h, got + off, n, off, 0) == -1)
      nbd_fail ("nbd_pread");
  }
  disconnect (h);

  /* The last flush sent before each write's acknowledgement... rather:
   * a write is durable if some completed flush was sent after it was
   * acknowledged.  last_flush_issue = the latest issue time of a
   * completed flush.
   */
  uint64_t last_flush = 0;
  size_t flushes_done = 0;
  for (size_t i = 0; i < nf; i++)
    if (f[i].done && f[i].err == 0) {
      flushes_done++;
      if (f[i].issue_seq > last_flush)
        last_flush = f[i].issue_seq;
    }

  bool *durable = xcalloc (nw, sizeof *durable);
  size_t ndurable = 0, nfua = 0, nacked = 0;
  for (size_t i = 0; i < nw; i++) {
    bool acked = w[i].done && w[i].err == 0;
    nacked += acked;
    if (acked && w[i].fua) {
      durable[i] = true;
      nfua++;
    }
    else if (acked && w[i].ack_seq < last_flush)
      durable[i] = true;
    ndurable += durable[i];
  }

  /* dur[p]: the last durable write covering p (-1: none, BASE's value);
   * last[p]: the last write of all.
   */
  int32_t *dur = xmalloc (size * sizeof *dur);
  int32_t *last = xmalloc (size * sizeof *last);
  for (uint64_t p = 0; p < size; p++)
    dur[p] = last[p] = -1;
  for (size_t i = 0; i < nw; i++)
    for (uint64_t p = w[i].off; p < w[i].off + w[i].len; p++) {
      last[p] = i;
      if (durable[i])
        dur[p] = i;
    }

  uint8_t *ok = xcalloc (size, 1);
  for (uint64_t p = 0; p < size; p++)
    ok[p] = got[p] == (dur[p] < 0 ? base[p] : data_byte (dur[p], p));
  for (size_t i = 0; i < nw; i++)
    for (uint64_t p = w[i].off; p < w[i].off + w[i].len; p++)
      if (!ok[p] && (int32_t) i > dur[p] && got[p] == data_byte (i, p))
        ok[p] = 1;

  uint64_t bad = 0, first_bad = 0;
  for (uint64_t p = 0; p < size; p++)
    if (!ok[p] && bad++ == 0)
      first_bad = p;

  /* How each write ended up, judged on the bytes no later write covers. */
  size_t cls[3][3] = { { 0 } };    /* [durable/acked/in flight][new/old/torn] */
  for (size_t i = 0; i < nw; i++) {
    uint64_t mine = 0, isnew = 0;
    for (uint64_t p = w[i].off; p < w[i].off + w[i].len; p++)
      if (last[p] == (int32_t) i) {
        mine++;
        isnew += got[p] == data_byte (i, p);
      }
    if (mine == 0)
      continue;
    int k = durable[i] ? 0 : (w[i].done && w[i].err == 0) ? 1 : 2;
    /* Old data matches new by chance in 1 byte of 256. */
    cls[k][isnew == mine ? 0 : isnew <= mine / 64 ? 1 : 2]++;
  }
  printf ("verify: %zu writes, %zu acknowledged, %zu durable (%zu by FUA, the"
          " rest by %zu completed flushes)\n", nw, nacked, ndurable, nfua,
          flushes_done);
  printf ("verify: still visible - durable: %zu new, %zu old, %zu torn;"
          " acknowledged, not flushed: %zu new, %zu old, %zu torn;"
          " in flight at the kill: %zu new, %zu old, %zu torn\n",
          cls[0][0], cls[0][1], cls[0][2], cls[1][0], cls[1][1], cls[1][2],
          cls[2][0], cls[2][1], cls[2][2]);

  if (bad) {
    uint64_t p = first_bad;
    fprintf (stderr, "crash_io: FAIL: %" PRIu64 " bytes hold a value no"
             " allowed write put there; first at offset %" PRIu64
             ": got 0x%02x, base 0x%02x\n", bad, p, got[p], base[p]);
    if (dur[p] >= 0) {
      const struct wr *d = &w[dur[p]];
      fprintf (stderr, "  it should hold durable write #%d (%" PRIu64 "+%"
               PRIu64 "%s, acknowledged at %" PRIu64 ", last completed flush"
               " sent at %" PRIu64 "): 0x%02x\n", dur[p], d->off, d->len,
               d->fua ? " FUA" : "", d->ack_seq, last_flush,
               data_byte (dur[p], p));
    }
    fprintf (stderr, "  writes covering it (oldest first):\n");
    for (size_t i = 0; i < nw; i++)
      if (p >= w[i].off && p < w[i].off + w[i].len)
        fprintf (stderr, "    #%zu conn %d %" PRIu64 "+%" PRIu64 "%s %s%s"
                 " value 0x%02x\n", i, w[i].conn, w[i].off, w[i].len,
                 w[i].fua ? " FUA" : "",
                 w[i].done && !w[i].err ? "acknowledged" : "in flight",
                 durable[i] ? " durable" : "", data_byte (i, p));
    fprintf (stderr, "  replay: seed %" PRIu64 "\n", seed);
    return EXIT_SERVER_BUG;
  }
  if (cls[0][1] || cls[0][2])
    fail ("a durable write is not intact although every byte passed");
  printf ("verify: PASS, every durable write intact, nothing outside the"
          " written ranges changed\n");
  return 0;
}

static void
usage (void)
{
  fprintf (stderr, "usage: crash_io run -s SEED -j JOURNAL [-m MODE] [-c CONNS]"
           " [-q DEPTH] SOCKET\n"
           "       crash_io verify -s SEED -j JOURNAL -b BASE SOCKET\n");
  exit (EXIT_HARD_ERROR);
}

int
main (int argc, char *argv[])
{
  const char *journal = NULL, *base = NULL, *wmode = "mixed";
  int nconns = 4, depth = 8, c;
  bool have_seed = false;

  progname = "crash_io";
  if (argc < 2)
    usage ();
  const char *mode = argv[1];
  optind = 2;
  while ((c = getopt (argc, argv, "s:j:b:m:c:q:")) != -1) {
    switch (c) {
    case 's': seed = parse_u64 (optarg, "-s"); have_seed = true; break;
    case 'j': journal = optarg; break;
    case 'b': base = optarg; break;
    case 'm': wmode = optarg; break;
    case 'c': nconns = parse_u64 (optarg, "-c"); break;
    case 'q': depth = parse_u64 (optarg, "-q"); break;
    default: usage ();
    }
  }
  if (optind != argc - 1 || !have_seed || !journal || nconns < 1 ||
      nconns > MAX_HANDLES || depth < 1)
    usage ();
  if (strcmp (mode, "run") == 0) {
    bool fl = strcmp (wmode, "fua") != 0, fu = strcmp (wmode, "flush") != 0;

    if (strcmp (wmode, "mixed") && strcmp (wmode, "fua") &&
        strcmp (wmode, "flush"))
      usage ();
    return do_run (argv[optind], journal, nconns, depth, fl, fu);
  }
  if (strcmp (mode, "verify") == 0 && base)
    return do_verify (argv[optind], journal, base);
  usage ();
}
