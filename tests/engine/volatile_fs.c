/* SPDX-License-Identifier: BSD-3-Clause */
/* volatile_fs: a FUSE file system holding one file, "img", that behaves
 * like a disk with a volatile write cache, so that a power cut can be
 * simulated under a running pdio.
 *
 *   volatile_fs -b BACKING [-s SEED] [-k KEEP_PERCENT] MOUNTPOINT
 *
 * Why this exists: killing nbdkit with SIGKILL loses nothing that pdio
 * handed to the kernel.  An O_DIRECT write that completed is in the file
 * (or in the disk's cache, which the process's death does not touch), so a
 * crash test on a plain file passes even if flush and FUA were no-ops.
 * O_DIRECT bypasses the page cache, not the device's cache: only fdatasync
 * (flush) and RWF_DSYNC (FUA) make a write durable.  This file system makes
 * that difference visible:
 *
 *   - every write lands in a volatile log (and is visible to reads at
 *     once, like a disk cache);
 *   - fsync/fdatasync (FUSE_FSYNC: what fdatasync and the kernel's
 *     RWF_DSYNC handling send) moves the whole log to BACKING, the
 *     "platter" - like a cache flush, it covers the whole file;
 *   - writing anything to the file "powercut" cuts the power: each write
 *     still in the log reaches BACKING with probability KEEP_PERCENT (a
 *     cache may have written back some of its contents, in any subset),
 *     the rest are lost, and from then on every request fails with EIO
 *     (the device is gone) until the file system is unmounted.
 *
 * BACKING is read at mount and is then the durable image; after the power
 * cut it holds exactly what a real disk would have kept.  The daemon logs
 * its counters (writes, fsyncs, entries kept and dropped) on stderr.
 * Single-threaded on purpose: requests are applied in the order the
 * kernel delivers them, so the log's order is the disk's order.
 */
#define FUSE_USE_VERSION 31
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fuse.h>

struct entry {
  uint64_t off;
  size_t len;
  unsigned char *data;
};

static struct {
  const char *backing;
  int backing_fd;
  uint64_t size;
  unsigned char *cur;           /* what reads see: platter + log */
  struct entry *log;
  size_t nlog, log_cap;
  uint64_t rng;
  unsigned keep_percent;
  bool dead;
  uint64_t writes, write_bytes, fsyncs, datasyncs, committed;
  uint64_t cut_kept, cut_dropped, refused;
} v;

static uint64_t
rng_next (void)
{
  uint64_t z = (v.rng += UINT64_C (0x9e3779b97f4a7c15));

  z = (z ^ (z >> 30)) * UINT64_C (0xbf58476d1ce4e5b9);
  z = (z ^ (z >> 27)) * UINT64_C (0x94d049bb133111eb);
  return z ^ (z >> 31);
}

static void
die (const char *what)
{
  fprintf (stderr, "volatile_fs: %s: %s\n", what, strerror (errno));
  exit (99);
}

static void
to_platter (const struct entry *e)
{
  size_t done = 0;

  while (done < e->len) {
    ssize_t r = pwrite (v.backing_fd, e->data + done, e->len - done,
                        e->off + done);
    if (r <= 0)
      die ("pwrite backing");
    done += r;
  }
}

static void
commit_all (void)
{
  for (size_t i = 0; i < v.nlog; i++) {
    to_platter (&v.log[i]);
    free (v.log[i].data);
    v.committed++;
  }
  v.nlog = 0;
}

static void
report (const char *when)
{
  fprintf (stderr, "volatile_fs: %s: writes=%" PRIu64 " bytes=%" PRIu64
           " fsyncs=%" PRIu64 " (datasync %" PRIu64 ") committed=%" PRIu64
           " pending=%zu cut_kept=%" PRIu64 " cut_dropped=%" PRIu64
           " refused_after_cut=%" PRIu64 "\n", when, v.writes, v.write_bytes,
           v.fsyncs, v.datasyncs, v.committed, v.nlog, v.cut_kept,
           v.cut_dropped, v.refused);
}

