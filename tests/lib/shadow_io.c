/* SPDX-License-Identifier: BSD-3-Clause */
/* shadow_io: random I/O against an NBD export, checked byte for byte
 * against an in-memory shadow of the image.
 *
 *   shadow_io -i IMAGE [-o SHADOW_OUT] [-s SEED] [-n OPS] [-u STOP]
 *             [-c CONNS] [-q DEPTH] [-m MAXLEN] [-r] SOCKET
 *
 * The shadow starts as the image file's content (read with O_DIRECT, so
 * the test does not put the image in the page cache itself).  Requests of
 * every kind (read, write, FUA write, zero with and without may-trim and
 * fast-zero, trim, flush) at aligned and unaligned offsets and lengths
 * from 1 byte to MAXLEN, many near the image's unaligned tail, go out over
 * CONNS connections with DEPTH commands in flight on each.
 *
 * Two requests that overlap are never in flight together when either one
 * changes data: the result would be undefined.  So the outcome of every
 * request is determined, and every read is checked as it completes:
 *   - written / zeroed bytes must read back exactly;
 *   - trimmed bytes read back as either the old value or 0 (the server
 *     may deallocate only part of a range); the value read then becomes
 *     the shadow's;
 *   - a fast zero may be refused with ENOTSUP, and then nothing changed.
 * Three in four changes are read back a few requests later, before later
 * writes are likely to cover them.
 * At the end the whole export is read and compared, and with -o the
 * shadow is written out so the caller can cmp it with the image file
 * after the server has exited.
 *
 * With -u, requests go on past OPS until the file STOP exists: one run on
 * the same connections can then span events whose time the caller does
 * not know in advance (server/handover.tap's hand-overs), where runs of a
 * fixed length would begin and end among them as luck has it.
 *
 * The sequence of requests depends only on the seed (printed first):
 * rerun with -s SEED to replay it (with -u, as many as the run made).
 * -r requires the server to advertise everything pdio promises (trim,
 * zero, fast zero, FUA, flush, multi-conn).
 */
#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

enum kind { OP_READ, OP_WRITE, OP_ZERO, OP_TRIM, OP_FLUSH, NR_KINDS };
static const char *const kind_name[NR_KINDS] =
  { "read", "write", "zero", "trim", "flush" };

struct op {
  struct completion c;          /* first: the callback's user_data */
  uint32_t no;                  /* sequence number, for the history */
  enum kind kind;
  int conn;
  uint32_t flags;               /* LIBNBD_CMD_FLAG_* */
  uint64_t off, len;
  uint8_t *buf;                 /* read or write data, NULL otherwise */
};

/* What happened to each request, kept to explain a wrong byte. */
struct hist {
  enum kind kind;
  int conn;
  uint32_t flags;
  uint64_t off, len;
  int err;                      /* -1 while in flight */
};

static struct {
  uint64_t seed;
  int nconns, depth;
  uint64_t max_len;
  bool require_all;

  struct nbd_handle *h[MAX_HANDLES];
  bool can_fast_zero, can_trim, can_zero, can_fua, can_flush;

  uint64_t size;
  uint8_t *shadow;
  uint8_t *fuzzy;               /* 1: "old value or zero" after a trim */

  struct op **flight;           /* nconns * depth slots, NULL = free */
  int nflight;

  struct hist *hist;
  uint32_t nhist, hist_cap;

  uint64_t count[NR_KINDS], bytes[NR_KINDS];
  uint64_t fua, fast_zero_refused, fuzzy_zeroed, fuzzy_kept, read_backs;
} t;

static bool
modifies (enum kind k)
{
  return k == OP_WRITE || k == OP_ZERO || k == OP_TRIM;
}

static void
print_history_at (uint64_t offset)
{
  unsigned shown = 0;

  fprintf (stderr, "  requests that covered offset %" PRIu64
           " (newest first, at most 12):\n", offset);
  for (uint32_t i = t.nhist; i-- > 0 && shown < 12; ) {
    const struct hist *h = &t.hist[i];
    if (h->kind == OP_FLUSH || offset < h->off || offset >= h->off + h->len)
      continue;
    fprintf (stderr, "    #%-6" PRIu32 " conn %d %-5s off=%" PRIu64
             " len=%" PRIu64 "%s%s%s -> %s\n",
             i, h->conn, kind_name[h->kind], h->off, h->len,
             h->flags & LIBNBD_CMD_FLAG_FUA ? " fua" : "",
             h->kind == OP_ZERO && !(h->flags & LIBNBD_CMD_FLAG_NO_HOLE)
             ? " may_trim" : "",
             h->flags & LIBNBD_CMD_FLAG_FAST_ZERO ? " fast" : "",
             h->err == -1 ? "in flight" : h->err ? strerror (h->err) : "ok");
    shown++;
  }
}

