/* SPDX-License-Identifier: BSD-3-Clause */
/* pdio engine: serve an image file or block device with every byte going
 * through O_DIRECT.  This is the whole public API; it knows nothing about
 * nbdkit.  Every call that can fail returns 0 or a negative errno, which is
 * what the caller should report to its client.
 *
 * Thread safety: one pdio_image is shared by any number of threads and
 * connections.  Each thread that does I/O creates its own pdio_thread (one
 * io_uring, a bounded buffer pool registered as it is used) and passes
 * it explicitly;
 * a pdio_thread is only ever touched by the thread that created it, so
 * create them after any fork.
 *
 * Requests are asynchronous (pdio_submit: starts, returns at once, calls
 * req->done from pdio_thread_poll); pdio_read/pdio_write/... are
 * start-and-wait wrappers over them.  An event loop on one thread:
 *
 *   pdio_thread_new (img, &(struct pdio_thread_config) { 0 }, &t);
 *   for (;;) {
 *     // socket I/O: sqe = pdio_thread_sqe (t); prep it;
 *     //   io_uring_sqe_set_data (sqe, &conn->recv_completion);
 *     // a request parsed: payload = pdio_buf_get (t, len) (NULL: stop
 *     //   reading this connection until the on_buf_free callback), then
 *     //   req->op/flags/offset/count/buf/done set; pdio_submit (t, req);
 *     pdio_thread_poll (t, 1, NULL);   // submits, waits, dispatches
 *   }
 *   // req->done (req, err) runs inside poll: queue the reply's SQE there.
 */
#ifndef PDIO_ENGINE_H
#define PDIO_ENGINE_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <linux/time_types.h>           /* struct __kernel_timespec */

enum pdio_backend {
  PDIO_BACKEND_DEFAULT = 0,     /* io_uring, or psync if io_uring is refused */
  PDIO_BACKEND_URING,           /* io_uring or fail */
  PDIO_BACKEND_PSYNC,           /* preadv2/pwritev2 on the same O_DIRECT fd */
};

/* Where the engine's messages go: nbdkit_verror/nbdkit_vdebug in the
 * plugin, stderr in the tools and tests.  Either may be NULL.
 */
struct pdio_log {
  void (*error) (const char *fmt, va_list args);
  void (*warning) (const char *fmt, va_list args);  /* served, but note it */
  void (*debug) (const char *fmt, va_list args);
};

/* Sends a message to fn, one of a pdio_log's three, if it is set: the one
 * way the engine and the servers built on it log.
 */
extern void pdio_log_msg (void (*fn) (const char *, va_list),
                          const char *fmt, ...)
  __attribute__ ((format (printf, 2, 3)));
/* The same, to the one of log's three that level names. */
enum pdio_log_level { PDIO_LOG_ERROR, PDIO_LOG_WARNING, PDIO_LOG_DEBUG };
extern void pdio_vlog (const struct pdio_log *log, enum pdio_log_level level,
                       const char *fmt, va_list args)
  __attribute__ ((format (printf, 3, 0)));

struct pdio_config {
  const char *file;             /* regular file or block device */
  bool readonly;                /* open read-only even if writable */
  enum pdio_backend backend;
  uint32_t align;               /* raise the direct-I/O alignment; 0 = as found */
  bool bounce_canary;           /* testing: fill bounce pages with
                                   PDIO_CANARY whenever they are free, so a
                                   leak of stale bounce memory shows */
  bool lock_later;              /* the caller takes the image lock with
                                   pdio_lock_image before any request: a server
                                   that takes over from another prepares
                                   while the other still holds it */
  struct pdio_log log;
};

#define PDIO_CANARY 0xa5

struct pdio_image;

/* Opens and checks the image.  Errors are logged through cfg->log with a
 * message that names what is wrong; the return value is -errno.
 */
extern int pdio_open (const struct pdio_config *cfg, struct pdio_image **imgp);
extern void pdio_close (struct pdio_image *img);
/* With lock_later: takes the image lock (0, or -EBUSY with the holder
 * named in the log).
 */
