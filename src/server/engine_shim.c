/* TEMPORARY (see engine_shim.h): the asynchronous engine contract on top
 * of the synchronous engine, so the server runs end to end before the
 * engine-async branch lands.  Requests run to completion inside
 * pdio_submit (the thread blocks on the file I/O, which the real engine
 * will not do) and their callbacks are deferred to the next
 * pdio_thread_poll, as the contract requires.  The pool is one mmap'd
 * region handed out in 4 KiB pages, lowest first fit (so the pages in use
 * stay few and resident memory flat).
 */
#include <config.h>

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "engine_shim.h"

#define PAGE 4096u

struct pdio_thread {
  struct pdio_image *img;
  struct io_uring ring;
  bool ring_ok;
  uint8_t *pool;
  size_t pages;
  uint8_t *used;                /* one byte per page */
  size_t lowest_free;           /* no free page below this one */
  struct pdio_req *done_head, *done_tail;
};

int
pdio_thread_new (struct pdio_image *img, const struct pdio_thread_config *cfg,
                 struct pdio_thread **tp)
{
  size_t bytes = cfg && cfg->pool_bytes ? cfg->pool_bytes : 64u << 20;
  unsigned entries = cfg && cfg->ring_entries ? cfg->ring_entries : 256;
  struct io_uring_params p = {
    .flags = IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN,
  };
  struct pdio_thread *t = calloc (1, sizeof *t);
  int r;

  if (t == NULL)
    return -ENOMEM;
  t->img = img;
  r = io_uring_queue_init_params (entries, &t->ring, &p);
  if (r == -EINVAL) {
    p = (struct io_uring_params) { .flags = 0 };
    r = io_uring_queue_init_params (entries, &t->ring, &p);
  }
  if (r < 0) {
    free (t);
    return r;
  }
  t->ring_ok = true;
  t->pages = (bytes + PAGE - 1) / PAGE;
  t->pool = mmap (NULL, t->pages * PAGE, PROT_READ | PROT_WRITE,
                  MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  t->used = calloc (t->pages, 1);
  if (t->pool == MAP_FAILED || t->used == NULL) {
    if (t->pool != MAP_FAILED)
      munmap (t->pool, t->pages * PAGE);
    t->pool = NULL;
    pdio_thread_free (t);
    return -ENOMEM;
  }
  *tp = t;
  return 0;
}

void
pdio_thread_free (struct pdio_thread *t)
{
  if (t == NULL)
    return;
  if (t->ring_ok)
    io_uring_queue_exit (&t->ring);
  if (t->pool)
    munmap (t->pool, t->pages * PAGE);
  free (t->used);
  free (t);
}

struct io_uring *
pdio_thread_ring (struct pdio_thread *t)
{
  return &t->ring;
}

struct io_uring_sqe *
pdio_thread_sqe (struct pdio_thread *t)
{
  struct io_uring_sqe *sqe = io_uring_get_sqe (&t->ring);

  if (sqe == NULL && io_uring_submit (&t->ring) >= 0)
    sqe = io_uring_get_sqe (&t->ring);
  return sqe;
}

int
pdio_thread_poll (struct pdio_thread *t, unsigned wait_nr,
                  const struct __kernel_timespec *timeout)
{
  struct io_uring_cqe *cqe;
  int r, n = 0;

  if (t->done_head)
    wait_nr = 0;                /* deferred callbacks are ready now */
  if (wait_nr)
    r = io_uring_submit_and_wait_timeout (&t->ring, &cqe, wait_nr,
                                          (struct __kernel_timespec *) timeout,
                                          NULL);
  else
    r = io_uring_submit_and_get_events (&t->ring);
  if (r < 0 && r != -ETIME && r != -EINTR)
    return r;

  for (;;) {
    struct io_uring_cqe *cqes[64];
    struct { struct pdio_completion *c; int res; uint32_t flags; } ev[64];
    unsigned got = io_uring_peek_batch_cqe (&t->ring, cqes, 64);

    if (got == 0)
      break;
    /* Copy out and advance first: a callback may queue and submit. */
    for (unsigned i = 0; i < got; i++) {
      ev[i].c = io_uring_cqe_get_data (cqes[i]);
      ev[i].res = cqes[i]->res;
      ev[i].flags = cqes[i]->flags;
    }
    io_uring_cq_advance (&t->ring, got);
    for (unsigned i = 0; i < got; i++)
      if (ev[i].c)
        ev[i].c->fn (ev[i].c, ev[i].res, ev[i].flags);
    n += got;
  }

  while (t->done_head) {
    struct pdio_req *q = t->done_head;

    t->done_head = q->priv.next;
    if (t->done_head == NULL)
      t->done_tail = NULL;
    q->done (q, q->priv.err);
    n++;
  }
  return n;
}

void *
pdio_buf_get (struct pdio_thread *t, size_t len)
{
  size_t need = (len + PAGE - 1) / PAGE, run = 0;

  if (need == 0)
    need = 1;
  for (size_t i = t->lowest_free; i < t->pages; i++) {
    run = t->used[i] ? 0 : run + 1;
    if (run == need) {
      size_t first = i + 1 - need;

      memset (t->used + first, 1, need);
      if (first == t->lowest_free)
        t->lowest_free = i + 1;
      return t->pool + first * PAGE;
    }
  }
  return NULL;
}

void
pdio_buf_put (struct pdio_thread *t, void *buf, size_t len)
{
  size_t first = ((uint8_t *) buf - t->pool) / PAGE;
  size_t need = (len + PAGE - 1) / PAGE;

  if (need == 0)
    need = 1;
  memset (t->used + first, 0, need);
  if (first < t->lowest_free)
    t->lowest_free = first;
}

void
pdio_submit (struct pdio_thread *t, struct pdio_req *r)
{
  int err;

  switch (r->op) {
  case PDIO_OP_READ:
    err = pdio_read (t->img, r->buf, r->count, r->offset);
    break;
  case PDIO_OP_WRITE:
    err = pdio_write (t->img, r->buf, r->count, r->offset, r->flags);
    break;
  case PDIO_OP_ZERO:
    err = pdio_zero (t->img, r->count, r->offset, r->flags);
    break;
  case PDIO_OP_TRIM:
    err = pdio_trim (t->img, r->count, r->offset, r->flags);
    break;
  case PDIO_OP_FLUSH:
    err = pdio_flush (t->img);
    break;
  default:
    err = -EINVAL;
  }
  r->priv.err = err < 0 ? err : 0;
  r->priv.next = NULL;
  if (t->done_tail)
    t->done_tail->priv.next = r;
  else
    t->done_head = r;
  t->done_tail = r;
}
