/* The I/O layer: runs direct transfers described by dio_args to
 * completion on a per-thread context, whatever the backend.
 *
 * Short transfers are resubmitted for the remainder with the accumulated
 * offset (the remainder is rebuilt from the dio_args and a byte count, never
 * by advancing them).  A transfer that stopped off the alignment resumes
 * from the last aligned byte it reached (direct I/O cannot start anywhere
 * else; the partial block is simply transferred again).  EINTR and EAGAIN
 * are retried.  A read that twice stops at the same place without aligned
 * progress has reached end of file (once may be a filesystem's short
 * read): it reports how far it got and the caller zero-fills the rest.
 */
#ifndef PDIO_IO_H
#define PDIO_IO_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

#include "bounce.h"
#include "dio_args.h"

/* At most this many transfers go to the kernel together (two RMW reads). */
#define IO_MAX_OPS 2
/* Iovecs one transfer may need: head block, middle, tail block. */
#define IO_MAX_IOV 4
/* Give up on a transfer that keeps failing with EINTR or EAGAIN. */
#define IO_MAX_RETRIES 1000

struct io_ctx;

/* One transfer handed to the kernel. */
struct io_sub {
  bool write;
  int rw_flags;                 /* RWF_* */
  uint64_t offset;
  const struct iovec *iov;
  int iovcnt;
  ssize_t res;                  /* bytes, or -errno */
};

struct io_backend {
  const char *name;
  /* Runs subs[0..n) until each has a result.  Returns 0, or -errno when
   * the backend itself failed and no result means anything.  Must not
   * return while any of the transfers is still in flight.
   */
  int (*submit) (struct io_ctx *ctx, struct io_sub *subs, unsigned n);
  /* The bounce arena was (re)allocated: register it again if it cares. */
  void (*bounce_changed) (struct io_ctx *ctx);
  void (*destroy) (struct io_ctx *ctx);
};

extern const struct io_backend backend_psync;
extern const struct io_backend backend_uring;
/* Sets up io_uring on ctx (after ctx->fd is set).  Returns 0 or -errno. */
extern int backend_uring_init (struct io_ctx *ctx);
/* Can this process use io_uring at all?  0 or -errno. */
extern int backend_uring_available (void);

struct io_counters {
  _Atomic uint64_t short_io;
};

/* Per-thread state: the backend, the bounce arena and scratch space for
 * page vectors.  Never shared between threads.
 */
struct io_ctx {
  const struct io_backend *backend;
  void *backend_state;
  int fd;                       /* the image, opened O_DIRECT */
  struct io_counters *counters;
  struct bounce bounce;
  bool bounce_canary;           /* fill free bounce memory with PDIO_CANARY */
  void **pages;                 /* page slots for this thread's dio_args */
  unsigned pages_cap;
  struct io_ctx *next;          /* on the image's list of contexts */
};

/* One logical transfer: segs follow each other in the file. */
struct io_op {
  bool write;
  int rw_flags;
  uint32_t align;               /* of the file offsets, for resuming */
  const struct dio_args *segs;
  unsigned nsegs;
  size_t done;                  /* out: bytes transferred */
  int err;                      /* out: 0 or -errno */
  size_t stalled_at;            /* internal: where a read last stopped
                                   without aligned progress */
};

/* Runs ops[0..nops) (nops <= IO_MAX_OPS) together.  Returns 0 if every op
 * finished (reads may stop short at end of file: see op->done), else the
 * first op's error.
 */
extern int io_run (struct io_ctx *ctx, struct io_op *ops, unsigned nops);

/* Makes the bounce arena at least len bytes and tells the backend. */
extern int io_bounce_reserve (struct io_ctx *ctx, size_t len);

#endif /* PDIO_IO_H */
