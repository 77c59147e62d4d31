/* SPDX-License-Identifier: BSD-3-Clause */
/* A deliberately broken nbdkit plugin: the negative control for
 * interleave_io.
 *
 * It serves file=IMAGE like pdio's engine would if it forgot its range
 * lock: every write reads the 4 KiB blocks it touches, patches them and
 * writes them back whole, with nothing stopping two connections from
 * doing that to the same block at the same time.  The later write-back
 * then restores the bytes the earlier one changed: a lost write.
 * interleave-racy.sh checks that interleave_io notices; if it did not,
 * interleave_io would pass a server with this bug too, and prove nothing.
 */
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#define THREAD_MODEL NBDKIT_THREAD_MODEL_PARALLEL
#define BLOCK 4096

static char *filename;
static int fd = -1;

static int
racy_config (const char *key, const char *value)
{
  if (strcmp (key, "file") != 0) {
    nbdkit_error ("unknown parameter '%s'", key);
    return -1;
  }
  free (filename);
  filename = nbdkit_absolute_path (value);
  return filename ? 0 : -1;
}

static int
racy_get_ready (void)
{
  fd = open (filename, O_RDWR | O_CLOEXEC);
  if (fd == -1) {
    nbdkit_error ("%s: %m", filename);
    return -1;
  }
  return 0;
}

static void
racy_unload (void)
{
  if (fd >= 0)
    close (fd);
  free (filename);
}

static void *
racy_open (int readonly)
{
  (void) readonly;
  return &fd;
}

static int64_t
racy_get_size (void *handle)
{
  struct stat st;

  (void) handle;
  if (fstat (fd, &st) == -1) {
    nbdkit_error ("fstat: %m");
    return -1;
  }
  return st.st_size;
}

static int
racy_can_multi_conn (void *handle)
{
  (void) handle;
  return 1;
}

static int
racy_pread (void *handle, void *buf, uint32_t count, uint64_t offset,
            uint32_t flags)
{
  (void) handle; (void) flags;
  while (count > 0) {
    ssize_t r = pread (fd, buf, count, offset);
    if (r <= 0) {
      nbdkit_error ("pread: %m");
      return -1;
    }
    buf = (char *) buf + r;
    count -= r;
    offset += r;
  }
  return 0;
}

/* Read-modify-write of whole blocks, unlocked, with a pause that widens
 * the window in which another connection's write to the block is lost.
 */
static int
racy_pwrite (void *handle, const void *buf, uint32_t count, uint64_t offset,
             uint32_t flags)
{
  uint64_t first = offset / BLOCK * BLOCK;
  uint64_t end = (offset + count + BLOCK - 1) / BLOCK * BLOCK;
  size_t len = end - first;
  char *block = malloc (len);
  ssize_t got;

  (void) handle; (void) flags;
  if (!block) {
    nbdkit_error ("malloc: %m");
    return -1;
  }
  got = pread (fd, block, len, first);  /* short at the end of the file */
  if (got < (ssize_t) (offset + count - first)) {
    nbdkit_error ("pread: %m");
    free (block);
    return -1;
  }
  usleep (200);
  memcpy (block + (offset - first), buf, count);
  if (pwrite (fd, block, got, first) != got) {
    nbdkit_error ("pwrite: %m");
    free (block);
    return -1;
  }
  free (block);
  return 0;
}

static struct nbdkit_plugin plugin = {
  .name = "racy-rmw",
  .version = PACKAGE_VERSION,
  .config = racy_config,
  .get_ready = racy_get_ready,
  .unload = racy_unload,
  .open = racy_open,
  .get_size = racy_get_size,
  .can_multi_conn = racy_can_multi_conn,
  .pread = racy_pread,
  .pwrite = racy_pwrite,
  .errno_is_preserved = 1,
};

NBDKIT_REGISTER_PLUGIN (plugin)