extern int pdio_lock_image (struct pdio_image *img);
/* Lets go of the image lock before pdio_close, once no request will run
 * any more: a server handing over lets its successor take the image
 * while its own threads are still being torn down.
 */
extern void pdio_unlock_image (struct pdio_image *img);

struct pdio_info {
  uint64_t size;
  bool readonly;                /* opened read-only (asked, or forced) */
  bool blockdev;
  bool can_extents;             /* SEEK_DATA/SEEK_HOLE work on it */
  uint32_t offset_align;        /* direct-I/O offset and length alignment */
  uint32_t mem_align;           /* direct-I/O memory alignment */
  uint32_t fs_block;            /* allocation unit: holes come in these */
  /* What to advertise: minimum 1 (any byte offset works, with
   * read-modify-write below the alignment), preferred = the direct-I/O
   * alignment (at least 512: no read-modify-write at or above it, and the
   * kernel client's logical block size), maximum 32 MiB.
   */
  uint32_t block_min, block_preferred, block_max;
  enum pdio_backend backend;    /* URING or PSYNC, as chosen */
};
extern void pdio_get_info (const struct pdio_image *img, struct pdio_info *info);

/* The size served now (what pdio_get_info says as .size): requests are
 * checked against it.  One atomic load, for a front end's per-request
 * checks.
 */
extern uint64_t pdio_size (const struct pdio_image *img);
/* Takes the image's size as it is now (a file grown or shrunk with
 * ftruncate, a block device resized) as the size served from the next
 * request on; requests already started keep the size they started with
 * (and those submitted with PDIO_SIZED are judged against the size they
 * carry).  Safe from any thread.  Sets *size and returns 0, or -errno (the size
 * served stays as it was).
 */
extern int pdio_refresh_size (struct pdio_image *img, uint64_t *size);

/* Request flags. */
#define PDIO_FUA       1u       /* durable before returning */
#define PDIO_MAY_TRIM  2u       /* zero: may deallocate */
#define PDIO_FAST_ZERO 4u       /* zero: fail with ENOTSUP rather than write */
#define PDIO_REQ_ONE   8u       /* extents: the first extent only */
#define PDIO_HELD     16u       /* write: the caller holds a PDIO_OP_LOCK
                                   request covering it, so it takes no
                                   range lock of its own; writes in flight
                                   together must then not share a block
                                   of the alignment (at most 1 MiB) */
#define PDIO_SIZED    32u       /* checked against r->size, not the size
                                   served now (pdio_req.size) */

/* ---- per-thread context ------------------------------------------------ */

/* One worker thread's engine state: ONE io_uring (IORING_SETUP_SINGLE_ISSUER
 * | DEFER_TASKRUN when available; only the creating thread may touch it)
 * with the image registered as fixed file 0, a bounded buffer pool whose
 * 2 MiB chunks are registered as fixed buffers while in use, and the
 * engine's queues of deferred work.
 * A front end may put its own (socket) SQEs on the same ring.
 */
struct pdio_thread;

struct pdio_thread_config {
  /* Bytes of the pool (its bound): the engine's bounce region (always
   * pdio_thread_bounce_bytes(), for unaligned requests) plus what is left
   * for pdio_buf_get.  0 = PDIO_POOL_DEFAULT; anything below the bounce
   * region (e.g. PDIO_POOL_BOUNCE_ONLY) means the bounce region alone,
   * which is all a front end that never calls pdio_buf_get needs.
   */
  size_t pool_bytes;
  unsigned ring_entries;        /* 0 = PDIO_RING_DEFAULT */
  /* Chunks of 2 MiB of the buffer region kept resident, registered and
   * locked in memory (mlock) for the thread's whole life, never given
   * back by pdio_thread_trim: pdio_buf_get calls that fit them allocate
   * nothing and fault nothing in, however long the thread was idle (a
   * server's forward progress under memory pressure).  0: none.  If the
   * memlock limit refuses the lock, that is logged once and the reserve
   * is kept resident, unlocked (and unregistered if the limit refused
   * that too).
   */
  unsigned reserve_chunks;
};
#define PDIO_POOL_DEFAULT ((size_t) 64 << 20)
#define PDIO_POOL_BOUNCE_ONLY ((size_t) 1)
#define PDIO_RING_DEFAULT 256u

