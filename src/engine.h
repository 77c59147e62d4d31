/* pdio engine: serve an image file or block device with every byte going
 * through O_DIRECT.  This is the whole public API; it knows nothing about
 * nbdkit.  Every call that can fail returns 0 or a negative errno, which is
 * what the caller should report to its client.
 *
 * Thread safety: one pdio_image is shared by any number of threads and
 * connections.  Each thread gets its own io_uring and bounce pages the
 * first time it does I/O (so rings are always created after a fork).
 */
#ifndef PDIO_ENGINE_H
#define PDIO_ENGINE_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

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

struct pdio_config {
  const char *file;             /* regular file or block device */
  bool readonly;                /* open read-only even if writable */
  enum pdio_backend backend;
  uint32_t align;               /* raise the direct-I/O alignment; 0 = as found */
  bool bounce_canary;           /* testing: fill bounce pages with
                                   PDIO_CANARY whenever they are free, so a
                                   leak of stale bounce memory shows */
  struct pdio_log log;
};

#define PDIO_CANARY 0xa5

struct pdio_image;

/* Opens and checks the image.  Errors are logged through cfg->log with a
 * message that names what is wrong; the return value is -errno.
 */
extern int pdio_open (const struct pdio_config *cfg, struct pdio_image **imgp);
extern void pdio_close (struct pdio_image *img);

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

/* Request flags. */
#define PDIO_FUA       1u       /* durable before returning */
#define PDIO_MAY_TRIM  2u       /* zero: may deallocate */
#define PDIO_FAST_ZERO 4u       /* zero: fail with ENOTSUP rather than write */

extern int pdio_read (struct pdio_image *img, void *buf, size_t count,
                      uint64_t offset);
extern int pdio_write (struct pdio_image *img, const void *buf, size_t count,
                       uint64_t offset, unsigned flags);
extern int pdio_zero (struct pdio_image *img, size_t count, uint64_t offset,
                      unsigned flags);
extern int pdio_trim (struct pdio_image *img, size_t count, uint64_t offset,
                      unsigned flags);
extern int pdio_flush (struct pdio_image *img);

/* Reports [offset, offset+count) as a run of data and hole extents, in
 * order, through add(); stops early when add() returns non-zero or, with
 * req_one, after the first extent.
 */
typedef int (*pdio_extent_fn) (void *opaque, uint64_t offset,
                               uint64_t length, bool hole);
extern int pdio_extents (struct pdio_image *img, size_t count,
                         uint64_t offset, bool req_one,
                         pdio_extent_fn add, void *opaque);

/* Counters since open, for logs and tests. */
struct pdio_stats {
  uint64_t reads, writes;       /* requests */
  uint64_t direct;              /* chunks whose middle went straight from/to
                                   the caller's memory */
  uint64_t bounced;             /* chunks copied through bounce pages */
  uint64_t rmw_blocks;          /* blocks read back for read-modify-write */
  uint64_t tail_writes;         /* writes into the sub-alignment image tail */
  uint64_t short_io;            /* short transfers resubmitted */
  uint64_t zero_fallocate;      /* zero/trim requests done by fallocate */
  uint64_t zero_written;        /* bytes of zeroes written out */
  uint64_t flushes;
};
extern void pdio_get_stats (const struct pdio_image *img,
                            struct pdio_stats *stats);
/* "reads=... writes=... direct=..." in buf. */
extern void pdio_format_stats (const struct pdio_stats *stats,
                               char *buf, size_t len);

#endif /* PDIO_ENGINE_H */
