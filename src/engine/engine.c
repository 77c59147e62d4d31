/* SPDX-License-Identifier: BSD-3-Clause */
/* The engine's shared rules: messages, the range check, the image
 * checks every write makes, the range a write locks, and what the image
 * advertises and has counted.  A request's path is in req.c (see req.h
 * and docs/design.md); opening an image in open.c; threads and rings in
 * thread.c; the helper thread for blocking calls in helper.c.
 */
#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <unistd.h>
#include <sys/inotify.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <time.h>
#include <linux/fs.h>

#include "engine_internal.h"
#include "pagesize.h"
#include "rounding.h"

/* ---- messages ---------------------------------------------------------- */

void
pdio_log_msg (void (*fn) (const char *, va_list), const char *fmt, ...)
{
  va_list args;

  if (fn == NULL)
    return;
  va_start (args, fmt);
  fn (fmt, args);
  va_end (args);
}

void
pdio_vlog (const struct pdio_log *log, enum pdio_log_level level,
           const char *fmt, va_list args)
{
  void (*fn) (const char *, va_list) =
    level == PDIO_LOG_ERROR ? log->error :
    level == PDIO_LOG_WARNING ? log->warning : log->debug;

  if (fn)
    fn (fmt, args);
}

void
engine_log (const struct pdio_image *img, enum pdio_log_level level,
            const char *fmt, ...)
{
  va_list args;

  va_start (args, fmt);
  pdio_vlog (&img->log, level, fmt, args);
  va_end (args);
}

void
engine_tell_changed (struct pdio_image *img, const char *what)
{
  if (!atomic_exchange (&img->told_changed, true))
    engine_error (img, "%s: %s while being served: refusing I/O that "
                  "would lose data or grow it back", img->file, what);
}

/* ---- rules ----------------------------------------------------------------- */

int
pdio_check_range (const struct pdio_image *img, enum pdio_op op,
                  uint64_t offset, uint64_t count)
{
  return engine_check_range (img, pdio_size (img), op, offset, count);
}

int
engine_check_range (const struct pdio_image *img, uint64_t size,
                    enum pdio_op op, uint64_t offset, uint64_t count)
{
  bool writes;

  /* A lock is the range of the write that will come in pieces. */
  if (op == PDIO_OP_LOCK)
    op = PDIO_OP_WRITE;
  writes = op == PDIO_OP_WRITE || op == PDIO_OP_ZERO || op == PDIO_OP_TRIM;
  switch (op) {
  case PDIO_OP_READ: case PDIO_OP_WRITE: case PDIO_OP_ZERO:
  case PDIO_OP_TRIM: case PDIO_OP_FLUSH: case PDIO_OP_EXTENTS:
    break;
  default:
    return -EINVAL;
  }
  /* Nothing is ever allocated or moved for more than this. */
  if ((op == PDIO_OP_READ || op == PDIO_OP_WRITE) &&
      count > PDIO_MAX_REQUEST)
    return -EINVAL;
  if (writes && img->readonly)
    return -EPERM;
  if (op == PDIO_OP_FLUSH)
    return 0;
  /* NBD: a write or zero past the end is "no space", anything else past
   * the end an invalid request.
   */
  if (offset > size || count > size - offset)
    return op == PDIO_OP_WRITE || op == PDIO_OP_ZERO ? -ENOSPC : -EINVAL;
  return 0;
}

void
engine_write_span (const struct pdio_image *img, uint64_t size,
                   uint64_t offset, uint64_t count, uint64_t *startp,
                   uint64_t *endp)
{
  uint64_t start = ROUND_DOWN (offset, img->geo.offset_align);
  uint64_t end = ROUND_UP (offset + count, img->geo.offset_align);
  uint64_t direct_end = engine_direct_end (img, size);

  /* A tail write dirties the whole page (and fs block) it lands in. */
  if (offset + count > direct_end) {
    uint64_t grain = img->geo.fs_block > PDIO_PAGE_SIZE
      ? img->geo.fs_block : PDIO_PAGE_SIZE;
    uint64_t tail_start = ROUND_DOWN (direct_end, grain);

    if (tail_start < start)
      start = tail_start;
    end = ROUND_UP (offset + count, grain);
  }
  *startp = start;
  *endp = end;
}

