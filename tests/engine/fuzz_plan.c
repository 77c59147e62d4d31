/* SPDX-License-Identifier: BSD-3-Clause */
/* libFuzzer target: a request -> plan_chunk() (src/engine/plan.c) ->
 * dio_args (src/engine/dio_args.c) -> the executor on a memory disk that
 * enforces O_DIRECT's rules (tests/engine/mem_backend.c), checking the
 * mapping's invariants on every chunk.  Built with clang -fsanitize=fuzzer,address,
 * undefined (see the robust block of tests/Makefile.am); fuzz.sh runs it
 * for a bounded time over the committed corpus (tests/engine/corpus/).
 *
 * Input bytes (missing ones read as 0):
 *   [0]      align = 512 << (b % 8): 512 .. 64 KiB
 *   [1]      mem_align = 1 << (b % 13), at most align (1 .. 4096): a
 *            device's memory alignment never exceeds its block size, and
 *            short transfers come in whole blocks
 *   [2..3]   bounce cap: 2*align plus up to the arena's maximum, any value
 *            (a cap that is not a multiple of align is allowed)
 *   [4..11]  offset (below 2^40)
 *   [12..15] count: the top 5 bits pick a scale (16 B << scale, at most
 *            64 MiB, the engine's largest request), the other 27 a count
 *            below it, so sizes spread evenly over every order of magnitude
 *   [16..17] where the client's buffer starts: its address modulo 64 KiB
 *   [18]     bit 0 write; bit 1 execute on the memory disk (offset and
 *            count then folded into its 512 KiB); bits 2-4 every Nth
 *            transfer comes back short (by whole blocks); bits 5-7 every
 *            Nth fails with EAGAIN (N >= 2)
 *   [19]     reads only: where end of file falls (0: the disk's end)
 *   [20..]   seed for the data written
 *
 * Invariants, per chunk and per request:
 *   - every client byte is covered exactly once (the client's own memory
 *     or one copy), chunk after chunk, in order;
 *   - every segment is aligned: the file offset and length to align, the
 *     client's memory of a direct segment to mem_align, bounce memory too;
 *     a direct segment lands where the client's bytes belong;
 *   - the chunks tile the request rounded out to align, exactly: nothing
 *     before the rounded start or past the rounded end, no gap, no overlap;
 *   - bounce bytes used <= the cap, and every copy stays in its segment;
 *   - read-modify-write: only for writes, at most the two edge blocks, only
 *     blocks the request covers in part, and every block of a write's
 *     bounce memory is fully copied from the client or read back first;
 *   - dio_args: page vectors whose pages are page-aligned and span exactly
 *     the segment; the iovecs rebuilt from any byte count describe exactly
 *     the remaining bytes, in order, within IO_MAX_IOV, and from a whole-
 *     block count still meet the O_DIRECT rules;
 *   - executed: the result equals a plain memcpy on a reference copy,
 *     bytes past end of file read as zero, nothing outside the client's
 *     buffer is touched, and the memory disk saw no O_DIRECT violation,
 *     with short transfers and EAGAIN injected.
 * Any violation aborts (libFuzzer saves the input as a crash).
 */
#include <config.h>

#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "dio_args.h"
#include "engine_internal.h"
#include "mem_backend.h"
#include "pagesize.h"
#include "plan.h"
#include "plan_check.h"

#define DISK ((size_t) 512 << 10)
#define GUARD ((size_t) 64 << 10)
#define USER_BASE ((uintptr_t) 1 << 44)      /* fake addresses: plan only */
#define BOUNCE_BASE ((uintptr_t) 2 << 44)
#define PLAN_PAGES \
  ((PDIO_MAX_REQUEST + BOUNCE_CAP + GUARD) / PDIO_PAGE_SIZE + 8)

int LLVMFuzzerTestOneInput (const uint8_t *data, size_t size);

