/* The engine: open an image, and turn each read or write into direct I/O.
 *
 * A request's path: range check -> (writes) range lock over the block-
 * rounded span -> plan_chunk() -> dio_args over the caller's memory or this
 * thread's bounce pages -> io_run() on this thread's ring -> copy back ->
 * unlock.  See docs/design.md.
 */
#include <config.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/sysmacros.h>
#include <sys/uio.h>
#include <unistd.h>

#include "engine_internal.h"
#include "plan.h"

#ifndef TMPFS_MAGIC
#define TMPFS_MAGIC 0x01021994
#endif
#ifndef FUSE_SUPER_MAGIC
#define FUSE_SUPER_MAGIC 0x65735546
#endif

/* Page slots one thread needs: the largest request plus a full bounce. */
#define PAGES_CAP ((PDIO_MAX_REQUEST + BOUNCE_CAP) / DIO_PAGE_SIZE + 8)

/* ---- messages ---------------------------------------------------------- */

void
engine_log (const struct pdio_image *img, enum engine_log_level level,
            const char *fmt, ...)
{
  void (*fn) (const char *, va_list) =
    level == ENGINE_LOG_ERROR ? img->log.error :
    level == ENGINE_LOG_WARNING ? img->log.warning : img->log.debug;
  va_list args;

  if (fn == NULL)
    return;
  va_start (args, fmt);
  fn (fmt, args);
  va_end (args);
}

/* ---- per-thread contexts ----------------------------------------------- */

static void
ctx_free (struct io_ctx *ctx)
{
  if (ctx->backend->destroy)
    ctx->backend->destroy (ctx);
  bounce_free (&ctx->bounce);
  if (ctx->pages)
    munmap (ctx->pages, ctx->pages_cap * sizeof (void *));
  free (ctx);
}

struct thread_ctx {
  struct io_ctx io;             /* first: the key's value is both */
  struct pdio_image *img;
};

/* A worker thread is exiting: unlink and free its context. */
static void
ctx_destructor (void *p)
{
  struct thread_ctx *t = p;
  struct pdio_image *img = t->img;
  struct io_ctx **pp;

  pthread_mutex_lock (&img->ctx_lock);
  for (pp = &img->ctxs; *pp; pp = &(*pp)->next)
    if (*pp == &t->io) {
      *pp = t->io.next;
      break;
    }
  pthread_mutex_unlock (&img->ctx_lock);
  ctx_free (&t->io);
}

struct io_ctx *
engine_ctx (struct pdio_image *img)
{
  struct thread_ctx *t = pthread_getspecific (img->ctx_key);
  int r;

  if (t)
    return &t->io;

  t = calloc (1, sizeof *t);
  if (t == NULL)
    return NULL;
  t->img = img;
  t->io.fd = img->fd;
  t->io.counters = &img->stats.io;
  t->io.backend = &backend_psync;
  t->io.pages_cap = PAGES_CAP;
  t->io.bounce_canary = img->bounce_canary;
  /* Reserved, not touched: only the slots a request uses become memory. */
  t->io.pages = mmap (NULL, PAGES_CAP * sizeof (void *),
                      PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                      -1, 0);
  if (t->io.pages == MAP_FAILED) {
    int err = errno;
    free (t);
    errno = err;
    return NULL;
  }
  if (img->backend == PDIO_BACKEND_URING) {
    r = backend_uring_init (&t->io);
    if (r < 0)
      engine_debug (img, "io_uring setup failed in this thread (%s): "
                    "it uses psync", strerror (-r));
  }
  if (pthread_setspecific (img->ctx_key, t) != 0) {
    ctx_free (&t->io);
    errno = ENOMEM;
    return NULL;
  }
  pthread_mutex_lock (&img->ctx_lock);
  t->io.next = img->ctxs;
  img->ctxs = &t->io;
  pthread_mutex_unlock (&img->ctx_lock);
  return &t->io;
}

/* ---- reads and writes ---------------------------------------------------- */

