/* SPDX-License-Identifier: BSD-3-Clause */
/* strict_clients: what a libnbd program written like libnbd's own examples
 * (threaded-reads-and-writes.c, strict-structured-reads.c) does to pdio,
 * with libnbd's DEFAULT strictness, checked against a shadow.
 *
 *   strict_clients -i IMAGE [-o SHADOW_OUT] [-s SEED] [-t THREADS]
 *                  [-c CONNS] [-n OPS] [-m MAXLEN] [-p PREFERRED] SOCKET
 *
 * libnbd refuses, on the client side, any request that is not a multiple
 * of the block size the server advertises as its minimum (STRICT_ALIGN is
 * on by default; nbdcopy, nbdfuse and nbdsh keep it).  So unlike the other
 * integration clients this one never touches the strict mode, and checks
 * that it includes STRICT_ALIGN: if the server advertised a minimum above
 * 1, the first odd offset would fail with "request is unaligned".
 *
 * THREADS threads share CONNS connections (libnbd handles are thread-safe,
 * so a connection has several requests in flight).  Each thread owns a
 * region of the image, and the regions' boundaries fall at odd byte
 * offsets, so neighbouring threads write into the same direct-I/O blocks
 * at once: the server's read-modify-write must serialise them.  A thread
 * writes (a quarter with FUA), zeroes, reads back with nbd_pread, and
 * reads with nbd_pread_structured, checking each chunk as libnbd's
 * strict-structured-reads example does: inside the request, no byte twice,
 * every byte once, data (or a hole's zeroes) equal to the shadow.
 *
 * At the end the whole export is read back and compared, and with -o the
 * shadow is written out so the caller can cmp it with the image file after
 * the server has exited.  -p: the preferred block size the export must
 * advertise (the engine's alignment); the minimum must be 1.
 */
#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

#define MAX_THREADS 32

struct region_check {
  const uint8_t *want;          /* shadow of [off, off+len) */
  uint64_t off, len;
  uint8_t *seen;                /* one flag per byte of the request */
  const char *why;              /* first problem found, or NULL */
  uint64_t chunks;
};

struct worker {
  int no;
  pthread_t tid;
  struct nbd_handle *h;
  uint64_t start, end;          /* the region this thread owns */
  uint64_t seed, nops, max_len;
  uint8_t *shadow;              /* the whole image's shadow; only
                                   [start, end) is this thread's */
  uint64_t reads, writes, zeroes, structured, chunks;
};

static uint64_t
pick_len (struct rng *r, uint64_t max)
{
  switch (rng_below (r, 3)) {
  case 0: return rng_range (r, 1, max < 17 ? max : 17);
  case 1: return rng_range (r, 1, max < 4097 ? max : 4097);
  default: return rng_range (r, 1, max);
  }
}

/* libnbd's chunk callback: each chunk inside the request, no byte twice,
 * the data equal to the shadow.  Returning -1 would make libnbd fail the
 * read with that errno; record the problem instead so it can be named.
 */
static int
check_chunk (void *opaque, const void *buf, size_t count, uint64_t offset,
             unsigned status, int *error)
{
  struct region_check *c = opaque;
  uint64_t rel;

  (void) error;
  c->chunks++;
  if (c->why)
    return 0;
  if (offset < c->off || offset + count > c->off + c->len) {
    c->why = "a chunk outside the request";
    return 0;
  }
  rel = offset - c->off;
  for (size_t i = 0; i < count; i++)
    if (c->seen[rel + i]++) {
      c->why = "a byte sent twice";
      return 0;
    }
  if (status != LIBNBD_READ_DATA && status != LIBNBD_READ_HOLE) {
    c->why = "a chunk of unexpected status";
    return 0;
  }
  if (memcmp (buf, c->want + rel, count) != 0) {
    report_mismatch ("structured read chunk", offset, c->want + rel, buf,
                     count);
    c->why = "chunk data differ from the shadow";
  }
  return 0;
}

