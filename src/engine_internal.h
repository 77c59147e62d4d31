/* What the engine's files share; not part of the API. */
#ifndef PDIO_ENGINE_INTERNAL_H
#define PDIO_ENGINE_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "engine.h"
#include "geometry.h"
#include "io.h"
#include "range_lock.h"

/* nbdkit never sends more than 64 MiB; neither may anyone else. */
#define PDIO_MAX_REQUEST ((size_t) 64 << 20)
/* What we advertise as the maximum block size. */
#define PDIO_MAX_BLOCK ((uint32_t) 32 << 20)
/* Zero pages that zeroing writes come from (read-only, never touched). */
#define ZERO_LEN ((size_t) 1 << 20)

struct engine_counters {
  _Atomic uint64_t reads, writes, direct, bounced, rmw_blocks, tail_writes;
  _Atomic uint64_t zero_fallocate, zero_written, flushes;
  struct io_counters io;
};

struct pdio_image {
  char *file;
  int fd;                       /* O_DIRECT */
  int tail_fd;                  /* buffered, only for the sub-alignment
                                   tail of the image; -1 if there is none */
  struct geometry geo;
  bool readonly;
  bool on_fuse;                 /* see check_filesystem() */
  enum pdio_backend backend;    /* URING or PSYNC */
  uint64_t direct_end;          /* writes at or past this use tail_fd */
  size_t bounce_cap;            /* bounce bytes per chunk (BOUNCE_CAP) */
  bool bounce_canary;           /* see pdio_config */
  atomic_bool told_changed;     /* logged that the file shrank or went */
  struct range_lock lock;
  pthread_key_t ctx_key;
  pthread_mutex_t ctx_lock;     /* protects ctxs */
  struct io_ctx *ctxs;          /* every thread's context */
  struct pdio_log log;
  char *zero_mem;               /* ZERO_LEN + GEOMETRY_PAGE zero bytes */
  /* fallocate modes that answered EOPNOTSUPP, so we stop trying them. */
  atomic_bool no_punch, no_zero_range;
  struct engine_counters stats;
};

#define COUNT(img, field, n) \
  atomic_fetch_add_explicit (&(img)->stats.field, (n), memory_order_relaxed)

enum engine_log_level { ENGINE_LOG_ERROR, ENGINE_LOG_WARNING, ENGINE_LOG_DEBUG };
extern void engine_log (const struct pdio_image *img,
                        enum engine_log_level level, const char *fmt, ...)
  __attribute__ ((format (printf, 3, 4)));
#define engine_error(img, ...) engine_log (img, ENGINE_LOG_ERROR, __VA_ARGS__)
#define engine_warning(img, ...) \
  engine_log (img, ENGINE_LOG_WARNING, __VA_ARGS__)
#define engine_debug(img, ...) engine_log (img, ENGINE_LOG_DEBUG, __VA_ARGS__)

/* This thread's context, created on first use; NULL with errno on failure. */
extern struct io_ctx *engine_ctx (struct pdio_image *img);

/* The start of every write, zero: refuses a read-only or shrunk image and
 * ranges past its end, gets this thread's context and takes the range
 * lock.  0 (locked: release img->lock with *lock), 1 (nothing to do, not
 * locked) or -errno.
 */
extern int engine_begin_write (struct pdio_image *img, uint64_t offset,
                               uint64_t count, struct range_lock_entry *lock,
                               struct io_ctx **ctxp);

/* Locks the range a write of [offset, offset+count) may touch. */
extern void engine_lock_write (struct pdio_image *img,
                               struct range_lock_entry *e,
                               uint64_t offset, uint64_t count);

/* Direct I/O of any offset, length and memory, chunk by chunk: the
 * executor of plan_chunk().  Writes need the caller's range lock.
 */
extern int engine_rw_direct (struct pdio_image *img, struct io_ctx *ctx,
                             bool write, char *buf, size_t count,
                             uint64_t offset, int rw_flags);

/* Writes buf to [offset, offset+count) under the caller's range lock. */
extern int engine_write_locked (struct pdio_image *img, struct io_ctx *ctx,
                                const void *buf, size_t count,
                                uint64_t offset, unsigned flags);

/* Refuses I/O to a file that was deleted, or that is now shorter than end
 * (0: only the deletion check).  0 or -errno.
 */
extern int engine_check_file (struct pdio_image *img, uint64_t end);

/* Writes zeroes over [offset, offset+count) under the caller's lock. */
extern int engine_write_zeroes (struct pdio_image *img, struct io_ctx *ctx,
                                uint64_t offset, uint64_t count);

#endif /* PDIO_ENGINE_INTERNAL_H */
