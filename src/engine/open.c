/* SPDX-License-Identifier: BSD-3-Clause */
/* Opening an image: the checks that make pdio refuse what it cannot
 * serve with O_DIRECT, with messages that name the problem (the filesystem,
 * the process holding the image lock), the alignment, the image lock and
 * the backend; and closing it.
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
#include <unistd.h>

#include "engine_internal.h"
#include "pagesize.h"

#ifndef TMPFS_MAGIC
#define TMPFS_MAGIC 0x01021994
#endif
#ifndef FUSE_SUPER_MAGIC
#define FUSE_SUPER_MAGIC 0x65735546
#endif

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
  img->fd = img->tail_fd = img->watch_fd = -1;
  img->bounce_cap = BOUNCE_CAP;
  img->bounce_canary = cfg->bounce_canary;
  img->log = cfg->log;
  range_lock_init (&img->lock);
  helper_init (&img->helper);
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
  r = cfg->lock_later ? 0 : lock_image (img);
  if (r < 0)
    goto fail;

  atomic_init (&img->size, img->geo.size);
  /* The image's last block is partial when its size is not a multiple of
   * the alignment; a file can be resized while served (pdio_refresh_size),
   * so a writable one always has the descriptor for it.
   */
  if (!img->readonly && !img->geo.blockdev) {
    img->tail_fd = open (img->file, O_RDWR | O_CLOEXEC);
    if (img->tail_fd == -1) {
      r = -errno;
      engine_error (img, "%s: opening for the unaligned tail: %s",
                    img->file, strerror (-r));
      goto fail;
    }
  }

  /* After the last open of our own: the watch reports everyone's. */
  engine_watch_file (img);

  img->zero_mem = mmap (NULL, ZERO_LEN + PDIO_PAGE_SIZE, PROT_READ,
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

int
pdio_lock_image (struct pdio_image *img)
{
  return lock_image (img);
}

void
pdio_unlock_image (struct pdio_image *img)
{
  struct flock fl = { .l_type = F_UNLCK, .l_whence = SEEK_SET };

  fcntl (img->fd, F_OFD_SETLK, &fl);
}

void
pdio_close (struct pdio_image *img)
{
  unsigned threads;

  if (img == NULL)
    return;
  /* Every pdio_thread must be gone: their rings hold the image. */
  threads = atomic_load (&img->threads);
  if (threads)
    engine_error (img, "%s: closed with %u engine threads still alive",
                  img->file, threads);
  /* No job can be queued: every request is done. */
  helper_destroy (&img->helper);
  if (img->zero_mem)
    munmap (img->zero_mem, ZERO_LEN + PDIO_PAGE_SIZE);
  /* Release the image lock now: a ring still being torn down by the kernel
   * may hold a reference to the file for a while after we close it.
   */
  if (img->fd >= 0)
    pdio_unlock_image (img);
  if (img->watch_fd >= 0)
    close (img->watch_fd);
  if (img->tail_fd >= 0)
    close (img->tail_fd);
  if (img->fd >= 0)
    close (img->fd);
  range_lock_destroy (&img->lock);
  free (img->file);
  free (img);
}