static void *
seg_mem (const struct plan_seg *s, char *user, char *bounce)
{
  return (s->mem == PLAN_MEM_USER ? user : bounce) + s->mem_off;
}

/* A read stopped at end of file: what the file does not hold reads as
 * zeroes, wherever in the chunk's memory those bytes were to land.
 */
static void
zero_fill_after (const struct plan_chunk *c, size_t done, char *user,
                 char *bounce)
{
  size_t pos = 0;
  unsigned s;

  for (s = 0; s < c->nseg; s++) {
    const struct plan_seg *seg = &c->seg[s];
    size_t from = done > pos ? done - pos : 0;

    if (from < seg->len)
      memset ((char *) seg_mem (seg, user, bounce) + from, 0,
              seg->len - from);
    pos += seg->len;
  }
}

/* RMW: read the partial blocks a write only covers in part. */
static int
read_partial_blocks (struct pdio_image *img, struct io_ctx *ctx,
                     const struct plan_chunk *c, uint32_t align,
                     char *bounce)
{
  struct dio_args d[IO_MAX_OPS];
  struct io_op ops[IO_MAX_OPS];
  unsigned i, used = 0;
  int r;

  for (i = 0; i < c->nrmw; i++) {
    char *mem = bounce + c->rmw[i].bounce_off;

    dio_args_map (&d[i], ctx->pages + used, mem, align, c->rmw[i].file_off);
    used += d[i].nr_pages;
    ops[i] = (struct io_op) {
      .write = false, .align = align, .segs = &d[i], .nsegs = 1,
    };
  }
  r = io_run (ctx, ops, c->nrmw);
  if (r < 0)
    return r;
  for (i = 0; i < c->nrmw; i++)
    if (ops[i].done < align)    /* the file shrank under us */
      memset (bounce + c->rmw[i].bounce_off + ops[i].done, 0,
              align - ops[i].done);
  COUNT (img, rmw_blocks, c->nrmw);
  return 0;
}

static int transfer_chunk (struct pdio_image *img, struct io_ctx *ctx,
                           const struct plan_request *req, uint32_t align,
                           char *user, const struct plan_chunk *c,
                           int rw_flags, char *bounce);
static void tell_changed (struct pdio_image *img, const char *what);

static int
run_chunk (struct pdio_image *img, struct io_ctx *ctx,
           const struct plan_request *req, uint32_t align, char *user,
           const struct plan_chunk *c, int rw_flags)
{
  char *bounce;
  int r;

  if (c->bounce_len) {
    r = io_bounce_reserve (ctx, c->bounce_len);
    if (r < 0)
      return r;
  }
  bounce = ctx->bounce.mem;
  r = transfer_chunk (img, ctx, req, align, user, c, rw_flags, bounce);
  if (c->bounce_len && ctx->bounce_canary)
    memset (bounce, PDIO_CANARY, ctx->bounce.size);
  return r;
}

/* The image file shrank or was deleted while served: say so once. */
static void
tell_changed (struct pdio_image *img, const char *what)
{
  if (!atomic_exchange (&img->told_changed, true))
    engine_error (img, "%s: %s while being served: refusing I/O that "
                  "would lose data or grow it back", img->file, what);
}