static void
power_cut (void)
{
  if (v.dead)
    return;
  for (size_t i = 0; i < v.nlog; i++) {
    if (rng_next () % 100 < v.keep_percent) {
      to_platter (&v.log[i]);
      v.cut_kept++;
    }
    else
      v.cut_dropped++;
    free (v.log[i].data);
  }
  v.nlog = 0;
  v.dead = true;
  report ("power cut");
}

enum file { F_ROOT, F_IMG, F_CUT, F_NONE };

static enum file
which (const char *path)
{
  if (strcmp (path, "/") == 0)
    return F_ROOT;
  if (strcmp (path, "/img") == 0)
    return F_IMG;
  if (strcmp (path, "/powercut") == 0)
    return F_CUT;
  return F_NONE;
}

static int
vfs_getattr (const char *path, struct stat *st, struct fuse_file_info *fi)
{
  (void) fi;
  memset (st, 0, sizeof *st);
  switch (which (path)) {
  case F_ROOT:
    st->st_mode = S_IFDIR | 0755;
    st->st_nlink = 2;
    return 0;
  case F_IMG:
    st->st_mode = S_IFREG | 0644;
    st->st_nlink = 1;
    st->st_size = v.size;
    st->st_blksize = 4096;
    st->st_blocks = (v.size + 511) / 512;   /* fully allocated */
    return 0;
  case F_CUT:
    st->st_mode = S_IFREG | 0200;
    st->st_nlink = 1;
    return 0;
  case F_NONE:
    break;
  }
  return -ENOENT;
}

static int
vfs_readdir (const char *path, void *buf, fuse_fill_dir_t fill, off_t off,
             struct fuse_file_info *fi, enum fuse_readdir_flags flags)
{
  (void) off; (void) fi; (void) flags;
  if (which (path) != F_ROOT)
    return -ENOENT;
  fill (buf, ".", NULL, 0, 0);
  fill (buf, "..", NULL, 0, 0);
  fill (buf, "img", NULL, 0, 0);
  fill (buf, "powercut", NULL, 0, 0);
  return 0;
}

static int
vfs_open (const char *path, struct fuse_file_info *fi)
{
  (void) fi;
  if (which (path) == F_NONE || which (path) == F_ROOT)
    return -ENOENT;
  if (v.dead && which (path) == F_IMG) {
    v.refused++;
    return -EIO;
  }
  return 0;
}

static int
vfs_truncate (const char *path, off_t size, struct fuse_file_info *fi)
{
  (void) fi;
  /* "echo > powercut" truncates first; the image never changes size. */
  if (which (path) == F_CUT)
    return 0;
  return (uint64_t) size == v.size ? 0 : -EPERM;
}

static int
vfs_read (const char *path, char *buf, size_t len, off_t off,
          struct fuse_file_info *fi)
{
  (void) fi;
  if (which (path) != F_IMG)
    return -EINVAL;
  if (v.dead) {
    v.refused++;
    return -EIO;
  }
  if ((uint64_t) off >= v.size)
    return 0;
  if (len > v.size - off)
    len = v.size - off;
  memcpy (buf, v.cur + off, len);
  return len;
}

static int
vfs_write (const char *path, const char *buf, size_t len, off_t off,
           struct fuse_file_info *fi)
{
  struct entry e;

  (void) fi;
  if (which (path) == F_CUT) {
    power_cut ();
    return len;
  }
  if (which (path) != F_IMG)
    return -EINVAL;
  if (v.dead) {
    v.refused++;
    return -EIO;
  }
  /* A disk does not grow: a write past the end is the caller's bug. */
  if ((uint64_t) off > v.size || len > v.size - off)
    return -ENOSPC;
  e.off = off;
  e.len = len;
  e.data = malloc (len ? len : 1);
  if (!e.data)
    return -ENOMEM;
  memcpy (e.data, buf, len);
  memcpy (v.cur + off, buf, len);
  if (v.nlog == v.log_cap) {
    size_t cap = v.log_cap ? 2 * v.log_cap : 1024;
    struct entry *n = realloc (v.log, cap * sizeof *n);
    if (!n) {
      free (e.data);
      return -ENOMEM;
    }
    v.log = n;
    v.log_cap = cap;
  }
  v.log[v.nlog++] = e;
  v.writes++;
  v.write_bytes += len;
  return len;
}