#define ENSURE(cond, ...)                                               \
  do {                                                                  \
    if (!(cond)) {                                                      \
      fprintf (stderr, "fuzz_plan: invariant broken: %s: ", #cond);     \
      fprintf (stderr, __VA_ARGS__);                                    \
      fprintf (stderr, "\n  request: %s offset=%" PRIu64 " count=%zu"   \
               " buf%%65536=%zu align=%u mem_align=%u cap=%zu\n",       \
               cur.write ? "write" : "read", cur.offset, cur.count,     \
               (size_t) (cur.buf % 65536), curlim.align,                \
               curlim.mem_align, curlim.bounce_cap);                    \
      abort ();                                                         \
    }                                                                   \
  } while (0)

static struct plan_request cur;
static struct plan_limits curlim;

static uint64_t
get (const uint8_t *d, size_t n, size_t at, size_t len)
{
  uint64_t v = 0;

  for (size_t i = 0; i < len; i++)
    v |= (uint64_t) (at + i < n ? d[at + i] : 0) << (8 * i);
  return v;
}

static uint64_t
rdown (uint64_t x, uint64_t a)
{
  return x / a * a;
}

static uint64_t
rup (uint64_t x, uint64_t a)
{
  return (x + a - 1) / a * a;
}

struct ival {
  size_t start, end;
};

static int
cmp_ival (const void *a, const void *b)
{
  const struct ival *x = a, *y = b;

  return x->start < y->start ? -1 : x->start > y->start;
}

/* The memory address byte `pos` of the chunk's transfer maps to. */
static uintptr_t
stream_addr (const struct plan_chunk *c, uintptr_t user, uintptr_t bounce,
             size_t pos)
{
  for (unsigned s = 0; s < c->nseg; s++) {
    if (pos < c->seg[s].len)
      return (c->seg[s].mem == PLAN_MEM_USER ? user : bounce) +
        c->seg[s].mem_off + pos;
    pos -= c->seg[s].len;
  }
  return 0;
}

static void
check_iovecs (const struct plan_chunk *c, const struct dio_args *d,
              uintptr_t user, uintptr_t bounce, size_t skip, bool whole)
{
  struct iovec iov[IO_MAX_IOV];
  int n = dio_args_to_iovec (d, c->nseg, skip, iov, IO_MAX_IOV);
  size_t pos = skip;

  ENSURE (n >= 1 && n <= IO_MAX_IOV, "dio_args_to_iovec gave %d iovecs"
          " (skip %zu)", n, skip);
  for (int i = 0; i < n; i++) {
    uintptr_t base = (uintptr_t) iov[i].iov_base;

    ENSURE (iov[i].iov_len > 0, "empty iovec %d", i);
    ENSURE (base == stream_addr (c, user, bounce, pos), "iovec %d starts at"
            " the wrong address (skip %zu, byte %zu)", i, skip, pos);
    ENSURE (base + iov[i].iov_len - 1 ==
            stream_addr (c, user, bounce, pos + iov[i].iov_len - 1),
            "iovec %d merges memory that is not contiguous", i);
    if (whole)
      ENSURE (iov[i].iov_len % curlim.align == 0 &&
              base % curlim.mem_align == 0, "iovec %d breaks O_DIRECT"
              " after %zu bytes: len %zu, address %% mem_align = %zu", i,
              skip, iov[i].iov_len, (size_t) (base % curlim.mem_align));
    pos += iov[i].iov_len;
  }
  ENSURE (pos == c->file_len, "iovecs end at %zu, the chunk at %zu", pos,
          c->file_len);
}

static void **plan_pages;

static void
check_chunk (const struct plan_chunk *c, size_t done, uint64_t expect_off,
             bool map_too)
{
  const struct plan_request *req = &cur;
  const struct plan_limits *lim = &curlim;
  const uint64_t a = lim->align, end = req->offset + req->count;
  struct ival iv[5];
  unsigned niv = 0;
  uint64_t pos = c->file_off;

  ENSURE (c->next > done && c->next <= req->count, "no progress: %zu -> %zu",
          done, c->next);
  ENSURE (c->file_off == expect_off, "chunk at %" PRIu64 ", expected %" PRIu64
          " (gap, overlap, or before the rounded start)", c->file_off,
          expect_off);
  ENSURE (c->file_off % a == 0 && c->file_len % a == 0 && c->file_len > 0,
          "chunk [%" PRIu64 "+%zu] unaligned", c->file_off, c->file_len);
  ENSURE (c->file_off + c->file_len <= rup (end, a), "chunk ends at %" PRIu64
          ", past the rounded end %" PRIu64, c->file_off + c->file_len,
          rup (end, a));
  ENSURE (c->bounce_len <= lim->bounce_cap, "bounce %zu > cap", c->bounce_len);
  ENSURE (c->nseg >= 1 && c->nseg <= 3 && c->ncopy <= 2 && c->nrmw <= 2,
          "nseg %u ncopy %u nrmw %u", c->nseg, c->ncopy, c->nrmw);

  for (unsigned s = 0; s < c->nseg; s++) {
    const struct plan_seg *seg = &c->seg[s];

    ENSURE (seg->len > 0 && seg->len % a == 0, "segment %u length %zu", s,
            seg->len);
    if (seg->mem == PLAN_MEM_USER) {
      ENSURE (c->direct, "client memory in a bounced chunk");
      ENSURE ((req->buf + seg->mem_off) % lim->mem_align == 0,
              "direct segment memory unaligned");
      ENSURE (seg->mem_off + seg->len <= req->count, "direct segment"
              " overruns the client's buffer");
      ENSURE (pos == req->offset + seg->mem_off, "direct segment misplaced");
      iv[niv++] = (struct ival) { seg->mem_off, seg->mem_off + seg->len };
    }
    else {
      ENSURE (seg->mem_off % PDIO_PAGE_SIZE % lim->mem_align == 0,
              "bounce segment memory unaligned");
      ENSURE (seg->mem_off + seg->len <= c->bounce_len, "bounce overrun");
    }
    pos += seg->len;
  }
  ENSURE (pos == c->file_off + c->file_len, "segments do not add up");

  for (unsigned i = 0; i < c->ncopy; i++) {
    const struct plan_copy *cp = &c->copy[i];

    ENSURE (cp->len > 0, "empty copy");
    ENSURE (cp->user_off + cp->len <= req->count, "copy overruns client");
    ENSURE (cp->bounce_off + cp->len <= c->bounce_len, "copy overruns"
            " bounce");
    ENSURE (bounce_file_off (c, cp->bounce_off) == req->offset + cp->user_off
            && bounce_file_off (c, cp->bounce_off + cp->len - 1) ==
            req->offset + cp->user_off + cp->len - 1, "copy misplaced or"
            " across segments");
    iv[niv++] = (struct ival) { cp->user_off, cp->user_off + cp->len };
  }
  /* The client bytes of this chunk are exactly [done, next). */
  qsort (iv, niv, sizeof iv[0], cmp_ival);
  size_t at = done;
  for (unsigned i = 0; i < niv; i++) {
    ENSURE (iv[i].start == at, "client bytes %zu.. covered %s", at,
            iv[i].start < at ? "twice" : "by nobody");
    at = iv[i].end;
  }
  ENSURE (at == c->next, "chunk covers client bytes up to %zu, says %zu", at,
          c->next);

  /* Read-modify-write. */
  ENSURE (c->nrmw == 0 || req->write, "RMW planned for a read");
  for (unsigned i = 0; i < c->nrmw; i++) {
    const struct plan_rmw *rm = &c->rmw[i];
    uint64_t lo = rm->file_off > req->offset ? rm->file_off : req->offset;
    uint64_t hi = rm->file_off + a < end ? rm->file_off + a : end;

    ENSURE (rm->file_off % a == 0, "rmw unaligned");
    ENSURE (i == 0 || rm->file_off != c->rmw[0].file_off, "block read twice");
    ENSURE (bounce_file_off (c, rm->bounce_off) == rm->file_off &&
            bounce_file_off (c, rm->bounce_off + a - 1) == rm->file_off + a - 1,
            "rmw block misplaced");
    ENSURE (hi > lo && hi - lo < a, "RMW of block %" PRIu64 " which the write"
            " covers %s", rm->file_off, hi > lo ? "entirely" : "not at all");
  }
  /* Every block of bounce memory a write sends is a client copy in full,
   * or was read back (then the copy patches it).
   */
  if (req->write)
    for (unsigned s = 0; s < c->nseg; s++) {
      const struct plan_seg *seg = &c->seg[s];
      if (seg->mem != PLAN_MEM_BOUNCE)
        continue;
      for (size_t b = seg->mem_off; b < seg->mem_off + seg->len; b += a) {
        size_t copied = 0;
        bool rmw = false;
        for (unsigned i = 0; i < c->ncopy; i++) {
          size_t cs = c->copy[i].bounce_off, ce = cs + c->copy[i].len;
          size_t lo = cs > b ? cs : b, hi = ce < b + a ? ce : b + a;
          if (hi > lo)
            copied += hi - lo;
        }
        for (unsigned i = 0; i < c->nrmw; i++)
          rmw |= c->rmw[i].bounce_off == b;
        ENSURE (copied == a || rmw, "a write sends bounce block at %zu with"
                " %zu of %" PRIu64 " bytes filled and no read-back", b,
                copied, a);
      }
    }

  if (!map_too)
    return;

  /* dio_args over (fake) addresses: nothing is dereferenced. */
  struct dio_args d[3];
  unsigned used = 0;
  uint64_t foff = c->file_off;
  for (unsigned s = 0; s < c->nseg; s++) {
    uintptr_t mem = (c->seg[s].mem == PLAN_MEM_USER ? req->buf : BOUNCE_BASE)
      + c->seg[s].mem_off;
    unsigned need = dio_pages_needed ((void *) mem, c->seg[s].len);

    ENSURE (used + need <= PLAN_PAGES, "page slots");
    dio_args_map (&d[s], plan_pages + used, (void *) mem, c->seg[s].len, foff);
    ENSURE (d[s].nr_pages == need && d[s].length == c->seg[s].len &&
            d[s].offset == foff && d[s].first_page_off == mem % PDIO_PAGE_SIZE,
            "dio_args header of segment %u", s);
    for (unsigned p = 0; p < d[s].nr_pages; p++)
      ENSURE ((uintptr_t) d[s].pages[p] % PDIO_PAGE_SIZE == 0 &&
              (uintptr_t) d[s].pages[p] ==
              mem - mem % PDIO_PAGE_SIZE + (uintptr_t) p * PDIO_PAGE_SIZE,
              "page %u of segment %u", p, s);
    ENSURE ((uintptr_t) d[s].pages[d[s].nr_pages - 1] + PDIO_PAGE_SIZE >=
            mem + c->seg[s].len, "pages end before the segment");
    used += need;
    foff += c->seg[s].len;
  }
  ENSURE (dio_args_total (d, c->nseg) == c->file_len, "dio_args total");
  check_iovecs (c, d, req->buf, BOUNCE_BASE, 0, true);
  check_iovecs (c, d, req->buf, BOUNCE_BASE, c->file_len / a / 2 * a, true);
  check_iovecs (c, d, req->buf, BOUNCE_BASE, (c->file_len - 1) / 3, false);
  check_iovecs (c, d, req->buf, BOUNCE_BASE, c->file_len - 1, false);
}

static void
check_plan (void)
{
  const uint64_t a = curlim.align, end = cur.offset + cur.count;
  uint64_t expect = rdown (cur.offset, a);
  struct plan_chunk c;

  /* The middle chunks of a long bounced request differ only in where
   * they are: their page vectors are checked at a sample (the first 16,
   * every 64th, the last), the rest of the invariants on every chunk.
   */
  size_t k = 0;
  for (size_t done = 0; done < cur.count; done = c.next, k++) {
    plan_chunk (&cur, &curlim, done, &c);
    check_chunk (&c, done, expect, k < 16 || k % 64 == 0 ||
                 c.next == cur.count);
    expect = c.file_off + c.file_len;
  }
  ENSURE (expect == rup (end, a), "the chunks end at %" PRIu64 ", the rounded"
          " request at %" PRIu64, expect, rup (end, a));
}

/* ---- execution on the memory disk ---------------------------------------- */

static unsigned char guard_bytes[GUARD];

static struct {
  bool ready;
  struct pdio_image img;
  struct pdio_thread *t;
  struct mem_disk disk;
  unsigned char *ref, *area;
} sim;

static void
sim_setup (void)
{
  uint64_t s = 0x9e3779b97f4a7c15ULL;

  sim.disk.data = malloc (DISK);
  sim.ref = malloc (DISK);
  sim.area = mmap (NULL, DISK + 3 * GUARD, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (!sim.disk.data || !sim.ref || sim.area == MAP_FAILED)
    abort ();
  for (size_t i = 0; i < DISK; i++) {
    s ^= s << 13; s ^= s >> 7; s ^= s << 17;
    sim.disk.data[i] = s >> 24;
  }
  memcpy (sim.ref, sim.disk.data, DISK);
  memset (guard_bytes, 0x3c, GUARD);
  sim.img.file = (char *) "fuzz";
  sim.img.fd = sim.img.tail_fd = -1;
  /* The pool's bounce region is made for the largest cap an input picks. */
  sim.img.bounce_cap = BOUNCE_CAP;
  range_lock_init (&sim.img.lock);
  {
    const struct pdio_thread_config cfg = {
      .pool_bytes = PDIO_POOL_BOUNCE_ONLY, .ring_entries = 4,
    };
    if (pdio_thread_new (&sim.img, &cfg, &sim.t) != 0)
      abort ();
    thread_set_backend (sim.t, &mem_backend, &sim.disk);
  }
  sim.ready = true;
}

static void
execute (const uint8_t *data, size_t size, unsigned short_every,
         unsigned eagain_every, size_t residue)
{
  unsigned char *buf = sim.area + GUARD + residue;
  size_t eof = DISK;
  uint64_t seed = get (data, size, 20, 8) | 1;
  int r;

  if (!cur.write && get (data, size, 19, 1)) {
    eof = cur.offset + get (data, size, 19, 1) * cur.count / 256 + 1;
    if (eof > DISK)
      eof = DISK;
  }
  sim.img.geo.offset_align = sim.img.geo.read_align = curlim.align;
  sim.img.geo.mem_align = curlim.mem_align;
  sim.img.geo.size = eof;
  sim.img.size = eof;
  sim.img.bounce_cap = curlim.bounce_cap;
  sim.disk.align = curlim.align;
  sim.disk.mem_align = curlim.mem_align;
  sim.disk.size = eof;
  sim.disk.short_every = short_every;
  sim.disk.eagain_every = eagain_every;
  sim.disk.transfers = sim.disk.violations = 0;

  memset (sim.area, 0x3c, GUARD + residue + cur.count + GUARD);
  /* Stale bounce memory is a canary: it must never reach the client. */
  memset (sim.t->pool.mem, 0xa5, sim.t->pool.size);
  if (cur.write) {
    for (size_t i = 0; i < cur.count; i++) {
      seed ^= seed << 13; seed ^= seed >> 7; seed ^= seed << 17;
      buf[i] = seed >> 32;
    }
    memcpy (sim.ref + cur.offset, buf, cur.count);
  }

  r = engine_rw_direct (sim.t, cur.write, (char *) buf, cur.count,
                        cur.offset);
  ENSURE (r == 0, "engine_rw_direct failed: %s (short every %u, EAGAIN"
          " every %u, eof %zu)", strerror (-r), short_every, eagain_every,
          eof);
  ENSURE (sim.disk.violations == 0, "the memory disk saw %lu O_DIRECT"
          " violations", sim.disk.violations);
  if (cur.write)
    ENSURE (memcmp (sim.disk.data, sim.ref, DISK) == 0, "the disk differs"
            " from the reference after the write");
  else {
    size_t valid = cur.offset >= eof ? 0 : eof - cur.offset < cur.count
      ? eof - cur.offset : cur.count;
    ENSURE (memcmp (buf, sim.ref + cur.offset, valid) == 0, "read data"
            " differs from the reference (eof %zu)", eof);
    for (size_t i = valid; i < cur.count; i++)
      ENSURE (buf[i] == 0, "byte %zu past end of file (%zu) reads 0x%02x", i,
              eof, buf[i]);
  }
  ENSURE (memcmp (sim.area, guard_bytes, GUARD) == 0 &&
          memcmp (sim.area + GUARD, guard_bytes, residue) == 0,
          "wrote before the buffer");
  ENSURE (memcmp (buf + cur.count, guard_bytes, GUARD) == 0,
          "wrote past the buffer");
}

int
LLVMFuzzerTestOneInput (const uint8_t *data, size_t size)
{
  const uint8_t flags = get (data, size, 18, 1);
  const bool exec = flags & 2;
  unsigned short_every = (flags >> 2) & 7, eagain_every = (flags >> 5) & 7;
  size_t residue = get (data, size, 16, 2);

  if (!plan_pages) {
    plan_pages = calloc (PLAN_PAGES, sizeof (void *));
    if (!plan_pages)
      abort ();
  }
  curlim.align = 512u << (get (data, size, 0, 1) % 8);
  curlim.mem_align = 1u << (get (data, size, 1, 1) % 13);
  if (curlim.mem_align > curlim.align)
    curlim.mem_align = curlim.align;
  curlim.bounce_cap = 2 * (size_t) curlim.align +
    get (data, size, 2, 2) * 37 % (BOUNCE_CAP - 2 * (size_t) curlim.align + 1);
  cur.write = flags & 1;
  cur.offset = get (data, size, 4, 8) % ((uint64_t) 1 << 40);
  {
    uint64_t raw = get (data, size, 12, 4), scale = raw >> 27;
    uint64_t limit = scale < 22 ? (uint64_t) 16 << scale : PDIO_MAX_REQUEST;
    cur.count = 1 + (raw & 0x07ffffff) % limit;
  }
  if (eagain_every == 1)
    eagain_every = 0;           /* every transfer refused is an error */

  if (exec) {
    cur.offset %= DISK;
    cur.count = 1 + (cur.count - 1) % (DISK - cur.offset);
    if (!sim.ready)
      sim_setup ();
    cur.buf = (uintptr_t) sim.area + GUARD + residue;
  }
  else
    cur.buf = USER_BASE + residue;

  check_plan ();
  if (exec)
    execute (data, size, short_every, eagain_every, residue);
  return 0;
}
