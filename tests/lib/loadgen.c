/* SPDX-License-Identifier: BSD-3-Clause */
/* loadgen: many concurrent reads and writes over several connections,
 * optionally checked byte for byte against a shadow of the image.
 *
 *   loadgen -i IMAGE [-s SEED] [-c CONNS] [-q DEPTH] [-n OPS]
 *           [-l MIN:MAX] [-w WRITE_PERCENT] [-H OFF,OFF,...] [-V] SOCKET
 *
 * Offsets and lengths are random (so almost never aligned); with -H, half
 * the requests straddle one of the given offsets (the start of the image's
 * partial last block, its end, the edges of holes, bounce chunk
 * boundaries: where stale memory would show first).
 *
 * -V checks every read against the shadow (the image file's content at the
 * start, plus each write once it completed).  A write is never in flight
 * together with a request it overlaps, so every byte's value is known.  A
 * wrong byte fails the run with its offset, what was expected and what was
 * read, and says whether the wrong bytes are all 0xa5: the canary pdio
 * fills free bounce pages with under -D pdio.canary=1.  At the end the
 * whole export is read back too.
 *
 * Without -V, nothing is checked (the data is still fresh pseudo-random
 * bytes): that is the memory test's load, where overlaps do not matter.
 * Exit 0 ok, 1 wrong data or a failed request, 99 the test could not run.
 */
#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

#define MAX_HOT 64

struct op {
  struct completion c;          /* first: the callback's user_data */
  bool busy, write;
  bool pending;                 /* chosen, waiting for a conflicting op */
  int conn;
  uint64_t off, len;
  uint8_t *buf;
};

static struct {
  uint64_t size;
  uint8_t *shadow;
  bool verify;
  uint64_t hot[MAX_HOT];
  int nhot;
  struct op *ops;               /* conns * depth slots */
  int nslots;
  uint64_t bad_reads, canary_reads;
  uint64_t reads, writes, bytes;
} g;

/* Does [off, off+len) overlap an in-flight op that conflicts? */
static bool
conflicts (uint64_t off, uint64_t len, bool write)
{
  for (int i = 0; i < g.nslots; i++) {
    struct op *o = &g.ops[i];

    if (!o->busy || !(write || o->write))
      continue;
    if (off < o->off + o->len && o->off < off + len)
      return true;
  }
  return false;
}

static void
pick (struct rng *r, uint64_t lo, uint64_t hi, uint64_t *off, uint64_t *len)
{
  *len = rng_range (r, lo, hi);
  if (*len > g.size)
    *len = g.size;
  if (g.nhot && rng_below (r, 2) == 0) {
    uint64_t h = g.hot[rng_below (r, g.nhot)];
    uint64_t back = rng_below (r, *len);

    *off = h > back ? h - back : 0;
  }
  else
    *off = rng_below (r, g.size - *len + 1);
  if (*off + *len > g.size)
    *off = g.size - *len;
}

static void
check_read (const struct op *op)
{
  uint64_t bad = 0, canary = 0, first = 0;

  for (uint64_t i = 0; i < op->len; i++)
    if (op->buf[i] != g.shadow[op->off + i]) {
      if (bad == 0)
        first = i;
      bad++;
      canary += op->buf[i] == 0xa5;
    }
  if (bad == 0)
    return;
  g.bad_reads++;
  if (canary == bad)
    g.canary_reads++;
  if (g.bad_reads <= 5) {
    fprintf (stderr, "%s: read of [%" PRIu64 ", +%" PRIu64 ") on "
             "connection %d: %" PRIu64 " bytes wrong, first at %" PRIu64
             "%s\n", progname, op->off, op->len, op->conn, bad,
             op->off + first, canary == bad
             ? " -- every wrong byte is 0xa5, the bounce canary" : "");
    report_mismatch ("  ", op->off, g.shadow + op->off, op->buf, op->len);
  }
}