/* 0 or -errno.  Call it from the thread that will use it. */
extern int pdio_thread_new (struct pdio_image *img,
                            const struct pdio_thread_config *cfg,
                            struct pdio_thread **tp);
/* Nothing may be in flight (every done() has run, every SQE the front end
 * queued has completed).
 */
extern void pdio_thread_free (struct pdio_thread *t);
extern struct pdio_image *pdio_thread_image (const struct pdio_thread *t);
/* The bounce region every pool has (bytes). */
extern size_t pdio_thread_bounce_bytes (const struct pdio_image *img);

/* Every SQE on the ring, the engine's or the front end's, carries a
 * pointer to one of these as user_data (io_uring_sqe_set_data).  Whoever
 * queued the SQE owns the struct (usually embedded in a bigger one, found
 * back with container_of, src/common/container_of.h).
 */
struct pdio_completion {
  void (*fn) (struct pdio_completion *c, int res, uint32_t cqe_flags);
};

/* liburing's types; this header does not need <liburing.h> itself. */
struct io_uring;
struct io_uring_sqe;

/* The thread's ring, or NULL if this process cannot use io_uring at all
 * (the engine then runs on psync and poll waits on an eventfd).
 */
extern struct io_uring *pdio_thread_ring (struct pdio_thread *t);
/* The thread's current round, for pdio_req.arrived: take it once the
 * first bytes of a request are in (from the completion that brought them,
 * or any time after: later is only more cautious).
 */
extern uint64_t pdio_thread_round (const struct pdio_thread *t);
/* An SQE to fill.  When the SQ is full, submits what is queued; when the
 * kernel takes nothing until the CQ has room, reaps completions first
 * (they are dispatched by the next pdio_thread_poll, never inside this
 * call).  NULL only if there is no ring or submission itself fails.
 */
extern struct io_uring_sqe *pdio_thread_sqe (struct pdio_thread *t);

/* Submits what is queued; waits until at least wait_nr CQEs arrived
 * (0: do not wait; timeout NULL: no limit) -- but never waits while the
 * engine has deferred work of its own; then dispatches every available CQE
 * to its pdio_completion and runs the engine's deferred work (requests
 * resumed by a range unlock or a freed pool buffer, synchronous-backend
 * I/O, done() callbacks).  Returns the CQEs dispatched, or -errno (a
 * timeout is not an error).
 */
extern int pdio_thread_poll (struct pdio_thread *t, unsigned wait_nr,
                             const struct __kernel_timespec *timeout);

/* ---- buffers -------------------------------------------------------------- */

/* Page-aligned memory from the thread's registered pool (len rounded up
 * to a power-of-two number of 4 KiB pages).  NULL when the pool cannot
 * give len now: backpressure -- stop reading requests until a buffer comes
 * back (see pdio_thread_on_buf_free).  Memory from here used as a READ or
 * WRITE buffer goes straight to the kernel (fixed buffer, no copy) when
 * offset and count are aligned.  The engine's own bounce memory has a
 * separate region, so buffers held by a front end can never starve a
 * request the engine has started.
 */
extern void *pdio_buf_get (struct pdio_thread *t, size_t len);
extern void pdio_buf_put (struct pdio_thread *t, void *buf, size_t len);
/* The pool memory pdio_buf_get (t, len) takes: len rounded up as above.
 * A front end that bounds what it holds counts this, not len.
 */
extern size_t pdio_buf_cost (size_t len);
/* The largest len pdio_buf_get can ever satisfy (0: none). */
extern size_t pdio_buf_max (const struct pdio_thread *t);
/* fn(opaque) runs from pdio_thread_poll after pool memory was freed
 * (NULL: none), so a reader stalled on pdio_buf_get can resume.
 */
extern void pdio_thread_on_buf_free (struct pdio_thread *t,
                                     void (*fn) (void *opaque),
                                     void *opaque);