/* A file can shrink or be deleted under us.  A direct write past its end
 * would grow it back, and writes to a deleted file are lost at close: both
 * are refused, with one clear message.
 *
 * An fstat per request would be a system call per write (a round trip on
 * FUSE or NFS).  The image is watched instead (inotify, IN_OPEN |
 * IN_ATTRIB): whoever shrinks it opens it first (truncate(1), a shell's
 * redirection, cp), and whoever deletes or replaces it changes its link
 * count; pdio's own O_DIRECT writes raise neither.  Each thread with a
 * ring keeps a multishot poll of the watch on it (thread.c), so an answer
 * holds, with no system call, until an event arrives or for WATCH_TRUST_MS
 * at most: what the watch cannot see (a truncate(2) by path, or through a
 * descriptor opened before the server started: only IN_MODIFY, which our
 * own writes raise too) is then seen within that time, at the cost of one
 * fstat a second on a busy image, whatever the queue depth.  One inotify
 * instance per image, not per thread: they are few per user (128 by
 * default), and systemd and udev need theirs.  Events are drained by the
 * first thread whose poll fires, which bumps img->watch_gen before it
 * reads them; a thread whose own poll then finds the queue empty sees the
 * new generation instead.  The watch only stands for requests that came
 * in through the ring (the native server's: their front end gives the
 * round, pdio_req.arrived): an event queued before such a request's bytes
 * arrived is taken in before it when its receive was waiting, the poll's
 * wakeup coming first, in the same completion order.  A request read from
 * a backlog (its receive submitted after the event) may still be checked
 * with the answer from before, within WATCH_TRUST_MS.  A start-and-wait
 * caller (the nbdkit plugin) has polled nothing since its request came
 * in, so its requests keep the rule below.
 *
 * Without the watch (no inotify, no ring, psync) one fstat serves every
 * request that had arrived when it was made.  Arrival is counted in the
 * thread's rounds, from one event to the next (pdio_thread_poll called or
 * returning, a batch of completions taken in: thread_new_round): an fstat
 * made in round n started after everything that came in by round n, and
 * sees any truncate or unlink done before those requests were sent, so a
 * client that changes the file and then writes gets its error.
 *
 * Either way a request asks the file again when it ends past the size
 * seen (the file may have grown back, or been grown for
 * pdio_refresh_size: an answer from before a resize never refuses the
 * space it added).  The end checked is clipped to size, the size the
 * request started with (req_state.size), not the size at open: after a
 * resize that grew the image, a write past the old end must still find
 * the file that long.  Not caught: a change made after the answer --
 * between it and the write, or by someone racing the client -- and, with
 * the watch, for up to WATCH_TRUST_MS, a truncate(2) by path or through a
 * descriptor opened before the server started; this is a guard against
 * mistakes, not a lock.
 */
#define WATCH_TRUST_MS 1000