static void
fail_read (const struct op *op, uint64_t bad, const char *why)
{
  fprintf (stderr, "%s: FAIL: seed %" PRIu64 ": request #%" PRIu32
           " (conn %d read off=%" PRIu64 " len=%" PRIu64 "): %s\n",
           progname, t.seed, op->no, op->conn, op->off, op->len, why);
  print_history_at (bad);
  fprintf (stderr, "  image size %" PRIu64 "; replay with -s %" PRIu64 "\n",
           t.size, t.seed);
  fail_exit (EXIT_SERVER_BUG);
}

/* A read completed: every byte must be the shadow's, or for bytes a trim
 * left undetermined, the shadow's or zero (and that settles them).
 */
static void
check_read (const struct op *op)
{
  const uint8_t *got = op->buf;
  uint8_t *want = t.shadow + op->off;
  uint8_t *fz = t.fuzzy + op->off;

  for (uint64_t i = 0; i < op->len; i++) {
    if (fz[i]) {
      if (got[i] != want[i] && got[i] != 0) {
        char why[160];
        snprintf (why, sizeof why,
                  "trimmed byte at %" PRIu64 " is 0x%02x, neither the old"
                  " 0x%02x nor 0", op->off + i, got[i], want[i]);
        fail_read (op, op->off + i, why);
      }
      if (got[i] != want[i])
        t.fuzzy_zeroed++;
      else
        t.fuzzy_kept++;
      want[i] = got[i];
      fz[i] = 0;
    }
  }

  int64_t first = report_mismatch ("read", op->off, want, got, op->len);
  if (first >= 0)
    fail_read (op, op->off + first, "data differs from the shadow");
}

static void
complete (struct op *op)
{
  struct hist *h = &t.hist[op->no];

  h->err = op->c.err;
  if (op->c.err) {
    if (op->kind == OP_ZERO && (op->flags & LIBNBD_CMD_FLAG_FAST_ZERO)
        && op->c.err == ENOTSUP) {
      t.fast_zero_refused++;    /* allowed; the data must be unchanged */
    }
    else {
      fprintf (stderr, "%s: FAIL: seed %" PRIu64 ": request #%" PRIu32
               " conn %d %s off=%" PRIu64 " len=%" PRIu64
               " flags=0x%x failed: %s\n",
               progname, t.seed, op->no, op->conn, kind_name[op->kind],
               op->off, op->len, op->flags, strerror (op->c.err));
      fail_exit (EXIT_SERVER_BUG);
    }
  }
  else {
    switch (op->kind) {
    case OP_READ:
      check_read (op);
      break;
    case OP_WRITE:
      memcpy (t.shadow + op->off, op->buf, op->len);
      memset (t.fuzzy + op->off, 0, op->len);
      break;
    case OP_ZERO:
      memset (t.shadow + op->off, 0, op->len);
      memset (t.fuzzy + op->off, 0, op->len);
      break;
    case OP_TRIM:
      memset (t.fuzzy + op->off, 1, op->len);
      break;
    case OP_FLUSH: case NR_KINDS:
      break;
    }
  }
  free (op->buf);
  free (op);
}

/* Runs the poll loop once and settles whatever completed. */
static void
progress (void)
{
  poll_handles (t.h, t.nconns, 60);
  for (int i = 0; i < t.nconns * t.depth; i++) {
    struct op *op = t.flight[i];
    if (op && op->c.done) {
      t.flight[i] = NULL;
      t.nflight--;
      complete (op);
    }
  }
}

static bool
conflicts (const struct op *op)
{
  if (op->kind == OP_FLUSH)
    return false;
  for (int i = 0; i < t.nconns * t.depth; i++) {
    const struct op *q = t.flight[i];
    if (!q || q->kind == OP_FLUSH)
      continue;
    if (!modifies (op->kind) && !modifies (q->kind))
      continue;
    if (op->off < q->off + q->len && q->off < op->off + op->len)
      return true;
  }
  return false;
}

