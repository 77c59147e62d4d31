/* SPDX-License-Identifier: BSD-3-Clause */
/* huge_io: reads and writes of up to 64 MiB (nbdkit's limit, twice the
 * maximum block size pdio advertises), checked against a shadow of the
 * image.
 *
 *   huge_io -i IMAGE [-o SHADOW_OUT] [-s SEED] [-n OPS] [-q DEPTH] [-S]
 *           SOCKET
 *
 * nbd-tester-client's integrityhuge trace (requests over 32 MiB, up to
 * 47.5 MiB) is what this stands in for: Debian ships no nbd-tester-client.
 * Lengths are drawn from a list that has 64 MiB, 47.5 MiB, just over and
 * under 32 MiB, just over and under the 2 MiB above which the server
 * streams (in 1 MiB pieces), and a few small ones, plus any length up to
 * 64 MiB; offsets are as often aligned to 512 bytes as not.  Half the requests are writes of fresh
 * data (some FUA); reads are compared with the shadow as they complete.
 * Up to DEPTH (2) requests are in flight, never two overlapping ones, so
 * every outcome is determined.  At the end the whole export is read back
 * and compared; with -o the shadow is written out so that the caller can
 * cmp it with the image file after the server has exited.
 *
 * libnbd's strict mode would refuse lengths over the advertised maximum
 * (newer libnbd: STRICT_PAYLOAD) and unaligned ones (STRICT_ALIGN): both
 * are cleared, the server must take what nbdkit takes.  -S asks for
 * simple replies (as the kernel's client uses) instead of structured ones.
 */
#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

#define MiB ((uint64_t) 1 << 20)
#define MAX_LEN (64 * MiB)
#define MAX_DEPTH 8

struct op {
  bool busy, write;
  uint64_t off, len;
  uint8_t *buf;                 /* MAX_LEN bytes */
  uint32_t no;
  int err;
  bool done;
};

static struct {
  struct nbd_handle *h;
  uint64_t size;
  uint8_t *shadow;
  struct rng rng;
  struct op op[MAX_DEPTH];
  unsigned depth;
} t;

static const uint64_t lengths[] = {
  64 * MiB, 64 * MiB - 1, 47 * MiB + MiB / 2, 32 * MiB + 1, 32 * MiB,
  32 * MiB - 7, 2 * MiB + 1, 2 * MiB, 2 * MiB - 1, 3 * MiB, 4096, 1,
};

static int
completed (void *opaque, int *error)
{
  struct op *o = opaque;

  o->err = *error;
  o->done = true;
  return 1;
}

static bool
overlaps_busy (uint64_t off, uint64_t len)
{
  for (unsigned i = 0; i < t.depth; i++)
    if (t.op[i].busy && off < t.op[i].off + t.op[i].len &&
        t.op[i].off < off + len)
      return true;
  return false;
}

static void
start (struct op *o, uint32_t no)
{
  uint64_t len, off;
  uint32_t flags = 0;
  int64_t cookie;

  do {
    len = rng_below (&t.rng, 3) == 0
      ? rng_range (&t.rng, 1, MAX_LEN)
      : lengths[rng_below (&t.rng, sizeof lengths / sizeof lengths[0])];
    if (len > t.size)
      len = t.size;
    off = rng_below (&t.rng, t.size - len + 1);
    if (rng_below (&t.rng, 2))
      off &= ~(uint64_t) 511;
  } while (overlaps_busy (off, len));
  *o = (struct op) { .busy = true, .write = rng_below (&t.rng, 2),
                     .off = off, .len = len, .buf = o->buf, .no = no };
  if (o->write) {
    rng_fill (&t.rng, o->buf, len);
    if (rng_below (&t.rng, 4) == 0)
      flags = LIBNBD_CMD_FLAG_FUA;
    cookie = nbd_aio_pwrite (t.h, o->buf, len, off,
                             (nbd_completion_callback) {
                               .callback = completed, .user_data = o },
                             flags);
  }
  else
    cookie = nbd_aio_pread (t.h, o->buf, len, off,
                            (nbd_completion_callback) {
                              .callback = completed, .user_data = o }, 0);
  if (cookie == -1)
    nbd_fail (o->write ? "nbd_aio_pwrite" : "nbd_aio_pread");
}