/* Pool memory is address space until used: a chunk becomes resident (and
 * registered, so pinned) when a buffer or bounce in it is first handed
 * out.  This gives back the chunks nothing was taken from for idle_secs
 * or more (about: the age is counted from the last call's now) by the
 * caller's clock now (seconds, never decreasing): they are unregistered
 * and their pages returned to the kernel, to come back zeroed when
 * needed; never the reserve (reserve_chunks).  For a loop's periodic
 * tick: a pass over a few dozen chunks, no system call unless something
 * is given back.  Returns the bytes given back.
 */
extern size_t pdio_thread_trim (struct pdio_thread *t, uint64_t now,
                                unsigned idle_secs);
/* Bytes of the pool now resident (in use since last given back, or
 * reserved), and of those the reserve: equal once all else went back.
 */
extern size_t pdio_thread_pool_resident (const struct pdio_thread *t);
extern size_t pdio_thread_pool_reserved (const struct pdio_thread *t);

/* ---- requests --------------------------------------------------------------- */

enum pdio_op {
  PDIO_OP_READ, PDIO_OP_WRITE, PDIO_OP_ZERO, PDIO_OP_TRIM, PDIO_OP_FLUSH,
  PDIO_OP_EXTENTS,              /* data and holes of [offset, offset+count):
                                   req->extent, see below */
  PDIO_OP_LOCK,                 /* holds the range a write of [offset,
                                   offset+count) locks: see pdio_unlock */
};

/* One extent of an EXTENTS request (or of pdio_extents): non-zero stops
 * the request (negative: as its error).
 */
typedef int (*pdio_extent_fn) (void *opaque, uint64_t offset,
                               uint64_t length, bool hole);

/* The engine's state of a request; its layout is private to
 * src/engine/req.c.
 */
#define PDIO_REQ_PRIVATE_SIZE 1536
struct pdio_req_private {
  union {
    unsigned char bytes[PDIO_REQ_PRIVATE_SIZE];
    uint64_t align_u64;
    void *align_ptr;
  } u;
};

struct pdio_req {
  /* The caller's, unchanged by the engine. */
  enum pdio_op op;
  unsigned flags;               /* PDIO_FUA, PDIO_MAY_TRIM, PDIO_FAST_ZERO */
  uint64_t offset;
  size_t count;
  void *buf;                    /* READ/WRITE: any memory; pool memory that
                                   is aligned as the geometry wants goes
                                   direct (no copy) */
  /* EXTENTS: called with opaque for each extent, in order, from
   * pdio_thread_poll on this thread (SEEK_DATA/SEEK_HOLE run on the
   * engine's helper thread, never on the caller's).
   */
  pdio_extent_fn extent;
  /* 0 or -errno, exactly once, always from pdio_thread_poll (never from
   * inside pdio_submit).  The request may be freed or reused in it.
   */
  void (*done) (struct pdio_req *r, int err);
  void *opaque;                 /* the caller's */
  /* The round of the submitting thread (pdio_thread_round) in which the
   * request began to come in, or 0: the round it is submitted in.  A
   * write, zero or flush may reuse a file check made since (pdio_submit).
   */
  uint64_t arrived;
  /* With PDIO_SIZED, the image's size (pdio_size) as the front end took
   * the request in: the pieces of a streamed request (and its lock) all
   * pass the one the whole request was judged against, so none of them
   * sees a resize made meanwhile.  Without it, the size served when the
   * request is submitted.
   */
  uint64_t size;
  /* The engine's: the caller must not touch it until done runs. */
  struct pdio_req_private priv;
};

/* Starts r and returns at once; r and its buffer must stay valid until
 * r->done runs.  Any number of requests may be in flight per thread.
 *
 * Writes, zeroes and flushes check that the image file was not deleted
 * or shrunk.  A thread's rounds run from one event to the next
 * (pdio_thread_poll called or returning, a batch of completions
 * dispatched), and one fstat serves every request that had arrived when
 * it was made: a request of r->arrived reuses a check made in that round
 * or later.  With r->arrived 0, the requests a thread submits in one
 * round share the first one's check, so submit in one round only
 * requests that had arrived by then: those that came in with the round's
 * completions, or waited in the front end since an earlier round.  The
 * start-and-wait wrappers, which poll between requests, always do.
 */