static int
transfer_chunk (struct pdio_image *img, struct io_ctx *ctx,
                const struct plan_request *req, uint32_t align, char *user,
                const struct plan_chunk *c, int rw_flags, char *bounce)
{
  struct dio_args d[3];
  struct io_op op;
  uint64_t file_off = c->file_off;
  unsigned i, used = 0;
  int r;

  if (c->direct)
    COUNT (img, direct, 1);
  else
    COUNT (img, bounced, 1);

  if (req->write) {
    if (c->nrmw) {
      r = read_partial_blocks (img, ctx, c, align, bounce);
      if (r < 0)
        return r;
    }
    for (i = 0; i < c->ncopy; i++)
      memcpy (bounce + c->copy[i].bounce_off, user + c->copy[i].user_off,
              c->copy[i].len);
  }

  for (i = 0; i < c->nseg; i++) {
    dio_args_map (&d[i], ctx->pages + used, seg_mem (&c->seg[i], user, bounce),
                  c->seg[i].len, file_off);
    used += d[i].nr_pages;
    file_off += c->seg[i].len;
  }
  op = (struct io_op) {
    .write = req->write, .rw_flags = rw_flags, .align = align, .segs = d,
    .nsegs = c->nseg,
  };
  r = io_run (ctx, &op, 1);
  if (r < 0)
    return r;

  if (!req->write) {
    /* End of file may come inside the last block of an image whose size is
     * not aligned; before the image's size, the file has shrunk.
     */
    uint64_t want = req->offset + c->next;

    if (want > img->geo.size)
      want = img->geo.size;
    if (c->file_off + op.done < want) {
      tell_changed (img, "the image shrank");
      return -EIO;
    }
    if (op.done < c->file_len)
      zero_fill_after (c, op.done, user, bounce);
    for (i = 0; i < c->ncopy; i++)
      memcpy (user + c->copy[i].user_off, bounce + c->copy[i].bounce_off,
              c->copy[i].len);
  }
  return 0;
}

int
engine_rw_direct (struct pdio_image *img, struct io_ctx *ctx, bool write,
           char *buf, size_t count, uint64_t offset, int rw_flags)
{
  const struct plan_request req = {
    .write = write, .offset = offset, .count = count, .buf = (uintptr_t) buf,
  };
  const struct plan_limits lim = {
    .align = write ? img->geo.offset_align : img->geo.read_align,
    .mem_align = img->geo.mem_align,
    .bounce_cap = img->bounce_cap,
  };
  struct plan_chunk c;
  size_t done;
  int r;

  for (done = 0; done < count; done = c.next) {
    plan_chunk (&req, &lim, done, &c);
    r = run_chunk (img, ctx, &req, lim.align, buf, &c, rw_flags);
    if (r < 0)
      return r;
  }
  return 0;
}

int
pdio_read (struct pdio_image *img, void *buf, size_t count, uint64_t offset)
{
  struct io_ctx *ctx;

  if (offset > img->geo.size || count > img->geo.size - offset ||
      count > PDIO_MAX_REQUEST)
    return -EINVAL;
  if (count == 0)
    return 0;
  ctx = engine_ctx (img);
  if (ctx == NULL)
    return -errno;
  COUNT (img, reads, 1);
  return engine_rw_direct (img, ctx, false, buf, count, offset, 0);
}

/* The last (size % alignment) bytes of an image cannot be written with
 * O_DIRECT without growing the file, so they go through the page cache,
 * are written back at once and dropped from it again.  The range lock
 * covers the whole page around them (see engine_lock_write).
 */
static int
write_tail (struct pdio_image *img, const char *buf, size_t count,
            uint64_t offset, unsigned flags)
{
  uint64_t page = round_down (offset, GEOMETRY_PAGE);
  uint64_t page_end = round_up (offset + count, GEOMETRY_PAGE);
  size_t done = 0;

  while (done < count) {
    ssize_t r = pwrite (img->tail_fd, buf + done, count - done,
                        offset + done);
    if (r < 0 && errno == EINTR)
      continue;
    if (r <= 0)
      return r < 0 ? -errno : -EIO;
    done += r;
  }
  if (sync_file_range (img->tail_fd, page, page_end - page,
                       SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE |
                       SYNC_FILE_RANGE_WAIT_AFTER) == -1)
    return -errno;
  if ((flags & PDIO_FUA) && fdatasync (img->fd) == -1)
    return -errno;
  /* Whole pages: DONTNEED keeps a partial page unless it ends the file. */
  posix_fadvise (img->tail_fd, page, page_end - page, POSIX_FADV_DONTNEED);
  COUNT (img, tail_writes, 1);
  return 0;
}