static unsigned
conn_in_flight (int conn)
{
  unsigned n = 0;

  for (int i = 0; i < t.nconns * t.depth; i++)
    if (t.flight[i] && t.flight[i]->conn == conn)
      n++;
  return n;
}

static void
record (const struct op *op)
{
  if (t.nhist == t.hist_cap) {
    t.hist_cap = t.hist_cap ? t.hist_cap * 2 : 4096;
    t.hist = realloc (t.hist, t.hist_cap * sizeof *t.hist);
    if (!t.hist)
      hard_error ("out of memory");
  }
  t.hist[t.nhist++] = (struct hist) {
    .kind = op->kind, .conn = op->conn, .flags = op->flags,
    .off = op->off, .len = op->len, .err = -1,
  };
}

/* Waits until op may go out (its connection has room, nothing
 * conflicting is in flight), then issues it.
 */
static void
issue (struct op *op)
{
  struct nbd_handle *h = t.h[op->conn];
  nbd_completion_callback cb = { .callback = note_completion, .user_data = op };
  int64_t cookie = 0;
  int slot;

  while (conn_in_flight (op->conn) >= (unsigned) t.depth || conflicts (op))
    progress ();

  op->no = t.nhist;
  record (op);
  t.count[op->kind]++;
  t.bytes[op->kind] += op->len;
  if (op->flags & LIBNBD_CMD_FLAG_FUA)
    t.fua++;

  switch (op->kind) {
  case OP_READ:
    cookie = nbd_aio_pread (h, op->buf, op->len, op->off, cb, 0);
    break;
  case OP_WRITE:
    cookie = nbd_aio_pwrite (h, op->buf, op->len, op->off, cb, op->flags);
    break;
  case OP_ZERO:
    cookie = nbd_aio_zero (h, op->len, op->off, cb, op->flags);
    break;
  case OP_TRIM:
    cookie = nbd_aio_trim (h, op->len, op->off, cb, op->flags);
    break;
  case OP_FLUSH:
    cookie = nbd_aio_flush (h, cb, 0);
    break;
  case NR_KINDS:
    abort ();
  }
  if (cookie == -1)
    nbd_fail (kind_name[op->kind]);

  for (slot = 0; t.flight[slot]; slot++)
    ;
  t.flight[slot] = op;
  t.nflight++;
}

static void
drain (void)
{
  while (t.nflight > 0)
    progress ();
}

/* Lengths: many sub-block and odd sizes, some block multiples, some big. */
static uint64_t
pick_len (struct rng *r)
{
  uint64_t p = rng_below (r, 100), len;

  if (p < 20)
    len = rng_range (r, 1, 64);
  else if (p < 45)
    len = rng_range (r, 1, 4096);
  else if (p < 65)
    len = 512 * rng_range (r, 1, 128);
  else if (p < 80)
    len = 4096 * rng_range (r, 1, 256);
  else
    len = rng_range (r, 1, t.max_len);
  return len < t.max_len ? len : t.max_len;
}

/* Offsets: 4 KiB and 512 B aligned, anywhere, and ending at or just
 * before the (unaligned) end of the image.
 */
static void
pick_range (struct rng *r, uint64_t *offp, uint64_t *lenp)
{
  uint64_t p = rng_below (r, 100), len = pick_len (r), off;

  if (len > t.size)
    len = t.size;
  if (p < 30)
    off = 4096 * rng_below (r, t.size / 4096 + 1);
  else if (p < 50)
    off = 512 * rng_below (r, t.size / 512 + 1);
  else if (p < 80)
    off = rng_below (r, t.size);
  else {
    uint64_t end = t.size - (rng_below (r, 2) ? 0 : rng_below (r, 8192));
    off = end > len ? end - len : 0;
  }
  if (off >= t.size)
    off = t.size - 1;
  if (len > t.size - off)
    len = t.size - off;
  *offp = off;
  *lenp = len;
}