extern void pdio_submit (struct pdio_thread *t, struct pdio_req *r);

/* A write that arrives in pieces (a front end streaming a large payload)
 * keeps its whole range locked for its whole life: a PDIO_OP_LOCK request
 * is checked as a WRITE of its range would be (EPERM, ENOSPC, the file
 * check) and its done(0) runs once the range is held, queued in FIFO
 * order like any writer's.  The pieces are then PDIO_OP_WRITEs with
 * PDIO_HELD, each within the range.  The range stays held, and r (whose
 * engine state holds it) must stay valid, until pdio_unlock (t, r); not
 * after a done() with an error, which held nothing.
 */
extern void pdio_unlock (struct pdio_thread *t, struct pdio_req *r);

/* The NBD spec's errno rules for a request's range, in one place (also for
 * a front end that must refuse a request before reading its payload):
 * EPERM for write/zero/trim on a read-only image, EINVAL for read/write
 * over the maximum request size, EINVAL for read/trim/extents past the
 * end, ENOSPC for write/zero past the end.  0 if it may go on.
 */
extern int pdio_check_range (const struct pdio_image *img, enum pdio_op op,
                             uint64_t offset, uint64_t count);

/* ---- start-and-wait wrappers ------------------------------------------------- */

/* pdio_submit + pdio_thread_poll until done.  Only for a thread with no
 * other requests of its own in flight that it must serve meanwhile.
 */
extern int pdio_read (struct pdio_thread *t, void *buf, size_t count,
                      uint64_t offset);
extern int pdio_write (struct pdio_thread *t, const void *buf, size_t count,
                       uint64_t offset, unsigned flags);
extern int pdio_zero (struct pdio_thread *t, size_t count, uint64_t offset,
                      unsigned flags);
extern int pdio_trim (struct pdio_thread *t, size_t count, uint64_t offset,
                      unsigned flags);
extern int pdio_flush (struct pdio_thread *t);

/* Blocking (lseek SEEK_DATA/SEEK_HOLE on the calling thread, no device
 * I/O), any thread: for a front end whose threads may block (the nbdkit
 * plugin); an event loop submits PDIO_OP_EXTENTS instead.  Reports
 * [offset, offset+count) as a run of data and hole extents, in order,
 * through add(); stops early when add() returns non-zero or, with
 * req_one, after the first extent.
 */
extern int pdio_extents (struct pdio_image *img, size_t count,
                         uint64_t offset, bool req_one,
                         pdio_extent_fn add, void *opaque);

/* Counters since open, for logs and tests. */
struct pdio_stats {
  uint64_t reads, writes;       /* requests */
  uint64_t direct;              /* chunks whose middle went straight from/to
                                   the caller's memory */
  uint64_t bounced;             /* chunks copied through bounce pages */
  uint64_t bounced_bytes;       /* client bytes copied through bounce pages:
                                   0 for aligned requests in aligned memory */
  uint64_t rmw_blocks;          /* blocks read back for read-modify-write */
  uint64_t tail_writes;         /* writes into the sub-alignment image tail */
  uint64_t short_io;            /* short transfers resubmitted */
  uint64_t zero_fallocate;      /* zero/trim requests done by fallocate */
  uint64_t zero_written;        /* bytes of zeroes written out */
  uint64_t flushes;
  uint64_t helper_calls;        /* blocking calls run on the helper thread
                                   (extents batches, block-device discards) */
  uint64_t file_checks;         /* fstats of the deleted/shrunk check (one
                                   serves many writes: pdio_submit) */
};
extern void pdio_get_stats (const struct pdio_image *img,
                            struct pdio_stats *stats);
/* "reads=... writes=... direct=..." in buf. */
extern void pdio_format_stats (const struct pdio_stats *stats,
                               char *buf, size_t len);

#endif /* PDIO_ENGINE_H */