void
engine_lock_write (struct pdio_image *img, struct range_lock_entry *e,
                   uint64_t offset, uint64_t count)
{
  uint64_t start = round_down (offset, img->geo.offset_align);
  uint64_t end = round_up (offset + count, img->geo.offset_align);

  /* A tail write dirties the whole page (and fs block) it lands in. */
  if (offset + count > img->direct_end) {
    uint64_t grain = img->geo.fs_block > GEOMETRY_PAGE
      ? img->geo.fs_block : GEOMETRY_PAGE;
    uint64_t tail_start = round_down (img->direct_end, grain);

    if (tail_start < start)
      start = tail_start;
    end = round_up (offset + count, grain);
  }
  range_lock_acquire (&img->lock, e, start, end);
}

int
engine_write_locked (struct pdio_image *img, struct io_ctx *ctx,
                     const void *buf, size_t count, uint64_t offset,
                     unsigned flags)
{
  const bool fua = flags & PDIO_FUA;
  size_t direct = 0;
  int r;

  if (offset < img->direct_end)
    direct = count < img->direct_end - offset
      ? count : img->direct_end - offset;
  if (direct) {
    /* FUSE loses the error of the sync an RWF_DSYNC write does (see
     * check_filesystem): there FUA is the write, then fdatasync.
     */
    r = engine_rw_direct (img, ctx, true, (char *) buf, direct, offset,
                          fua && !img->on_fuse ? RWF_DSYNC : 0);
    if (r < 0)
      return r;
  }
  if (direct < count)           /* syncs itself for FUA */
    return write_tail (img, (const char *) buf + direct, count - direct,
                       offset + direct, flags);
  if (fua && img->on_fuse && fdatasync (img->fd) == -1)
    return -errno;
  return 0;
}

/* A file can shrink or be deleted under us.  A direct write past its end
 * would grow it back, and writes to a deleted file are lost at close: both
 * are refused, with one clear message.  (A change between this check and
 * the write is not caught; this is a guard against mistakes, not a lock.)
 */
int
engine_check_file (struct pdio_image *img, uint64_t end)
{
  struct stat st;

  /* A direct write ends at the next aligned offset, tail writes at the
   * image's size.
   */
  end = round_up (end, img->geo.offset_align);
  if (end > img->geo.size)
    end = img->geo.size;

  if (img->geo.blockdev)
    return 0;
  if (fstat (img->fd, &st) == -1)
    return -errno;
  if (st.st_nlink == 0) {
    tell_changed (img, "the image was deleted");
    return -EIO;
  }
  if ((uint64_t) st.st_size < end) {
    tell_changed (img, "the image shrank");
    return -ENOSPC;
  }
  return 0;
}

int
engine_begin_write (struct pdio_image *img, uint64_t offset, uint64_t count,
                    struct range_lock_entry *lock, struct io_ctx **ctxp)
{
  int r;

  if (img->readonly)
    return -EPERM;
  if (offset > img->geo.size || count > img->geo.size - offset)
    return -ENOSPC;
  if (count == 0)
    return 1;
  *ctxp = engine_ctx (img);
  if (*ctxp == NULL)
    return -errno;
  r = engine_check_file (img, offset + count);
  if (r < 0)
    return r;
  engine_lock_write (img, lock, offset, count);
  return 0;
}

int
pdio_write (struct pdio_image *img, const void *buf, size_t count,
            uint64_t offset, unsigned flags)
{
  struct range_lock_entry lock;
  struct io_ctx *ctx;
  int r;

  if (count > PDIO_MAX_REQUEST)
    return -EINVAL;
  r = engine_begin_write (img, offset, count, &lock, &ctx);
  if (r != 0)
    return r < 0 ? r : 0;
  COUNT (img, writes, 1);
  r = engine_write_locked (img, ctx, buf, count, offset, flags);
  range_lock_release (&img->lock, &lock);
  return r;
}

