/* SPDX-License-Identifier: BSD-3-Clause */
/* What the engine's files share; not part of the API. */
#ifndef PDIO_ENGINE_INTERNAL_H
#define PDIO_ENGINE_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <sys/queue.h>

#include <liburing.h>

#include "engine.h"
#include "geometry.h"
#include "io.h"
#include "pool.h"
#include "range_lock.h"
#include "rounding.h"

/* nbdkit never sends more than 64 MiB; neither may anyone else. */
#define PDIO_MAX_REQUEST ((size_t) 64 << 20)
/* What we advertise as the maximum block size. */
#define PDIO_MAX_BLOCK ((uint32_t) 32 << 20)
/* Zero pages that zeroing writes come from (read-only, never touched). */
#define ZERO_LEN ((size_t) 1 << 20)
/* Bounce bytes one chunk of a request may use: enough for a 1 MiB request
 * at any offset with 4 KiB blocks in one chunk, and for larger requests in
 * a few.  Also the size of every pool's bounce region.
 */
#define BOUNCE_CAP ((size_t) 2 << 20)

struct engine_counters {
  _Atomic uint64_t reads, writes, direct, bounced, bounced_bytes;
  _Atomic uint64_t rmw_blocks, tail_writes;
  _Atomic uint64_t zero_fallocate, zero_written, flushes;
  _Atomic uint64_t helper_calls, file_checks;
  struct io_counters io;
};

/* A blocking call for the helper thread (helper.c): run() there, then
 * done.fn on t, from its poll.
 */
struct helper_job {
  STAILQ_ENTRY (helper_job) link;
  void (*run) (struct helper_job *j);
  struct pdio_thread *t;
  struct thread_work done;
};

struct helper {
  pthread_mutex_t lock;
  pthread_cond_t cond;
  STAILQ_HEAD (, helper_job) jobs;
  bool started, stop;
  pthread_t tid;
};

struct pdio_image {
  char *file;
  int fd;                       /* O_DIRECT */
  int tail_fd;                  /* buffered, only for the sub-alignment
                                   tail of the image; -1 if read-only or
                                   a block device */
  struct geometry geo;          /* geo.size: the size at open */
  /* The size served: geo.size until pdio_refresh_size.  A request reads
   * it once, as it starts (req_state.size), and keeps that value for
   * every step.
   */
  _Atomic uint64_t size;
  bool readonly;
  bool on_fuse;                 /* see check_filesystem() */
  enum pdio_backend backend;    /* URING or PSYNC */
  size_t bounce_cap;            /* bounce bytes per chunk (BOUNCE_CAP) */
  bool bounce_canary;           /* see pdio_config */
  atomic_bool told_changed;     /* logged that the file shrank or went */
  /* The file check's watch (engine.c): inotify on the image for opens
   * and link-count changes, -1 without; watch_gen counts the times a
   * thread found events on it.
   */
  int watch_fd;
  _Atomic uint64_t watch_gen;
  atomic_bool told_unlocked;    /* logged that a reserve is not locked */
  struct range_lock lock;
  struct helper helper;         /* blocking calls, off the workers */
  atomic_uint threads;          /* pdio_threads alive */
  struct pdio_log log;
  char *zero_mem;               /* ZERO_LEN + PDIO_PAGE_SIZE zero bytes */
  /* fallocate modes that answered EOPNOTSUPP, so we stop trying them. */
  atomic_bool no_punch, no_zero_range;
  struct engine_counters stats;
};

/* A request waiting for bounce memory. */
struct bounce_wait {
  STAILQ_ENTRY (bounce_wait) link;
  size_t len;
  void (*granted) (struct bounce_wait *w, void *mem);   /* from poll */
};

/* A CQE's contents, taken off the CQ. */
struct cqe_copy {
  struct pdio_completion *c;
  int res;
  uint32_t flags;
};

