/* SPDX-License-Identifier: BSD-3-Clause */
/* interleave_io: several connections write disjoint bytes of the same
 * blocks at the same time; no write may be lost.
 *
 *   interleave_io -i IMAGE [-o SHADOW_OUT] [-s SEED] [-c CONNS] [-q DEPTH]
 *                 [-n WRITES] [-R MAXRUN] SOCKET
 *
 * The image is cut into runs of 1..MAXRUN bytes and each run is given to
 * one connection (never the same one twice in a row), so every 512 B and
 * 4 KiB block belongs to several connections.  Each connection then keeps
 * DEPTH writes in flight, each inside one of its own runs (so 1..MAXRUN
 * bytes at any offset), plus some reads of its own bytes.  A connection
 * never has two overlapping requests in flight, and connections never
 * touch each other's bytes, so the final content is fully determined --
 * unless the server's read-modify-write of a shared block lets one
 * connection's write-back undo another's write, which is what this test
 * is for (the nbd project's integrity test does the same to servers).
 *
 * Every connection draws from its own random stream (seed + conn), so a
 * connection's requests are the same in every run with the same seed.
 * The whole export is read back and compared at checkpoints and at the
 * end; -o writes the expected image for a cmp after the server exits.
 */
#include <config.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

#define CHECKPOINTS 4

struct run {
  uint64_t off, len;
};

struct op {
  struct completion c;          /* first: the callback's user_data */
  int conn;
  bool is_write;
  uint32_t no;                  /* write number, 1-based; 0 for reads */
  uint64_t off, len;
  uint8_t *buf;
};

struct conn {
  struct rng rng;
  struct run *runs;
  size_t nruns, runs_cap;
  struct op **flight;           /* depth slots */
  struct op *next;              /* generated, waiting for a free range */
  uint64_t writes_left;
};

static struct {
  uint64_t seed, size;
  int nconns, depth;
  bool can_fua;
  struct nbd_handle *h[MAX_HANDLES];
  struct conn conn[MAX_HANDLES];
  uint8_t *shadow, *initial;
  uint8_t *owner;               /* connection that owns each byte */
  uint32_t *last_write;         /* latest completed write per byte */
  struct op *writes;            /* every write issued, with its bytes, for
                                   reports */
  uint32_t nwrites;
  uint64_t nreads, write_bytes, fua;
} t;

static void
add_run (int c, uint64_t off, uint64_t len)
{
  struct conn *cn = &t.conn[c];

  if (cn->nruns == cn->runs_cap) {
    cn->runs_cap = cn->runs_cap ? 2 * cn->runs_cap : 256;
    cn->runs = realloc (cn->runs, cn->runs_cap * sizeof *cn->runs);
    if (!cn->runs)
      hard_error ("out of memory");
  }
  cn->runs[cn->nruns++] = (struct run) { off, len };
  memset (t.owner + off, c, len);
}

/* Deal the image out in runs; half of them short so that even 512-byte
 * sectors are shared by several connections.
 */
static void
deal_runs (struct rng *r, uint64_t maxrun)
{
  int prev = -1;

  for (uint64_t off = 0; off < t.size; ) {
    uint64_t len = rng_below (r, 2) ? rng_range (r, 1, 64)
      : rng_range (r, 1, maxrun);
    int c = rng_below (r, t.nconns);
    if (t.nconns > 1 && c == prev)
      c = (c + 1) % t.nconns;
    if (len > t.size - off)
      len = t.size - off;
    add_run (c, off, len);
    prev = c;
    off += len;
  }
}

static struct op *
make_op (int c)
{
  struct conn *cn = &t.conn[c];
  struct op *op = xcalloc (1, sizeof *op);
  const struct run *run = &cn->runs[rng_below (&cn->rng, cn->nruns)];
  uint64_t a = rng_below (&cn->rng, run->len);

  op->conn = c;
  op->off = run->off + a;
  op->len = rng_range (&cn->rng, 1, run->len - a);
  op->buf = xmalloc (op->len);
  op->is_write = rng_below (&cn->rng, 5) != 0;
  if (op->is_write) {
    rng_fill (&cn->rng, op->buf, op->len);
    cn->writes_left--;
  }
  return op;
}