static void
structured_read (struct worker *w, uint8_t *buf, uint64_t off, uint64_t len)
{
  struct region_check c = {
    .want = w->shadow + off, .off = off, .len = len,
    .seen = xcalloc (len, 1),
  };

  if (nbd_pread_structured (w->h, buf, len, off,
                            (nbd_chunk_callback) { .callback = check_chunk,
                                                   .user_data = &c },
                            0) == -1)
    fail ("thread %d: structured read of %" PRIu64 "+%" PRIu64 ": %s",
          w->no, off, len, nbd_get_error ());
  if (c.why == NULL)
    for (uint64_t i = 0; i < len; i++)
      if (!c.seen[i]) {
        c.why = "a byte never sent";
        break;
      }
  if (c.why)
    fail ("thread %d: structured read of %" PRIu64 "+%" PRIu64 ": %s",
          w->no, off, len, c.why);
  if (report_mismatch ("structured read buffer", off, w->shadow + off, buf,
                       len) >= 0)
    fail ("thread %d: structured read buffer differs", w->no);
  free (c.seen);
  w->structured++;
  w->chunks += c.chunks;
}

static void *
run_worker (void *p)
{
  struct worker *w = p;
  struct rng r = { w->seed };
  uint64_t span = w->end - w->start;
  uint8_t *buf = xmalloc (w->max_len);

  for (uint64_t i = 0; i < w->nops; i++) {
    uint64_t len = pick_len (&r, span < w->max_len ? span : w->max_len);
    uint64_t off = w->start + rng_below (&r, span - len + 1);
    unsigned what = rng_below (&r, 16);

    /* One in eight at the region's end: for the last thread that is the
     * image's tail, which an odd-sized image cannot do direct.
     */
    if (rng_below (&r, 8) == 0)
      off = w->end - len;

    if (what < 6) {             /* write, a quarter with FUA */
      uint32_t flags = rng_below (&r, 4) == 0 ? LIBNBD_CMD_FLAG_FUA : 0;

      rng_fill (&r, buf, len);
      if (nbd_pwrite (w->h, buf, len, off, flags) == -1)
        fail ("thread %d: write of %" PRIu64 "+%" PRIu64 "%s: %s", w->no,
              off, len, flags ? " (FUA)" : "", nbd_get_error ());
      memcpy (w->shadow + off, buf, len);
      w->writes++;
    }
    else if (what < 7) {
      if (nbd_zero (w->h, len, off, 0) == -1)
        fail ("thread %d: zero of %" PRIu64 "+%" PRIu64 ": %s", w->no, off,
              len, nbd_get_error ());
      memset (w->shadow + off, 0, len);
      w->zeroes++;
    }
    else if (what < 12) {
      if (nbd_pread (w->h, buf, len, off, 0) == -1)
        fail ("thread %d: read of %" PRIu64 "+%" PRIu64 ": %s", w->no, off,
              len, nbd_get_error ());
      if (report_mismatch ("read", off, w->shadow + off, buf, len) >= 0)
        fail ("thread %d: read of %" PRIu64 "+%" PRIu64 " differs from the "
              "shadow (seed %" PRIu64 ")", w->no, off, len, w->seed);
      w->reads++;
    }
    else
      structured_read (w, buf, off, len);
  }
  free (buf);
  return NULL;
}

static struct nbd_handle *
connect_strict (const char *sock, uint64_t size, uint32_t want_pref)
{
  struct nbd_handle *h = nbd_create ();
  int64_t min, pref;

  if (h == NULL)
    nbd_fail ("nbd_create");
  /* The point of this client: libnbd's defaults, alignment check on. */
  if (!(nbd_get_strict_mode (h) & LIBNBD_STRICT_ALIGN))
    hard_error ("libnbd's default strict mode lacks STRICT_ALIGN");
  if (nbd_connect_unix_or_uri (h, sock) == -1)
    nbd_fail ("nbd_connect");
  if (size)
    expect_export_size (h, size);
  if (nbd_get_structured_replies_negotiated (h) != 1)
    fail ("the server did not negotiate structured replies");
  min = nbd_get_block_size (h, LIBNBD_SIZE_MINIMUM);
  pref = nbd_get_block_size (h, LIBNBD_SIZE_PREFERRED);
  if (min != 1)
    fail ("minimum block size %" PRIi64 ", expected 1 (any byte offset)",
          min);
  if (want_pref && pref != want_pref)
    fail ("preferred block size %" PRIi64 ", expected %" PRIu32, pref,
          want_pref);
  return h;
}