int
engine_write_zeroes (struct pdio_image *img, struct io_ctx *ctx,
                     uint64_t offset, uint64_t count)
{
  const uint64_t end = offset + count;
  const uint32_t mask = img->geo.mem_align - 1;

  while (offset < end) {
    uint64_t piece_end = round_down (offset + ZERO_LEN, img->geo.offset_align);
    int r;

    if (piece_end <= offset)
      piece_end = offset + ZERO_LEN;
    if (piece_end > end)
      piece_end = end;
    /* Zero pages read the same from any address: pick the one that lines
     * up with the offset, so the aligned middle goes direct.
     */
    r = engine_write_locked (img, ctx, img->zero_mem + (offset & mask),
                             piece_end - offset, offset, 0);
    if (r < 0)
      return r;
    COUNT (img, zero_written, piece_end - offset);
    offset = piece_end;
  }
  return 0;
}

int
pdio_flush (struct pdio_image *img)
{
  int r;

  COUNT (img, flushes, 1);
  if (fdatasync (img->fd) == -1)
    return -errno;
  /* Durable in a file nobody can reach is not durable. */
  r = engine_check_file (img, 0);
  return r == -ENOSPC ? 0 : r;
}

/* ---- open and close ------------------------------------------------------ */

/* The type of the filesystem holding st, from /proc/self/mountinfo. */
static void
fs_type_of (const struct stat *st, char *buf, size_t len)
{
  FILE *fp = fopen ("/proc/self/mountinfo", "re");
  char line[4096];

  snprintf (buf, len, "unknown");
  if (fp == NULL)
    return;
  while (fgets (line, sizeof line, fp)) {
    unsigned maj, min;
    char type[64], *sep;

    if (sscanf (line, "%*d %*d %u:%u", &maj, &min) != 2 ||
        makedev (maj, min) != st->st_dev)
      continue;
    sep = strstr (line, " - ");
    if (sep && sscanf (sep + 3, "%63s", type) == 1)
      snprintf (buf, len, "%s", type);
    break;
  }
  fclose (fp);
}

static int
refuse_no_direct_io (struct pdio_image *img, const struct stat *st,
                     const char *detail)
{
  char fs[64];

  fs_type_of (st, fs, sizeof fs);
  engine_error (img, "%s: the %s filesystem does not support O_DIRECT "
                "(direct I/O)%s%s; pdio needs it to keep the image out of "
                "the page cache", img->file, fs, detail ? ": " : "",
                detail ? detail : "");
  return -EINVAL;
}

/* Opens the file O_DIRECT, read-write unless asked or forced otherwise. */
static int
open_image (struct pdio_image *img, const struct pdio_config *cfg,
            struct stat *st)
{
  int flags = O_DIRECT | O_CLOEXEC;

  if (stat (cfg->file, st) == -1) {
    int err = errno;
    engine_error (img, "%s: %s", cfg->file, strerror (err));
    return -err;
  }
  if (S_ISDIR (st->st_mode)) {
    engine_error (img, "%s: is a directory, not an image file or block "
                  "device", cfg->file);
    return -EISDIR;
  }
  if (!S_ISREG (st->st_mode) && !S_ISBLK (st->st_mode)) {
    engine_error (img, "%s: is not a regular file or block device",
                  cfg->file);
    return -EINVAL;
  }

  img->readonly = cfg->readonly;
  img->fd = open (cfg->file, flags | (img->readonly ? O_RDONLY : O_RDWR));
  if (img->fd == -1 && !img->readonly &&
      (errno == EACCES || errno == EPERM || errno == EROFS ||
       errno == ETXTBSY)) {
    int err = errno;

    img->fd = open (cfg->file, flags | O_RDONLY);
    if (img->fd >= 0) {
      img->readonly = true;
      engine_warning (img, "%s: cannot be opened for writing (%s); serving it "
                    "read-only", cfg->file, strerror (err));
    }
  }
  if (img->fd == -1) {
    int err = errno;
    if (err == EINVAL)
      return refuse_no_direct_io (img, st, NULL);
    engine_error (img, "%s: %s", cfg->file, strerror (err));
    return -err;
  }
  if (fstat (img->fd, st) == -1) {
    int err = errno;
    engine_error (img, "%s: fstat: %s", cfg->file, strerror (err));
    return -err;
  }
  return 0;
}