/* The coarse clock is read in user space (vDSO): no system call. */
static uint64_t
coarse_ms (void)
{
  struct timespec ts;

  clock_gettime (CLOCK_MONOTONIC_COARSE, &ts);
  return (uint64_t) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void
engine_watch_file (struct pdio_image *img)
{
  char path[64];

  img->watch_fd = -1;
  if (img->readonly || img->geo.blockdev)
    return;
  img->watch_fd = inotify_init1 (IN_NONBLOCK | IN_CLOEXEC);
  if (img->watch_fd == -1) {
    engine_debug (img, "%s: no inotify (%m): the file check asks the file "
                  "once per round", img->file);
    return;
  }
  snprintf (path, sizeof path, "/proc/self/fd/%d", img->fd);
  if (inotify_add_watch (img->watch_fd, path, IN_OPEN | IN_ATTRIB) == -1) {
    engine_debug (img, "%s: cannot watch it (%m): the file check asks the "
                  "file once per round", img->file);
    close (img->watch_fd);
    img->watch_fd = -1;
  }
}

void
engine_file_event (struct pdio_image *img)
{
  char buf[1024] __attribute__ ((aligned (__alignof__ (struct inotify_event))));

  /* Before the read: see the comment above. */
  atomic_fetch_add (&img->watch_gen, 1);
  while (read (img->watch_fd, buf, sizeof buf) > 0)
    ;
}

int
engine_check_file (struct pdio_thread *t, uint64_t arrived, bool by_ring,
                   uint64_t size, uint64_t end)
{
  struct pdio_image *img = t->img;
  uint64_t gen = atomic_load (&img->watch_gen);
  struct stat st;

  /* A direct write ends at the next aligned offset, tail writes at the
   * image's size.
   */
  end = ROUND_UP (end, img->geo.offset_align);
  if (end > size)
    end = size;

  if (img->geo.blockdev)
    return 0;
  if (t->checked_round && end <= t->checked_size &&
      (t->checked_round >= arrived ||
       (by_ring && t->watching && gen == t->watch_gen &&
        coarse_ms () - t->checked_ms < WATCH_TRUST_MS)))
    return 0;
  COUNT (img, file_checks, 1);
  if (fstat (img->fd, &st) == -1)
    return -errno;
  if (st.st_nlink == 0) {
    t->checked_round = 0;
    engine_tell_changed (img, "the image was deleted");
    return -EIO;
  }
  t->checked_round = t->round;
  t->checked_size = st.st_size;
  t->watch_gen = gen;
  t->checked_ms = coarse_ms ();
  if ((uint64_t) st.st_size < end) {
    engine_tell_changed (img, "the image shrank");
    return -ENOSPC;
  }
  return 0;
}

/* ---- the size served ------------------------------------------------------ */

uint64_t
pdio_size (const struct pdio_image *img)
{
  return atomic_load_explicit (&img->size, memory_order_acquire);
}

/* Nothing else changes with the size: the alignment and the allocation
 * unit belong to the file or device, and tail_fd is open whenever the
 * image is writable, so a size that stops being a multiple of the
 * alignment needs nothing new.  A request that started before keeps its
 * own size (req_state.size) to the end, so no request sees two sizes.
 */
int
pdio_refresh_size (struct pdio_image *img, uint64_t *sizep)
{
  uint64_t old = pdio_size (img), size;
  struct stat st;

  if (fstat (img->fd, &st) == -1)
    return -errno;
  if (img->geo.blockdev) {
    if (ioctl (img->fd, BLKGETSIZE64, &size) == -1)
      return -errno;
  }
  else
    size = st.st_size;
  if (size != old) {
    atomic_store_explicit (&img->size, size, memory_order_release);
    /* The operator's resize is no accident: a later shrink or deletion
     * is news again.
     */
    atomic_store (&img->told_changed, false);
    engine_debug (img, "%s: size %" PRIu64 " -> %" PRIu64 "%s", img->file,
                  old, size, size < old ? " (shrank)" : "");
  }
  *sizep = size;
  return 0;
}

/* ---- what the image advertises and has counted --------------------------- */

void
pdio_get_info (const struct pdio_image *img, struct pdio_info *info)
{
  /* Any byte is addressable (the engine does the read-modify-write), so
   * the minimum is 1, as qemu-nbd advertises.  Requests aligned to the
   * direct-I/O alignment are the ones that need no read-modify-write, which
   * is what the NBD spec calls the preferred size; it is also the smallest
   * logical block the kernel's client may use, so the front ends take the
   * kernel's block size from it.  nbdkit wants a preferred size >= 512.
   */
  uint32_t pref = img->geo.offset_align > 512 ? img->geo.offset_align : 512;

  *info = (struct pdio_info) {
    .size = pdio_size (img),
    .readonly = img->readonly,
    .blockdev = img->geo.blockdev,
    .can_extents = !img->geo.blockdev,
    .offset_align = img->geo.offset_align,
    .mem_align = img->geo.mem_align,
    .fs_block = img->geo.fs_block,
    .block_min = 1,
    .block_preferred = pref,
    .block_max = PDIO_MAX_BLOCK,
    .backend = img->backend,
  };
}

void
pdio_get_stats (const struct pdio_image *img, struct pdio_stats *s)
{
  const struct engine_counters *c = &img->stats;

  *s = (struct pdio_stats) {
    .reads = atomic_load (&c->reads),
    .writes = atomic_load (&c->writes),
    .direct = atomic_load (&c->direct),
    .bounced = atomic_load (&c->bounced),
    .bounced_bytes = atomic_load (&c->bounced_bytes),
    .rmw_blocks = atomic_load (&c->rmw_blocks),
    .tail_writes = atomic_load (&c->tail_writes),
    .short_io = atomic_load (&c->io.short_io),
    .zero_fallocate = atomic_load (&c->zero_fallocate),
    .zero_written = atomic_load (&c->zero_written),
    .flushes = atomic_load (&c->flushes),
    .helper_calls = atomic_load (&c->helper_calls),
    .file_checks = atomic_load (&c->file_checks),
  };
}

void
pdio_format_stats (const struct pdio_stats *s, char *buf, size_t len)
{
  snprintf (buf, len, "reads=%" PRIu64 " writes=%" PRIu64 " direct=%" PRIu64
            " bounced=%" PRIu64 " bounced_bytes=%" PRIu64 " rmw_blocks=%"
            PRIu64 " tail_writes=%" PRIu64 " short_io=%" PRIu64
            " zero_fallocate=%" PRIu64 " zero_written=%" PRIu64
            " flushes=%" PRIu64 " helper_calls=%" PRIu64
            " file_checks=%" PRIu64,
            s->reads, s->writes, s->direct, s->bounced, s->bounced_bytes,
            s->rmw_blocks, s->tail_writes, s->short_io, s->zero_fallocate,
            s->zero_written, s->flushes, s->helper_calls, s->file_checks);
}