int
main (int argc, char *argv[])
{
  const char *image = NULL, *out = NULL, *sock;
  uint64_t seed = 0, nops = 1000, max_len = 256 * 1024, size;
  unsigned nthreads = 6, nconns = 3;
  uint32_t want_pref = 0;
  bool have_seed = false;
  struct nbd_handle *hs[MAX_THREADS];
  struct worker w[MAX_THREADS];
  uint8_t *shadow, *buf;
  int c;

  progname = "strict_clients";
  while ((c = getopt (argc, argv, "i:o:s:t:c:n:m:p:")) != -1) {
    switch (c) {
    case 'i': image = optarg; break;
    case 'o': out = optarg; break;
    case 's': seed = parse_u64 (optarg, "-s"); have_seed = true; break;
    case 't': nthreads = parse_u64 (optarg, "-t"); break;
    case 'c': nconns = parse_u64 (optarg, "-c"); break;
    case 'n': nops = parse_u64 (optarg, "-n"); break;
    case 'm': max_len = parse_u64 (optarg, "-m"); break;
    case 'p': want_pref = parse_u64 (optarg, "-p"); break;
    default: hard_error ("bad option");
    }
  }
  if (optind != argc - 1 || image == NULL || nthreads < 1 ||
      nthreads > MAX_THREADS || nconns < 1 || nconns > nthreads ||
      max_len < 1)
    hard_error ("usage: strict_clients -i IMAGE [-o OUT] [-s SEED] "
                "[-t THREADS] [-c CONNS] [-n OPS] [-m MAXLEN] "
                "[-p PREFERRED] SOCKET");
  sock = argv[optind];
  if (!have_seed)
    seed = seed_from_clock ();
  printf ("seed %" PRIu64 ", %u threads on %u connections, %" PRIu64
          " requests each, lengths 1..%" PRIu64 "\n", seed, nthreads, nconns,
          nops, max_len);

  hs[0] = connect_strict (sock, 0, want_pref);   /* the size is the image's:
                                                    load_image checks it */
  size = nbd_get_size (hs[0]);
  shadow = xmalloc (size);
  load_image (image, shadow, size);
  for (unsigned i = 1; i < nconns; i++)
    hs[i] = connect_strict (sock, size, want_pref);
  track_handles (hs, nconns);

  /* Regions end at odd offsets (never a multiple of 512) so that
   * neighbours share blocks.
   */
  for (unsigned i = 0; i < nthreads; i++) {
    uint64_t b = size * i / nthreads, e = size * (i + 1) / nthreads;

    w[i] = (struct worker) {
      .no = i, .h = hs[i % nconns], .seed = seed * 1000003 + i,
      .nops = nops, .max_len = max_len, .shadow = shadow,
      .start = i ? b | 1 : 0,
      .end = i + 1 < nthreads ? e | 1 : size,
    };
  }
  for (unsigned i = 0; i < nthreads; i++)
    if (w[i].end <= w[i].start)
      hard_error ("image too small for %u threads", nthreads);
  for (unsigned i = 0; i < nthreads; i++)
    if (pthread_create (&w[i].tid, NULL, run_worker, &w[i]) != 0)
      hard_error ("pthread_create failed");
  for (unsigned i = 0; i < nthreads; i++)
    pthread_join (w[i].tid, NULL);

  /* The whole export, through the strict client. */
  buf = xmalloc (1 << 20);
  for (uint64_t off = 0; off < size; off += 1 << 20) {
    uint64_t len = size - off < (1 << 20) ? size - off : 1 << 20;

    if (nbd_pread (hs[0], buf, len, off, 0) == -1)
      fail ("final read of %" PRIu64 "+%" PRIu64 ": %s", off, len,
            nbd_get_error ());
    if (report_mismatch ("final read", off, shadow + off, buf, len) >= 0)
      fail ("the export differs from the shadow at the end (seed %" PRIu64
            ")", seed);
  }
  for (unsigned i = 0; i < nconns; i++)
    disconnect (hs[i]);
  track_handles (NULL, 0);

  for (unsigned i = 0; i < nthreads; i++)
    printf ("thread %u [%" PRIu64 ", %" PRIu64 "): %" PRIu64 " writes, %"
            PRIu64 " zeroes, %" PRIu64 " reads, %" PRIu64 " structured reads "
            "in %" PRIu64 " chunks\n", i, w[i].start, w[i].end, w[i].writes,
            w[i].zeroes, w[i].reads, w[i].structured, w[i].chunks);
  if (out)
    save_file (out, shadow, size);
  printf ("every read matched the shadow\n");
  free (buf);
  free (shadow);
  return 0;
}