/* Who holds an OFD lock on the file st?  /proc/locks shows OFD locks with
 * no pid, but each holder's /proc/PID/fdinfo/FD lists the locks on that fd.
 * Writes "pid N (comm)" to buf, or leaves it empty.
 */
static void
find_lock_holder (const struct stat *st, char *buf, size_t len)
{
  char want[64], path[64 + 2 * NAME_MAX], line[256];
  DIR *procs, *fds;
  struct dirent *p, *f;

  buf[0] = '\0';
  snprintf (want, sizeof want, " %02x:%02x:%lu ", major (st->st_dev),
            minor (st->st_dev), (unsigned long) st->st_ino);
  procs = opendir ("/proc");
  if (procs == NULL)
    return;
  while (!buf[0] && (p = readdir (procs)) != NULL) {
    if (p->d_name[0] < '1' || p->d_name[0] > '9')
      continue;
    snprintf (path, sizeof path, "/proc/%s/fdinfo", p->d_name);
    fds = opendir (path);
    if (fds == NULL)
      continue;
    while (!buf[0] && (f = readdir (fds)) != NULL) {
      FILE *fp;

      snprintf (path, sizeof path, "/proc/%s/fdinfo/%s", p->d_name,
                f->d_name);
      fp = fopen (path, "re");
      if (fp == NULL)
        continue;
      while (fgets (line, sizeof line, fp))
        if (strstr (line, "OFDLCK") && strstr (line, want)) {
          char comm[64] = "?";
          FILE *cp;

          snprintf (path, sizeof path, "/proc/%s/comm", p->d_name);
          cp = fopen (path, "re");
          if (cp) {
            if (fscanf (cp, "%63s", comm) != 1)
              snprintf (comm, sizeof comm, "?");
            fclose (cp);
          }
          snprintf (buf, len, "pid %d (%s)", atoi (p->d_name), comm);
          break;
        }
      fclose (fp);
    }
    closedir (fds);
  }
  closedir (procs);
}

/* Two writers on one image destroy it: hold an open-file-description lock,
 * exclusive when writable, shared when read-only, as qemu does.
 */
static int
lock_image (struct pdio_image *img)
{
  struct flock fl = {
    .l_type = img->readonly ? F_RDLCK : F_WRLCK,
    .l_whence = SEEK_SET,
  };

  if (fcntl (img->fd, F_OFD_SETLK, &fl) == 0)
    return 0;
  if (errno == EAGAIN || errno == EACCES) {
    struct stat st;
    char holder[128] = "";

    if (fstat (img->fd, &st) == 0)
      find_lock_holder (&st, holder, sizeof holder);
    engine_error (img, "%s: is in use: %s%s holds a %s lock on it (is it "
                  "already served or attached?)", img->file,
                  holder[0] ? "" : "another process", holder,
                  img->readonly ? "write" : "read or write");
    return -EBUSY;
  }
  /* Filesystems without locks (some network ones): serve anyway. */
  engine_debug (img, "%s: cannot lock (%s); serving unlocked", img->file,
                strerror (errno));
  return 0;
}

/* An O_DIRECT read of the first block: catches filesystems that accept
 * O_DIRECT at open but refuse the I/O.
 */