/* One worker thread's engine state; see engine.h.  Only its owner thread
 * touches it, except remote_* (under remote_lock).
 */
struct pdio_thread {
  struct pdio_image *img;
  pthread_t owner;
  bool have_ring;
  struct io_uring ring;
  bool file_on_ring;            /* the image's I/O goes on the ring */
  bool fixed_file;              /* the image is registered file 0 */
  bool fixed_buf;               /* a table of one buffer per pool chunk */
  bool on_valgrind;             /* waits never sleep in the ring (thread.c) */
  const struct io_backend *backend;   /* when !file_on_ring */
  void *backend_state;
  struct psync_files files;

  struct pool pool;
  /* Requests waiting for bounce memory, FIFO. */
  STAILQ_HEAD (, bounce_wait) mem_waiters;
  bool buf_freed;               /* pool memory came back since last poll */
  void (*on_buf_free) (void *opaque);
  void *on_buf_free_opaque;

  /* Deferred work, FIFO. */
  STAILQ_HEAD (, thread_work) work;
  /* Work queued by other threads (range lock grants). */
  pthread_mutex_t remote_lock;
  pthread_cond_t remote_cond;   /* for thread_wait_remote */
  STAILQ_HEAD (, thread_work) remote;
  atomic_bool remote_pending;
  int efd;                      /* eventfd: remote work arrived */
  uint64_t efd_value;
  struct pdio_completion efd_comp;

  /* CQEs reaped to make CQ room while an SQE was wanted, for the next
   * poll to dispatch (pdio_thread_sqe).
   */
  struct cqe_copy *stash;
  size_t stash_n, stash_cap;
#ifdef PDIO_TEST_BREAKS
  unsigned fault_busy;          /* submits that fail with EBUSY */
  bool fault_busy_owed;         /* ... until CQEs are reaped */
#endif

  /* The file check's answer (engine_check_file).  round counts the
   * times this thread took in events (pdio_thread_poll, each batch of
   * CQEs); checked_size is the size the last fstat that found the file
   * still linked saw, and checked_round the round it was made in (0:
   * none to reuse).
   */
  uint64_t round;
  uint64_t checked_round;
  uint64_t checked_size;
  /* With the image's watch polled on this ring, an answer holds until an
   * event says the file may have changed (or for a while), not only for
   * its round.
   */
  bool watching;
  uint64_t watch_gen;           /* img->watch_gen the answer was made at */
  uint64_t checked_ms;          /* and when (engine.c's coarse clock) */
  struct pdio_completion watch_comp;

  unsigned requests;            /* in flight, for pdio_thread_free */
  bool counted;                 /* in img->threads */
};

#define COUNT(img, field, n) \
  atomic_fetch_add_explicit (&(img)->stats.field, (n), memory_order_relaxed)

extern void engine_log (const struct pdio_image *img,
                        enum pdio_log_level level, const char *fmt, ...)
  __attribute__ ((format (printf, 3, 4)));
#define engine_error(img, ...) engine_log (img, PDIO_LOG_ERROR, __VA_ARGS__)
#define engine_warning(img, ...) \
  engine_log (img, PDIO_LOG_WARNING, __VA_ARGS__)
#define engine_debug(img, ...) engine_log (img, PDIO_LOG_DEBUG, __VA_ARGS__)

/* The image file shrank or was deleted while served: say so once. */
extern void engine_tell_changed (struct pdio_image *img, const char *what);

/* Below, size is the size a request started with (req_state.size). */

/* pdio_check_range against that size. */
extern int engine_check_range (const struct pdio_image *img, uint64_t size,
                               enum pdio_op op, uint64_t offset,
                               uint64_t count);

/* Writes at or past this offset go through tail_fd: the image's last,
 * partial block.
 */
static inline uint64_t
engine_direct_end (const struct pdio_image *img, uint64_t size)
{
  return ROUND_DOWN (size, img->geo.offset_align);
}