static int
vfs_fsync (const char *path, int datasync, struct fuse_file_info *fi)
{
  (void) fi;
  if (which (path) != F_IMG)
    return 0;
  if (v.dead) {
    v.refused++;
    return -EIO;
  }
  v.fsyncs++;
  if (datasync)
    v.datasyncs++;
  commit_all ();
  return 0;
}

static int
vfs_flush (const char *path, struct fuse_file_info *fi)
{
  /* close(2): not a durability point (as on a real disk). */
  (void) path; (void) fi;
  return 0;
}

static int
vfs_fallocate (const char *path, int mode, off_t off, off_t len,
               struct fuse_file_info *fi)
{
  (void) path; (void) mode; (void) off; (void) len; (void) fi;
  return -EOPNOTSUPP;
}

static void *
vfs_init (struct fuse_conn_info *conn, struct fuse_config *cfg)
{
  /* The kernel's asynchronous FUSE direct I/O (what io_uring gets) never
   * honours RWF_DSYNC/O_DSYNC: fuse_direct_IO returns -EIOCBQUEUED and its
   * completion does not call generic_write_sync (seen on Linux 6.18), so a
   * FUA write from io_uring would never be followed by an fsync here.
   * ext4, xfs and block devices do honour it, and they are what this file
   * system stands in for: with async_dio off, FUSE takes the synchronous
   * path, which syncs.
   */
  conn->want &= ~FUSE_CAP_ASYNC_DIO;
  /* No kernel caching of data or attributes: every read and write must
   * come here, in order, or the model would not see it.
   */
  cfg->kernel_cache = 0;
  cfg->attr_timeout = 0;
  cfg->entry_timeout = 0;
  cfg->negative_timeout = 0;
  return NULL;
}

static void
vfs_destroy (void *data)
{
  (void) data;
  report ("unmounted");
}

static const struct fuse_operations ops = {
  .init = vfs_init,
  .destroy = vfs_destroy,
  .getattr = vfs_getattr,
  .readdir = vfs_readdir,
  .open = vfs_open,
  .truncate = vfs_truncate,
  .read = vfs_read,
  .write = vfs_write,
  .fsync = vfs_fsync,
  .flush = vfs_flush,
  .fallocate = vfs_fallocate,
};

static void
usage (void)
{
  fprintf (stderr, "usage: volatile_fs -b BACKING [-s SEED] [-k KEEP_PERCENT]"
           " MOUNTPOINT\n");
  exit (99);
}

int
main (int argc, char *argv[])
{
  struct stat st;
  int c;

  v.keep_percent = 50;
  while ((c = getopt (argc, argv, "b:s:k:")) != -1) {
    switch (c) {
    case 'b': v.backing = optarg; break;
    case 's': v.rng = strtoull (optarg, NULL, 0); break;
    case 'k': v.keep_percent = atoi (optarg); break;
    default: usage ();
    }
  }
  if (!v.backing || optind != argc - 1 || v.keep_percent > 100)
    usage ();

  v.backing_fd = open (v.backing, O_RDWR);
  if (v.backing_fd == -1 || fstat (v.backing_fd, &st) == -1)
    die (v.backing);
  v.size = st.st_size;
  v.cur = malloc (v.size ? v.size : 1);
  if (!v.cur)
    die ("malloc");
  for (uint64_t off = 0; off < v.size; ) {
    ssize_t r = pread (v.backing_fd, v.cur + off, v.size - off, off);
    if (r <= 0)
      die ("read backing");
    off += r;
  }

  /* Foreground, single-threaded: see the header. */
  char *fargv[] = { argv[0], "-f", "-s", "-o", "fsname=pdio-volatile",
                    argv[optind], NULL };
  return fuse_main (6, fargv, &ops, NULL);
}