static struct op *
make_op (struct rng *r)
{
  struct op *op = xcalloc (1, sizeof *op);
  uint64_t p = rng_below (r, 100);

  op->conn = rng_below (r, t.nconns);
  pick_range (r, &op->off, &op->len);

  if (p < 38)
    op->kind = OP_READ;
  else if (p < 72)
    op->kind = OP_WRITE;
  else if (p < 84 && t.can_zero)
    op->kind = OP_ZERO;
  else if (p < 94 && t.can_trim)
    op->kind = OP_TRIM;
  else if (t.can_flush)
    op->kind = OP_FLUSH;
  else
    op->kind = OP_READ;

  switch (op->kind) {
  case OP_READ:
    op->buf = xmalloc (op->len);
    break;
  case OP_WRITE: {
    /* The data comes from its own stream so buffer contents do not
     * shift the request sequence.
     */
    struct rng data = { t.seed ^ (UINT64_C (0x5851f42d4c957f2d) * t.nhist) };
    op->buf = xmalloc (op->len);
    rng_fill (&data, op->buf, op->len);
    if (t.can_fua && rng_below (r, 4) == 0)
      op->flags |= LIBNBD_CMD_FLAG_FUA;
    break;
  }
  case OP_ZERO:
    if (rng_below (r, 2))
      op->flags |= LIBNBD_CMD_FLAG_NO_HOLE;
    if (t.can_fast_zero && rng_below (r, 3) == 0)
      op->flags |= LIBNBD_CMD_FLAG_FAST_ZERO;
    if (t.can_fua && rng_below (r, 4) == 0)
      op->flags |= LIBNBD_CMD_FLAG_FUA;
    break;
  case OP_TRIM:
    if (t.can_fua && rng_below (r, 4) == 0)
      op->flags |= LIBNBD_CMD_FLAG_FUA;
    break;
  case OP_FLUSH:
    op->off = op->len = 0;
    break;
  case NR_KINDS:
    abort ();
  }
  return op;
}

static bool
capability (struct nbd_handle *h, int (*can) (struct nbd_handle *),
            const char *name)
{
  int v = can (h);

  if (v == -1)
    nbd_fail (name);
  if (!v && t.require_all)
    fail ("the server does not advertise %s", name);
  return v;
}

static void
connect_all (const char *sock)
{
  for (int i = 0; i < t.nconns; i++)
    t.h[i] = connect_socket (sock);
  track_handles (t.h, t.nconns);
  /* Checking reads on one connection against writes completed on another
   * is only valid with multi-conn consistency.
   */
  if (t.nconns > 1 && nbd_can_multi_conn (t.h[0]) != 1)
    fail ("the server does not advertise multi-conn (use -c 1)");
  t.can_fast_zero = capability (t.h[0], nbd_can_fast_zero, "can_fast_zero");
  t.can_trim = capability (t.h[0], nbd_can_trim, "can_trim");
  t.can_zero = capability (t.h[0], nbd_can_zero, "can_zero");
  t.can_fua = capability (t.h[0], nbd_can_fua, "can_fua");
  t.can_flush = capability (t.h[0], nbd_can_flush, "can_flush");
  if (nbd_is_read_only (t.h[0]))
    fail ("the export is read-only");

  int64_t size = nbd_get_size (t.h[0]);
  if (size <= 0)
    nbd_fail ("nbd_get_size");
  t.size = size;
  printf ("export: size=%" PRIu64 " block_size min=%" PRId64
          " preferred=%" PRId64 " max=%" PRId64
          " trim=%d zero=%d fast_zero=%d fua=%d flush=%d\n",
          t.size, nbd_get_block_size (t.h[0], LIBNBD_SIZE_MINIMUM),
          nbd_get_block_size (t.h[0], LIBNBD_SIZE_PREFERRED),
          nbd_get_block_size (t.h[0], LIBNBD_SIZE_MAXIMUM),
          t.can_trim, t.can_zero, t.can_fast_zero, t.can_fua, t.can_flush);
}

/* Three in four writes, zeroes and trims are read back a few requests
 * later, so that a wrong result is seen before a later write can cover it.
 * When is decided by the seed, like everything else, not by timing.
 */
#define MAX_READ_BACKS 64
static struct {
  uint64_t due, off, len;
} read_back[MAX_READ_BACKS];
static int nread_back;

static void
schedule_read_back (uint64_t due, uint64_t off, uint64_t len)
{
  if (nread_back == MAX_READ_BACKS)
    hard_error ("too many read-backs scheduled");
  read_back[nread_back].due = due;
  read_back[nread_back].off = off;
  read_back[nread_back].len = len;
  nread_back++;
}

/* Issues the read-backs due at request i (all of them for UINT64_MAX). */
static void
issue_read_backs (uint64_t i)
{
  for (int k = 0; k < nread_back; ) {
    if (read_back[k].due > i) {
      k++;
      continue;
    }
    struct op *op = xcalloc (1, sizeof *op);
    op->kind = OP_READ;
    op->conn = read_back[k].due % t.nconns;
    op->off = read_back[k].off;
    op->len = read_back[k].len;
    op->buf = xmalloc (op->len);
    read_back[k] = read_back[--nread_back];
    t.read_backs++;
    issue (op);
  }
}