/* The span a write of [offset, offset+count) may touch, for the range
 * lock: block-rounded, and for a tail write the whole page/fs block.
 */
extern void engine_write_span (const struct pdio_image *img, uint64_t size,
                               uint64_t offset, uint64_t count,
                               uint64_t *start, uint64_t *end);

/* Refuses I/O to a file that was deleted, or that is now shorter than end
 * (0: only the deletion check), as t saw it in round arrived or later, or
 * with the image's watch quiet when by_ring (the request came in through
 * a completion on t's ring: its front end gave its round); see engine.c.
 * 0 or -errno.
 */
extern int engine_check_file (struct pdio_thread *t, uint64_t arrived,
                              bool by_ring, uint64_t size, uint64_t end);
/* The image's watch for the file check: set up at open (-1 when it cannot
 * be had), and what a thread does when its poll of it fires.
 */
extern void engine_watch_file (struct pdio_image *img);
extern void engine_file_event (struct pdio_image *img);
/* A new round for the file check: t is about to take in events that may
 * carry new requests (thread.c).
 */
static inline void
thread_new_round (struct pdio_thread *t)
{
  t->round++;
}

/* Whole allocation units inside [offset, end), never past the last whole
 * one of a file (zero.c).
 */
extern void engine_whole_units (const struct pdio_image *img, uint64_t size,
                                uint64_t offset, uint64_t end, uint64_t *u0,
                                uint64_t *u1);

/* Pool memory for a request's bounce (thread.c).  NULL when short: the
 * request is then queued (thread_wait_bounce) and resumed when memory
 * comes back.
 */
extern void *thread_get_bounce (struct pdio_thread *t, size_t len);
extern void thread_put_bounce (struct pdio_thread *t, void *mem, size_t len);
extern void thread_wait_bounce (struct pdio_thread *t, struct bounce_wait *w);
/* Sleeps until another thread queued work for t (a range lock grant, a
 * helper thread's call done).
 * For the start-and-wait API while its request waits for a range: a plain
 * futex wait, not a ring wait that depends on another thread (valgrind,
 * for one, holds its big lock across io_uring_enter).
 */
extern void thread_wait_remote (struct pdio_thread *t);
/* Does r wait for another thread: queued behind another range, or a
 * call of it on the helper thread (req.c)?
 */
extern bool req_waits_remote (struct pdio_req *r);

/* The helper thread (helper.c).  helper_queue: j->run on the helper,
 * then j->done.fn on j->t from its poll; never inline.
 */
extern void helper_init (struct helper *h);
extern void helper_queue (struct pdio_image *img, struct helper_job *j);
extern void helper_destroy (struct helper *h);

#ifdef PDIO_TEST_BREAKS
/* In the test build only (the engine's sources compiled into a test with
 * -DPDIO_TEST_BREAKS, as pdio(1)'s break points are): the next n submits
 * of pdio_thread_sqe with a full SQ fail with EBUSY, each until the
 * thread reaps completions, as the kernel's do while its CQ overflows.
 */
extern void thread_fault_busy (struct pdio_thread *t, unsigned n);
#endif

/* Can this process use io_uring at all?  0 or -errno (thread.c). */
extern int backend_uring_available (void);
/* For tests: the image's I/O through b (synchronous) instead of the ring. */
extern void thread_set_backend (struct pdio_thread *t,
                                const struct io_backend *b, void *state);

/* pdio_submit, or with raw a bare direct read or write of the request's
 * range -- no range check, file check, lock or tail handling (the
 * planner's tests and fuzzer, on a memory disk) (req.c).
 */
extern void req_start (struct pdio_thread *t, struct pdio_req *r, bool raw);

/* Start-and-wait (sync.c); engine_rw_direct for the tests' raw requests. */
extern int engine_rw_direct (struct pdio_thread *t, bool write, char *buf,
                             size_t count, uint64_t offset);

#endif /* PDIO_ENGINE_INTERNAL_H */