static void
fail_byte (uint64_t off, uint8_t got, const char *when)
{
  uint32_t w = t.last_write[off];

  fprintf (stderr, "%s: FAIL: seed %" PRIu64 ": %s: byte %" PRIu64
           " (block %" PRIu64 " of 4 KiB, owned by conn %d) is 0x%02x,"
           " expected 0x%02x\n", progname, t.seed, when, off, off / 4096,
           t.owner[off], got, t.shadow[off]);
  if (w) {
    const struct op *op = &t.writes[w - 1];
    uint32_t older = 0;

    fprintf (stderr, "  last write to it: #%" PRIu32 " conn %d off=%" PRIu64
             " len=%" PRIu64 "\n", w, op->conn, op->off, op->len);
    /* A write-back that undoes a write restores what the block held when
     * it was read: an earlier write's byte, or the initial one. */
    for (uint32_t i = w - 1; i >= 1 && older == 0; i--) {
      const struct op *o = &t.writes[i - 1];
      if (off >= o->off && off < o->off + o->len &&
          o->buf[off - o->off] == got)
        older = i;
    }
    if (older)
      fprintf (stderr, "  the byte has the value of the earlier write #%"
               PRIu32 " (write lost)\n", older);
    else if (got == t.initial[off])
      fprintf (stderr, "  the byte still has its initial value"
               " (write lost)\n");
  }
  else
    fprintf (stderr, "  never written: the initial image had 0x%02x\n",
             t.initial[off]);
  fprintf (stderr, "  replay with -s %" PRIu64 "\n", t.seed);
  fail_exit (EXIT_SERVER_BUG);
}

static void
check (const uint8_t *got, uint64_t off, uint64_t len, const char *when)
{
  int64_t first = report_mismatch (when, off, t.shadow + off, got, len);

  if (first >= 0)
    fail_byte (off + first, got[first], when);
}

static void
complete (struct op *op)
{
  if (op->c.err)
    fail ("seed %" PRIu64 ": conn %d %s off=%" PRIu64 " len=%" PRIu64
          " failed: %s", t.seed, op->conn, op->is_write ? "write" : "read",
          op->off, op->len, strerror (op->c.err));
  if (op->is_write) {
    memcpy (t.shadow + op->off, op->buf, op->len);
    for (uint64_t i = 0; i < op->len; i++)
      t.last_write[op->off + i] = op->no;
  }
  else {
    check (op->buf, op->off, op->len, "read during the writes");
    free (op->buf);             /* a write's stays in t.writes */
  }
  free (op);
}

static void
progress (void)
{
  poll_handles (t.h, t.nconns, 60);
  for (int c = 0; c < t.nconns; c++)
    for (int i = 0; i < t.depth; i++) {
      struct op *op = t.conn[c].flight[i];
      if (op && op->c.done) {
        t.conn[c].flight[i] = NULL;
        complete (op);
      }
    }
}

/* A free slot on the connection, or -1 if it is busy with op's range or
 * full.  Only the connection's own requests can overlap op.
 */
static int
free_slot (const struct op *op)
{
  struct conn *cn = &t.conn[op->conn];
  int slot = -1;

  for (int i = 0; i < t.depth; i++) {
    const struct op *q = cn->flight[i];
    if (!q)
      slot = i;
    else if (op->off < q->off + q->len && q->off < op->off + op->len)
      return -1;
  }
  return slot;
}

static void
issue (struct op *op, int slot)
{
  nbd_completion_callback cb = { .callback = note_completion, .user_data = op };
  struct nbd_handle *h = t.h[op->conn];
  int64_t cookie;

  if (op->is_write) {
    uint32_t flags = 0;
    /* Draw even without FUA, so the sequence does not depend on it. */
    if (rng_below (&t.conn[op->conn].rng, 8) == 0 && t.can_fua) {
      flags = LIBNBD_CMD_FLAG_FUA;
      t.fua++;
    }
    op->no = ++t.nwrites;
    t.writes[op->no - 1] = (struct op) {
      .conn = op->conn, .off = op->off, .len = op->len, .buf = op->buf,
    };
    t.write_bytes += op->len;
    cookie = nbd_aio_pwrite (h, op->buf, op->len, op->off, cb, flags);
  }
  else {
    t.nreads++;
    cookie = nbd_aio_pread (h, op->buf, op->len, op->off, cb, 0);
  }
  if (cookie == -1)
    nbd_fail (op->is_write ? "nbd_aio_pwrite" : "nbd_aio_pread");
  t.conn[op->conn].flight[slot] = op;
}

static bool
all_idle (void)
{
  return in_flight (t.h, t.nconns) == 0;
}

/* Issues until each connection has written `quota` more times. */
static void
write_phase (uint64_t quota)
{
  uint64_t stop[MAX_HANDLES];
  bool busy = true;

  for (int c = 0; c < t.nconns; c++)
    stop[c] = t.conn[c].writes_left > quota ? t.conn[c].writes_left - quota : 0;

  while (busy) {
    busy = false;
    for (int c = 0; c < t.nconns; c++) {
      struct conn *cn = &t.conn[c];
      for (;;) {
        int slot;
        if (!cn->next && cn->writes_left > stop[c])
          cn->next = make_op (c);
        if (!cn->next || (slot = free_slot (cn->next)) == -1)
          break;
        issue (cn->next, slot);
        cn->next = NULL;
      }
      busy |= cn->next != NULL || cn->writes_left > stop[c];
    }
    if (!all_idle ())
      progress ();
  }
  while (!all_idle ())
    progress ();
}

/* Reads the whole export back, 256 KiB per request over all connections,
 * and compares it with the shadow.
 */