/* Reads the whole export back in 1 MiB pieces over all connections. */
static void
verify_all (void)
{
  const uint64_t chunk = 1 << 20;

  for (uint64_t off = 0, i = 0; off < t.size; off += chunk, i++) {
    struct op *op = xcalloc (1, sizeof *op);
    op->kind = OP_READ;
    op->conn = i % t.nconns;
    op->off = off;
    op->len = t.size - off < chunk ? t.size - off : chunk;
    op->buf = xmalloc (op->len);
    issue (op);
  }
  drain ();
  for (uint64_t i = 0; i < t.size; i++)
    if (t.fuzzy[i])
      hard_error ("byte %" PRIu64 " was not settled by the final read", i);
}

#define USAGE "-i IMAGE [-o SHADOW_OUT] [-s SEED] [-n OPS] [-u STOP]" \
  " [-c CONNS] [-q DEPTH] [-m MAXLEN] [-r] SOCKET"

int
main (int argc, char *argv[])
{
  const char *image = NULL, *out = NULL, *stop = NULL;
  uint64_t nops = 3000;
  struct rng r;
  int c;

  progname = "shadow_io";
  t.nconns = 4;
  t.depth = 8;
  t.max_len = 2 << 20;
  t.seed = seed_from_clock ();   /* unless -s */
  while ((c = getopt (argc, argv, "i:o:s:n:u:c:q:m:r")) != -1) {
    switch (c) {
    case 'i': image = optarg; break;
    case 'o': out = optarg; break;
    case 's': t.seed = parse_u64 (optarg, "-s"); break;
    case 'n': nops = parse_u64 (optarg, "-n"); break;
    case 'u': stop = optarg; break;
    case 'c': t.nconns = parse_u64 (optarg, "-c"); break;
    case 'q': t.depth = parse_u64 (optarg, "-q"); break;
    case 'm': t.max_len = parse_u64 (optarg, "-m"); break;
    case 'r': t.require_all = true; break;
    default: usage_exit (USAGE);
    }
  }
  if (optind != argc - 1 || !image || t.nconns < 1 || t.nconns > MAX_HANDLES
      || t.depth < 1 || t.max_len < 1)
    usage_exit (USAGE);
  printf ("seed=%" PRIu64 " ops=%" PRIu64 " conns=%d depth=%d maxlen=%" PRIu64
          "\n", t.seed, nops, t.nconns, t.depth, t.max_len);
  fflush (stdout);
  r.s = t.seed;

  connect_all (argv[optind]);
  t.shadow = xmalloc (t.size);
  t.fuzzy = xcalloc (t.size, 1);
  t.flight = xcalloc (t.nconns * t.depth, sizeof *t.flight);
  load_image (image, t.shadow, t.size);

  for (uint64_t i = 0; i < nops || (stop && access (stop, F_OK) != 0); i++) {
    struct op *op = make_op (&r);
    uint64_t off = op->off, len = op->len;
    bool check_later = modifies (op->kind) && rng_below (&r, 4) != 0;

    issue (op);                 /* op may be gone after this */
    if (check_later)
      schedule_read_back (i + rng_range (&r, 1, 16), off, len);
    issue_read_backs (i);
  }
  issue_read_backs (UINT64_MAX);
  drain ();
  verify_all ();

  track_handles (NULL, 0);
  for (int i = 0; i < t.nconns; i++)
    disconnect (t.h[i]);
  if (out)
    save_file (out, t.shadow, t.size);

  for (int k = 0; k < NR_KINDS; k++)
    printf ("%-5s %6" PRIu64 " requests %12" PRIu64 " bytes\n",
            kind_name[k], t.count[k], t.bytes[k]);
  printf ("read-backs=%" PRIu64 " (included above) ", t.read_backs);
  printf ("fua=%" PRIu64 " fast_zero_refused=%" PRIu64
          " trimmed_bytes_read_as_zero=%" PRIu64 " as_old=%" PRIu64 "\n",
          t.fua, t.fast_zero_refused, t.fuzzy_zeroed, t.fuzzy_kept);
  printf ("PASS seed=%" PRIu64 "\n", t.seed);
  return 0;
}