static double
now (void)
{
  struct timespec ts;

  clock_gettime (CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

int
main (int argc, char *argv[])
{
  const char *image = NULL;
  uint64_t seed = 0, nops = 1000, lo = 1, hi = 65536;
  int nconns = 1, depth = 1, wpct = 50, c;
  struct nbd_handle *h[MAX_HANDLES];
  struct rng r;
  uint64_t issued = 0, completed = 0;
  struct stat st;
  double t0;

  progname = "loadgen";
  while ((c = getopt (argc, argv, "i:s:c:q:n:l:w:H:V")) != -1)
    switch (c) {
    case 'i': image = optarg; break;
    case 's': seed = parse_u64 (optarg, "seed"); break;
    case 'c': nconns = parse_u64 (optarg, "connections"); break;
    case 'q': depth = parse_u64 (optarg, "depth"); break;
    case 'n': nops = parse_u64 (optarg, "ops"); break;
    case 'w': wpct = parse_u64 (optarg, "write percent"); break;
    case 'V': g.verify = true; break;
    case 'l': {
      char *colon = strchr (optarg, ':');
      if (!colon)
        hard_error ("-l MIN:MAX");
      *colon = '\0';
      lo = parse_u64 (optarg, "min length");
      hi = parse_u64 (colon + 1, "max length");
      break;
    }
    case 'H': {
      char *save, *w;
      for (w = strtok_r (optarg, ",", &save); w && g.nhot < MAX_HOT;
           w = strtok_r (NULL, ",", &save))
        g.hot[g.nhot++] = parse_u64 (w, "hot offset");
      break;
    }
    default:
      hard_error ("usage: see the comment at the top of loadgen.c");
    }
  if (!image || optind + 1 != argc || nconns < 1 || nconns > MAX_HANDLES ||
      depth < 1 || lo < 1 || hi < lo || wpct > 100)
    hard_error ("usage: see the comment at the top of loadgen.c");
  if (seed == 0)
    seed = seed_from_clock ();
  printf ("seed %" PRIu64 "\n", seed);
  r.s = seed;

  if (stat (image, &st) == -1)
    hard_error ("%s: %m", image);
  g.size = st.st_size;
  if (g.verify) {
    g.shadow = xmalloc (g.size);
    load_image (image, g.shadow, g.size);
  }
  for (int i = 0; i < nconns; i++) {
    h[i] = connect_socket (argv[optind]);
    expect_export_size (h[i], g.size);
  }
  track_handles (h, nconns);
  g.nslots = nconns * depth;
  g.ops = xcalloc (g.nslots, sizeof *g.ops);
  for (int i = 0; i < g.nslots; i++) {
    g.ops[i].conn = i / depth;
    g.ops[i].buf = xmalloc (hi < g.size ? hi : g.size);
  }

  t0 = now ();
  while (completed < nops) {
    /* Retire what completed. */
    for (int i = 0; i < g.nslots; i++) {
      struct op *op = &g.ops[i];

      if (!op->busy || !op->c.done)
        continue;
      if (op->c.err)
        fail ("%s of [%" PRIu64 ", +%" PRIu64 ") failed: %s",
              op->write ? "write" : "read", op->off, op->len,
              strerror (op->c.err));
      if (g.verify) {
        if (op->write)
          memcpy (g.shadow + op->off, op->buf, op->len);
        else
          check_read (op);
      }
      g.bytes += op->len;
      op->busy = false;
      completed++;
    }
    /* Fill free slots. */
    for (int i = 0; i < g.nslots && issued < nops; i++) {
      struct op *op = &g.ops[i];
      nbd_completion_callback cb = { .callback = note_completion, .user_data = op };
      bool write;
      int64_t cookie;

      if (op->busy)
        continue;
      /* A request that overlaps one in flight waits for it rather than
       * being moved elsewhere: moving would starve the busiest places,
       * which are the interesting ones.
       */
      if (!op->pending) {
        op->write = rng_below (&r, 100) < (uint64_t) wpct;
        pick (&r, lo, hi, &op->off, &op->len);
        op->pending = true;
      }
      write = op->write;
      if (g.verify && conflicts (op->off, op->len, write))
        continue;
      op->pending = false;
      op->c.done = false;
      op->c.err = 0;
      if (write) {
        rng_fill (&r, op->buf, op->len);
        cookie = nbd_aio_pwrite (h[op->conn], op->buf, op->len, op->off, cb,
                                 0);
        g.writes++;
      }
      else {
        cookie = nbd_aio_pread (h[op->conn], op->buf, op->len, op->off, cb,
                                0);
        g.reads++;
      }
      if (cookie == -1)
        nbd_fail (write ? "nbd_aio_pwrite" : "nbd_aio_pread");
      op->busy = true;
      issued++;
    }
    if (in_flight (h, nconns) > 0)
      poll_handles (h, nconns, 120);
  }

  printf ("%" PRIu64 " reads, %" PRIu64 " writes, %.1f MiB in %.2f s\n",
          g.reads, g.writes, g.bytes / 1048576.0, now () - t0);
  if (g.verify) {
    const uint64_t piece = 16 << 20;
    uint8_t *buf = xmalloc (piece);

    for (uint64_t at = 0; at < g.size; at += piece) {
      uint64_t len = g.size - at < piece ? g.size - at : piece;
      struct op op = { .off = at, .len = len, .buf = buf, .conn = 0 };

      if (nbd_pread (h[0], buf, len, at, 0) == -1)
        nbd_fail ("final read");
      check_read (&op);
    }
    free (buf);
    if (g.bad_reads)
      fail ("%" PRIu64 " reads returned wrong data (%" PRIu64 " of them "
            "only 0xa5 canary bytes); seed %" PRIu64, g.bad_reads,
            g.canary_reads, seed);
    printf ("every byte read equals the shadow (%" PRIu64 " reads "
            "checked)\n", g.reads + 1);
  }
  for (int i = 0; i < nconns; i++)
    disconnect (h[i]);
  return 0;
}