static void
finish (struct op *o)
{
  if (o->err)
    fail ("request %" PRIu32 ": %s of %" PRIu64 " bytes at %" PRIu64
          " failed: %s", o->no, o->write ? "write" : "read", o->len, o->off,
          strerror (o->err));
  if (o->write)
    memcpy (t.shadow + o->off, o->buf, o->len);
  else if (report_mismatch ("read", o->off, t.shadow + o->off, o->buf,
                            o->len) >= 0)
    fail ("request %" PRIu32 ": read of %" PRIu64 " bytes at %" PRIu64
          " returned wrong data", o->no, o->len, o->off);
  printf ("%4" PRIu32 " %-5s %10" PRIu64 " bytes at %10" PRIu64 "%s\n",
          o->no, o->write ? "write" : "read", o->len, o->off,
          o->off % 512 ? " (unaligned)" : "");
  o->busy = false;
}

#define USAGE "-i IMAGE [-o SHADOW_OUT] [-s SEED] [-n OPS] [-q DEPTH] [-S] SOCKET"

int
main (int argc, char *argv[])
{
  const char *image = NULL, *shadow_out = NULL;
  uint64_t seed = seed_from_clock ();
  unsigned ops = 24, started = 0, finished = 0;
  bool simple = false;
  uint32_t strict;
  uint8_t *back;
  int c;

  progname = "huge_io";
  t.depth = 2;
  while ((c = getopt (argc, argv, "i:o:s:n:q:S")) != -1) {
    switch (c) {
    case 'i': image = optarg; break;
    case 'o': shadow_out = optarg; break;
    case 's': seed = parse_u64 (optarg, "seed"); break;
    case 'n': ops = parse_u64 (optarg, "ops"); break;
    case 'q':
      t.depth = parse_u64 (optarg, "depth");
      if (t.depth < 1 || t.depth > MAX_DEPTH)
        hard_error ("-q: 1 to %d", MAX_DEPTH);
      break;
    case 'S': simple = true; break;
    default: usage_exit (USAGE);
    }
  }
  if (image == NULL || optind != argc - 1)
    usage_exit (USAGE);
  printf ("seed %" PRIu64 " (rerun with -s %" PRIu64 ")\n", seed, seed);
  t.rng.s = seed;

  if ((t.h = nbd_create ()) == NULL)
    nbd_fail ("nbd_create");
  strict = nbd_get_strict_mode (t.h) & ~LIBNBD_STRICT_ALIGN;
#ifdef LIBNBD_STRICT_PAYLOAD
  strict &= ~LIBNBD_STRICT_PAYLOAD;
#endif
  if (nbd_set_strict_mode (t.h, strict) == -1)
    nbd_fail ("nbd_set_strict_mode");
  if (simple && nbd_set_request_structured_replies (t.h, false) == -1)
    nbd_fail ("nbd_set_request_structured_replies");
  if (nbd_connect_unix (t.h, argv[optind]) == -1)
    nbd_fail ("nbd_connect_unix");
  track_handles (&t.h, 1);
  if (nbd_get_structured_replies_negotiated (t.h) == simple)
    fail ("structured replies are %s, asked for %s",
          simple ? "on" : "off", simple ? "simple" : "structured");
  printf ("%s replies, maximum block size advertised %" PRId64 "\n",
          simple ? "simple" : "structured",
          nbd_get_block_size (t.h, LIBNBD_SIZE_MAXIMUM));

  if (nbd_get_size (t.h) == -1)
    nbd_fail ("nbd_get_size");
  t.size = nbd_get_size (t.h);
  t.shadow = xmalloc (t.size);
  load_image (image, t.shadow, t.size);
  for (unsigned i = 0; i < t.depth; i++)
    t.op[i].buf = xmalloc (MAX_LEN);

  while (finished < ops) {
    for (unsigned i = 0; i < t.depth && started < ops; i++)
      if (!t.op[i].busy)
        start (&t.op[i], started++);
    poll_handles (&t.h, 1, 300);
    for (unsigned i = 0; i < t.depth; i++)
      if (t.op[i].busy && t.op[i].done) {
        finish (&t.op[i]);
        finished++;
      }
  }

  /* The whole export, in requests of the largest size. */
  back = t.op[0].buf;
  for (uint64_t off = 0; off < t.size; off += MAX_LEN) {
    uint64_t len = t.size - off < MAX_LEN ? t.size - off : MAX_LEN;

    if (nbd_pread (t.h, back, len, off, 0) == -1)
      nbd_fail ("nbd_pread (verify)");
    if (report_mismatch ("verify", off, t.shadow + off, back, len) >= 0)
      fail ("the export differs from the shadow at the end");
  }
  printf ("%u requests, the whole export verified\n", ops);
  disconnect (t.h);
  if (shadow_out)
    save_file (shadow_out, t.shadow, t.size);
  return 0;
}
