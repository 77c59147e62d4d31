/* SPDX-License-Identifier: BSD-3-Clause */
/* The synchronous API: each call is pdio_submit and pdio_thread_poll until
 * the request's done() has run.  What the nbdkit plugin and the tests use;
 * one request in flight per thread, so the wait is the I/O itself.
 */
#include <config.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "container_of.h"
#include "engine_internal.h"

struct waiter {
  struct pdio_req r;
  bool finished;
  int err;
};

static void
waiter_done (struct pdio_req *r, int err)
{
  struct waiter *w = container_of (r, struct waiter, r);

  w->err = err;
  w->finished = true;
}

static int
wait_for (struct pdio_thread *t, struct pdio_req *r, bool raw)
{
  struct waiter *w = container_of (r, struct waiter, r);

  w->finished = false;
  r->done = waiter_done;
  req_start (t, r, raw);
  while (!w->finished) {
    int n;

    /* Queued behind another thread's range, or its call runs on the
     * helper thread: nothing of ours is on the ring, and the news comes
     * from that thread.
     */
    if (req_waits_remote (r))
      thread_wait_remote (t);
    n = pdio_thread_poll (t, 1, NULL);

    if (n < 0 && n != -EINTR) {
      /* The request's I/O uses the caller's memory: returning with any of
       * it still in flight would corrupt it.  This cannot happen with a
       * healthy ring; there is no safe way on.
       */
      fprintf (stderr, "pdio: waiting for I/O: %s\n", strerror (-n));
      abort ();
    }
  }
  return w->err;
}

static int
run_raw (struct pdio_thread *t, enum pdio_op op, unsigned flags, void *buf,
         size_t count, uint64_t offset, bool raw)
{
  struct waiter w = {
    .r = { .op = op, .flags = flags, .buf = buf, .count = count,
           .offset = offset },
  };

  return wait_for (t, &w.r, raw);
}

static int
run (struct pdio_thread *t, enum pdio_op op, unsigned flags, void *buf,
     size_t count, uint64_t offset)
{
  return run_raw (t, op, flags, buf, count, offset, false);
}

int
pdio_read (struct pdio_thread *t, void *buf, size_t count, uint64_t offset)
{
  return run (t, PDIO_OP_READ, 0, buf, count, offset);
}

int
pdio_write (struct pdio_thread *t, const void *buf, size_t count,
            uint64_t offset, unsigned flags)
{
  /* The engine only reads a write's buffer. */
  return run (t, PDIO_OP_WRITE, flags, (void *) buf, count, offset);
}

int
pdio_zero (struct pdio_thread *t, size_t count, uint64_t offset,
           unsigned flags)
{
  return run (t, PDIO_OP_ZERO, flags, NULL, count, offset);
}

int
pdio_trim (struct pdio_thread *t, size_t count, uint64_t offset,
           unsigned flags)
{
  return run (t, PDIO_OP_TRIM, flags, NULL, count, offset);
}

int
pdio_flush (struct pdio_thread *t)
{
  return run (t, PDIO_OP_FLUSH, 0, NULL, 0, 0);
}

int
engine_rw_direct (struct pdio_thread *t, bool write, char *buf, size_t count,
                  uint64_t offset)
{
  return run_raw (t, write ? PDIO_OP_WRITE : PDIO_OP_READ, 0, buf, count,
                  offset, true);
}
