/* SPDX-License-Identifier: BSD-3-Clause */
/* A request's completion as the engine's tests wait for it: done() sets
 * the flag (once: a second call is the bug), and the test polls the
 * submitting thread until it is set, since completions are only ever
 * reported from poll.
 */
#ifndef PDIO_TEST_REQ_DONE_H
#define PDIO_TEST_REQ_DONE_H

#include <stdbool.h>

#include "engine.h"
#include "unit.h"

struct req_done {
  bool done;
  int err;
};

/* The done() of a request whose opaque is a struct req_done, or a struct
 * that starts with one.
 */
static inline void
req_done (struct pdio_req *r, int err)
{
  struct req_done *d = r->opaque;

  CHECK (!d->done, "done() ran twice");
  d->done = true;
  d->err = err;
}

static inline void
req_wait (struct pdio_thread *t, const struct req_done *d)
{
  while (!d->done)
    CHECK (pdio_thread_poll (t, 1, NULL) >= 0, "poll");
}

#endif