static void
verify_all (const char *when)
{
  const uint64_t chunk = 256 << 10;
  uint8_t *buf = xmalloc (t.size);
  int c = 0;

  for (uint64_t off = 0; off < t.size; off += chunk, c = (c + 1) % t.nconns) {
    uint64_t len = t.size - off < chunk ? t.size - off : chunk;
    if (nbd_aio_pread (t.h[c], buf + off, len, off, NBD_NULL_COMPLETION, 0)
        == -1)
      nbd_fail ("nbd_aio_pread");
    while (nbd_aio_in_flight (t.h[c]) >= t.depth)
      poll_handles (t.h, t.nconns, 60);
  }
  while (!all_idle ())
    poll_handles (t.h, t.nconns, 60);
  /* Commands without a completion callback must be retired by hand; any
   * failure shows up here.
   */
  for (c = 0; c < t.nconns; c++) {
    int64_t cookie;
    while ((cookie = nbd_aio_peek_command_completed (t.h[c])) > 0)
      if (nbd_aio_command_completed (t.h[c], cookie) == -1)
        nbd_fail ("read back");
  }
  check (buf, 0, t.size, when);
  free (buf);
}

int
main (int argc, char *argv[])
{
  const char *image = NULL, *out = NULL;
  uint64_t writes = 3000, maxrun = 700;
  struct rng r;
  int c;

  progname = "interleave_io";
  t.nconns = 4;
  t.depth = 16;
  t.seed = seed_from_clock ();   /* unless -s */
  while ((c = getopt (argc, argv, "i:o:s:c:q:n:R:")) != -1) {
    switch (c) {
    case 'i': image = optarg; break;
    case 'o': out = optarg; break;
    case 's': t.seed = parse_u64 (optarg, "-s"); break;
    case 'c': t.nconns = parse_u64 (optarg, "-c"); break;
    case 'q': t.depth = parse_u64 (optarg, "-q"); break;
    case 'n': writes = parse_u64 (optarg, "-n"); break;
    case 'R': maxrun = parse_u64 (optarg, "-R"); break;
    default: goto usage;
    }
  }
  if (optind != argc - 1 || !image || t.nconns < 1 || t.nconns > MAX_HANDLES
      || t.depth < 1 || maxrun < 1) {
  usage:
    hard_error ("usage: interleave_io -i IMAGE [-o SHADOW_OUT] [-s SEED]"
                " [-c CONNS] [-q DEPTH] [-n WRITES] [-R MAXRUN] SOCKET");
  }
  printf ("seed=%" PRIu64 " conns=%d depth=%d writes/conn=%" PRIu64
          " maxrun=%" PRIu64 "\n", t.seed, t.nconns, t.depth, writes, maxrun);
  fflush (stdout);

  for (c = 0; c < t.nconns; c++) {
    t.h[c] = connect_socket (argv[optind]);
    t.conn[c].rng.s = t.seed + 1 + c;
    t.conn[c].flight = xcalloc (t.depth, sizeof (struct op *));
    t.conn[c].writes_left = writes;
  }
  track_handles (t.h, t.nconns);
  if (t.nconns > 1 && nbd_can_multi_conn (t.h[0]) != 1)
    fail ("the server does not advertise multi-conn");
  t.can_fua = nbd_can_fua (t.h[0]) == 1;
  int64_t size = nbd_get_size (t.h[0]);
  if (size <= 0)
    nbd_fail ("nbd_get_size");
  t.size = size;
  printf ("export: size=%" PRIu64 " block_size min=%" PRId64 "\n",
          t.size, nbd_get_block_size (t.h[0], LIBNBD_SIZE_MINIMUM));

  t.shadow = xmalloc (t.size);
  t.initial = xmalloc (t.size);
  t.owner = xmalloc (t.size);
  t.last_write = xcalloc (t.size, sizeof *t.last_write);
  t.writes = xcalloc (writes * t.nconns, sizeof *t.writes);
  load_image (image, t.shadow, t.size);
  memcpy (t.initial, t.shadow, t.size);
  r.s = t.seed;
  deal_runs (&r, maxrun);
  for (c = 0; c < t.nconns; c++)
    printf ("conn %d owns %zu runs\n", c, t.conn[c].nruns);

  for (int i = 1; i <= CHECKPOINTS; i++) {
    char when[64];
    write_phase ((writes + CHECKPOINTS - 1) / CHECKPOINTS);
    snprintf (when, sizeof when, "read back at checkpoint %d/%d",
              i, CHECKPOINTS);
    verify_all (when);
  }

  track_handles (NULL, 0);
  for (c = 0; c < t.nconns; c++)
    disconnect (t.h[c]);
  if (out)
    save_file (out, t.shadow, t.size);
  printf ("writes=%" PRIu32 " (fua %" PRIu64 ") bytes=%" PRIu64
          " reads=%" PRIu64 "\nPASS seed=%" PRIu64 "\n",
          t.nwrites, t.fua, t.write_bytes, t.nreads, t.seed);
  return 0;
}