static int
check_direct_read (struct pdio_image *img, const struct stat *st)
{
  uint32_t len = img->geo.read_align;
  ssize_t r;
  void *buf;

  if (img->geo.size < len)
    return 0;
  buf = mmap (NULL, len, PROT_READ | PROT_WRITE,
              MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (buf == MAP_FAILED)
    return -errno;
  do
    r = pread (img->fd, buf, len, 0);
  while (r == -1 && errno == EINTR);
  munmap (buf, len);
  if (r == -1 && errno == EINVAL)
    return refuse_no_direct_io (img, st, "an aligned read was refused");
  if (r == -1) {
    int err = errno;
    engine_error (img, "%s: reading the first block: %s", img->file,
                  strerror (err));
    return -err;
  }
  return 0;
}

/* Filesystems that need special care, from their magic number. */
static void
check_filesystem (struct pdio_image *img)
{
  struct statfs sfs;

  if (fstatfs (img->fd, &sfs) == -1)
    return;
  if (sfs.f_type == TMPFS_MAGIC)
    engine_warning (img, "%s: is on tmpfs, which keeps file data in "
                    "memory anyway: O_DIRECT cannot keep it out of RAM",
                    img->file);
  /* On FUSE, Linux (seen on 6.18) lets io_uring retry a short direct
   * transfer at its original offset, corrupting data, and drops the sync
   * error of an RWF_DSYNC write: use psync and write + fdatasync for FUA.
   */
  img->on_fuse = sfs.f_type == FUSE_SUPER_MAGIC;
}

static int
choose_backend (struct pdio_image *img, enum pdio_backend want)
{
  int r;

  if (want == PDIO_BACKEND_PSYNC) {
    img->backend = PDIO_BACKEND_PSYNC;
    return 0;
  }
  if (want == PDIO_BACKEND_DEFAULT && img->on_fuse) {
    engine_warning (img, "%s: is on FUSE, where io_uring mishandles short "
                    "direct transfers: using backend=psync", img->file);
    img->backend = PDIO_BACKEND_PSYNC;
    return 0;
  }
  /* A throwaway ring: rings are per thread and made after any fork. */
  r = backend_uring_available ();
  if (r == 0) {
    img->backend = PDIO_BACKEND_URING;
    return 0;
  }
  if (want == PDIO_BACKEND_URING) {
    engine_error (img, "backend=io_uring: io_uring is not available: %s",
                  strerror (-r));
    return r;
  }
  engine_warning (img, "io_uring is not available (%s): using backend=psync",
                strerror (-r));
  img->backend = PDIO_BACKEND_PSYNC;
  return 0;
}

int
pdio_open (const struct pdio_config *cfg, struct pdio_image **imgp)
{
  struct pdio_image *img;
  struct stat st;
  char why[256];
  int r;

  *imgp = NULL;
  img = calloc (1, sizeof *img);
  if (img == NULL)
    return -errno;
  img->fd = img->tail_fd = -1;
  img->bounce_cap = BOUNCE_CAP;
  img->bounce_canary = cfg->bounce_canary;
  img->log = cfg->log;
  range_lock_init (&img->lock);
  pthread_mutex_init (&img->ctx_lock, NULL);
  if (pthread_key_create (&img->ctx_key, ctx_destructor) != 0) {
    range_lock_destroy (&img->lock);
    pthread_mutex_destroy (&img->ctx_lock);
    free (img);
    return -ENOMEM;
  }
  img->file = strdup (cfg->file ? cfg->file : "");
  if (img->file == NULL) {
    r = -ENOMEM;
    goto fail;
  }
  if (cfg->file == NULL || *cfg->file == '\0') {
    engine_error (img, "the file=IMAGE parameter is required");
    r = -EINVAL;
    goto fail;
  }

  r = open_image (img, cfg, &st);
  if (r < 0)
    goto fail;
  r = geometry_probe (img->fd, &st, &img->geo, why, sizeof why);
  if (r == -EINVAL && !img->geo.blockdev) {
    r = refuse_no_direct_io (img, &st, why);
    goto fail;
  }
  if (r < 0) {
    engine_error (img, "%s: %s", img->file, why);
    goto fail;
  }
  r = geometry_raise_align (&img->geo, cfg->align, why, sizeof why);
  if (r < 0) {
    engine_error (img, "%s", why);
    goto fail;
  }
  r = check_direct_read (img, &st);
  if (r < 0)
    goto fail;
  check_filesystem (img);
  r = lock_image (img);
  if (r < 0)
    goto fail;

  img->direct_end = round_down (img->geo.size, img->geo.offset_align);
  if (img->direct_end < img->geo.size && !img->readonly) {
    img->tail_fd = open (img->file, O_RDWR | O_CLOEXEC);
    if (img->tail_fd == -1) {
      r = -errno;
      engine_error (img, "%s: opening for the unaligned tail: %s",
                    img->file, strerror (-r));
      goto fail;
    }
  }

  img->zero_mem = mmap (NULL, ZERO_LEN + GEOMETRY_PAGE, PROT_READ,
                        MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (img->zero_mem == MAP_FAILED) {
    img->zero_mem = NULL;
    r = -errno;
    goto fail;
  }

  r = choose_backend (img, cfg->backend);
  if (r < 0)
    goto fail;

  engine_debug (img, "%s: %s%s, size %" PRIu64 ", direct-I/O alignment %u "
                "(reads %u, memory %u, from %s), fs block %u, backend %s%s",
                img->file, img->geo.blockdev ? "block device" : "file",
                img->readonly ? " (read-only)" : "", img->geo.size,
                img->geo.offset_align, img->geo.read_align,
                img->geo.mem_align, img->geo.source, img->geo.fs_block,
                img->backend == PDIO_BACKEND_URING ? "io_uring" : "psync",
                img->bounce_canary ? ", bounce canary on (free bounce pages "
                "filled with 0xa5)" : "");
  *imgp = img;
  return 0;

 fail:
  pdio_close (img);
  return r;
}

void
pdio_close (struct pdio_image *img)
{
  struct io_ctx *ctx, *next;

  if (img == NULL)
    return;
  /* No other thread may still use the image; free every context,
   * including this thread's.
   */
  pthread_setspecific (img->ctx_key, NULL);
  pthread_key_delete (img->ctx_key);
  for (ctx = img->ctxs; ctx; ctx = next) {
    next = ctx->next;
    ctx_free (ctx);
  }
  if (img->zero_mem)
    munmap (img->zero_mem, ZERO_LEN + GEOMETRY_PAGE);
  /* Release the image lock now: a ring still being torn down by the kernel
   * may hold a reference to the file for a while after we close it.
   */
  if (img->fd >= 0) {
    struct flock fl = { .l_type = F_UNLCK, .l_whence = SEEK_SET };
    fcntl (img->fd, F_OFD_SETLK, &fl);
  }
  if (img->tail_fd >= 0)
    close (img->tail_fd);
  if (img->fd >= 0)
    close (img->fd);
  range_lock_destroy (&img->lock);
  pthread_mutex_destroy (&img->ctx_lock);
  free (img->file);
  free (img);
}

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
    .size = img->geo.size,
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
    .rmw_blocks = atomic_load (&c->rmw_blocks),
    .tail_writes = atomic_load (&c->tail_writes),
    .short_io = atomic_load (&c->io.short_io),
    .zero_fallocate = atomic_load (&c->zero_fallocate),
    .zero_written = atomic_load (&c->zero_written),
    .flushes = atomic_load (&c->flushes),
  };
}

void
pdio_format_stats (const struct pdio_stats *s, char *buf, size_t len)
{
  snprintf (buf, len, "reads=%" PRIu64 " writes=%" PRIu64 " direct=%" PRIu64
            " bounced=%" PRIu64 " rmw_blocks=%" PRIu64 " tail_writes=%"
            PRIu64 " short_io=%" PRIu64 " zero_fallocate=%" PRIu64
            " zero_written=%" PRIu64 " flushes=%" PRIu64,
            s->reads, s->writes, s->direct, s->bounced, s->rmw_blocks,
            s->tail_writes, s->short_io, s->zero_fallocate, s->zero_written,
            s->flushes);
}
