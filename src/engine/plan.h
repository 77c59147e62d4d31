/* SPDX-License-Identifier: BSD-3-Clause */
/* Block mapping: how one read or write of arbitrary offset, length and
 * buffer becomes direct I/O that meets the alignment.
 *
 * The span of the file touched is the request rounded out to the alignment.
 * When the caller's memory is aligned where the aligned middle of the
 * request starts, the middle goes straight to the caller's memory and only
 * a partial head or tail block goes through bounce pages: the whole request
 * is one chunk of up to three segments.  Otherwise every byte is copied
 * through the bounce pages, in chunks of at most the bounce capacity.  For
 * a write, partial head and tail blocks are read first (read-modify-write);
 * the caller holds the range lock over the rounded-out span while it does.
 *
 * The planner is pure: it decides, the executor in req.c (rw_run) does.  One
 * chunk is planned at a time from a byte count into the request, so there
 * is no cursor to leave half-advanced.
 */
#ifndef PDIO_PLAN_H
#define PDIO_PLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct plan_request {
  bool write;
  uint64_t offset;              /* client's range */
  size_t count;
  uintptr_t buf;                /* client's memory, for its alignment only */
};

struct plan_limits {
  uint32_t align;               /* file offset/length alignment, power of 2 */
  uint32_t mem_align;           /* memory alignment, power of 2, <= 4096 */
  size_t bounce_cap;            /* bounce bytes a chunk may use, >= 2*align */
};

enum plan_mem { PLAN_MEM_USER, PLAN_MEM_BOUNCE };

/* A run of memory that one part of the chunk's file span goes to or from.
 * The segments of a chunk cover its span in order, with no gaps.
 */
struct plan_seg {
  enum plan_mem mem;
  size_t mem_off;               /* into the client's buffer or the bounce */
  size_t len;                   /* multiple of align */
};

/* Bytes moved between the client's buffer and the bounce pages: after the
 * direct read for a read, before the direct write for a write.
 */
struct plan_copy {
  size_t user_off, bounce_off, len;
};

/* A block to read into the bounce pages before a write (RMW). */
struct plan_rmw {
  uint64_t file_off;
  size_t bounce_off;
};

struct plan_chunk {
  uint64_t file_off;            /* aligned */
  size_t file_len;              /* aligned, = sum of seg[].len */
  struct plan_seg seg[3];
  unsigned nseg;
  struct plan_rmw rmw[2];
  unsigned nrmw;                /* writes only */
  struct plan_copy copy[2];
  unsigned ncopy;
  size_t bounce_len;            /* bounce bytes this chunk uses */
  bool direct;                  /* the middle uses the client's memory */
  size_t next;                  /* request bytes done after this chunk */
};

/* Plans the chunk of req that starts `done` bytes into it (done is 0 or a
 * previous chunk's next).  req->count must be > done.
 */
extern void plan_chunk (const struct plan_request *req,
                        const struct plan_limits *lim, size_t done,
                        struct plan_chunk *c);

#endif /* PDIO_PLAN_H */
