/* SPDX-License-Identifier: BSD-3-Clause */
/* Block mapping planner; see plan.h. */
#include <config.h>

#include <assert.h>
#include <string.h>

#include "geometry.h"
#include "plan.h"
#include "rounding.h"

static void
add_seg (struct plan_chunk *c, enum plan_mem mem, size_t mem_off, size_t len)
{
  c->seg[c->nseg++] = (struct plan_seg) { mem, mem_off, len };
}

static void
add_copy (struct plan_chunk *c, size_t user_off, size_t bounce_off,
          size_t len)
{
  c->copy[c->ncopy++] = (struct plan_copy) { user_off, bounce_off, len };
}

static void
add_rmw (struct plan_chunk *c, uint64_t file_off, size_t bounce_off)
{
  c->rmw[c->nrmw++] = (struct plan_rmw) { file_off, bounce_off };
}

/* Can the aligned middle [mid_start, mid_end) of the request use the
 * client's memory directly?
 */
static bool
middle_is_direct (const struct plan_request *req,
                  const struct plan_limits *lim,
                  uint64_t mid_start, uint64_t mid_end)
{
  uintptr_t addr = req->buf + (mid_start - req->offset);

  return mid_start < mid_end && IS_ALIGNED (addr, lim->mem_align);
}

/* Head bounce block, the client's aligned middle, tail bounce block. */
static void
plan_direct (const struct plan_request *req, const struct plan_limits *lim,
             uint64_t mid_start, uint64_t mid_end, struct plan_chunk *c)
{
  const uint64_t a = lim->align;
  const uint64_t end = req->offset + req->count;
  size_t bounce = 0;

  c->direct = true;
  c->file_off = mid_start;
  if (req->offset < mid_start) {
    c->file_off = mid_start - a;
    add_seg (c, PLAN_MEM_BOUNCE, 0, a);
    add_copy (c, 0, req->offset - c->file_off, mid_start - req->offset);
    if (req->write)
      add_rmw (c, c->file_off, 0);
    bounce = a;
  }
  add_seg (c, PLAN_MEM_USER, mid_start - req->offset, mid_end - mid_start);
  if (end > mid_end) {
    add_seg (c, PLAN_MEM_BOUNCE, bounce, a);
    add_copy (c, mid_end - req->offset, bounce, end - mid_end);
    if (req->write)
      add_rmw (c, mid_end, bounce);
    bounce += a;
  }
  c->file_len = mid_end - c->file_off + (end > mid_end ? a : 0);
  c->bounce_len = bounce;
  c->next = req->count;
}

/* One bounce run covering [start, start+len) of the file, of which the
 * client's bytes are [ustart, uend).
 */
static void
plan_bounce (const struct plan_request *req, const struct plan_limits *lim,
             size_t done, struct plan_chunk *c)
{
  const uint64_t a = lim->align;
  const uint64_t end = req->offset + req->count;
  const uint64_t ustart = req->offset + done;
  const uint64_t start = ROUND_DOWN (ustart, a);
  const uint64_t cap = ROUND_DOWN (lim->bounce_cap, a);
  uint64_t cend = ROUND_UP (end, a);
  uint64_t uend;

  if (cend - start > cap)
    cend = start + cap;
  uend = cend < end ? cend : end;

  c->direct = false;
  c->file_off = start;
  c->file_len = cend - start;
  add_seg (c, PLAN_MEM_BOUNCE, 0, c->file_len);
  add_copy (c, ustart - req->offset, ustart - start, uend - ustart);
  if (req->write) {
    if (ustart > start)
      add_rmw (c, start, 0);
    /* The tail block, unless the head block read above is the same one. */
    if (uend < cend && !(ustart > start && cend - start == a))
      add_rmw (c, cend - a, c->file_len - a);
  }
  c->bounce_len = c->file_len;
  c->next = uend - req->offset;
}

void
plan_chunk (const struct plan_request *req, const struct plan_limits *lim,
            size_t done, struct plan_chunk *c)
{
  const uint64_t end = req->offset + req->count;
  const uint64_t mid_start = ROUND_UP (req->offset, lim->align);
  const uint64_t mid_end = ROUND_DOWN (end, lim->align);

  assert (done < req->count);
  assert (lim->bounce_cap >= 2 * (size_t) lim->align);
  memset (c, 0, sizeof *c);

  if (done == 0 && middle_is_direct (req, lim, mid_start, mid_end))
    plan_direct (req, lim, mid_start, mid_end, c);
  else
    plan_bounce (req, lim, done, c);
}
