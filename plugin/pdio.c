/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-pdio-plugin: serve an image file or block device over NBD with
 * every byte going through O_DIRECT, so the image never sits in the host's
 * page cache.  Thin glue: parameters, one callback per NBD operation, and
 * the one place where an engine error becomes what the client sees.  All
 * the work is in the engine (src/engine/).  The callbacks are plugin_*:
 * pdio_* is the engine's API.
 */
#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include "engine.h"
#include "ispowerof2.h"

#define THREAD_MODEL NBDKIT_THREAD_MODEL_PARALLEL

/* Parameters, set by .config, and the image, opened in .get_ready (before
 * nbdkit forks: the engine makes its rings later, per worker thread).
 */
static char *filename;
static bool readonly;
static enum pdio_backend backend = PDIO_BACKEND_DEFAULT;
static uint32_t align;
static struct pdio_image *image;

/* Each nbdkit worker thread's engine context, made on its first request
 * (always after nbdkit forks) and freed when the thread exits.  nbdkit
 * calls back synchronously, so the plugin uses the start-and-wait API and
 * needs only the bounce region of the pool.
 */
static pthread_key_t thread_key;
static bool thread_key_made;

static void
free_thread (void *t)
{
  pdio_thread_free (t);
}

/* This worker's context; NULL with errno set on failure. */
static struct pdio_thread *
this_thread (void)
{
  const struct pdio_thread_config cfg = {
    .pool_bytes = PDIO_POOL_BOUNCE_ONLY,
    .ring_entries = 8,
  };
  struct pdio_thread *t = pthread_getspecific (thread_key);
  int r;

  if (t)
    return t;
  r = pdio_thread_new (image, &cfg, &t);
  if (r < 0) {
    errno = -r;
    return NULL;
  }
  if (pthread_setspecific (thread_key, t) != 0) {
    pdio_thread_free (t);
    errno = ENOMEM;
    return NULL;
  }
  return t;
}

#ifdef PDIO_TEST_BREAKS
/* -D pdio.canary=1, in the test build only (tests/plugin/pdio_test.la):
 * fill bounce pages with a canary whenever they are free, so any leak of
 * stale bounce memory to a client shows.
 */
NBDKIT_DLL_PUBLIC int pdio_debug_canary = 0;
#define bounce_canary() (pdio_debug_canary != 0)
#else
#define bounce_canary() false
#endif

static void
log_warning (const char *fmt, va_list args)
{
  /* nbdkit 1.32 has no warning level: say it plainly on stderr. */
  fprintf (stderr, "nbdkit: pdio: warning: ");
  vfprintf (stderr, fmt, args);
  fprintf (stderr, "\n");
}

static const struct pdio_log plugin_log = {
  .error = nbdkit_verror,
  .warning = log_warning,
  .debug = nbdkit_vdebug,
};

static void
plugin_unload (void)
{
  if (image) {
    struct pdio_stats st;
    char buf[512];

    pdio_get_stats (image, &st);
    pdio_format_stats (&st, buf, sizeof buf);
    nbdkit_debug ("stats: %s", buf);
    pdio_close (image);
  }
  if (thread_key_made)
    pthread_key_delete (thread_key);
  free (filename);
}

static int
parse_align (const char *value)
{
  int64_t v = nbdkit_parse_size (value);

  if (v == -1)
    return -1;
  if (v < 512 || v > (1 << 20) || !is_power_of_two (v)) {
    nbdkit_error ("align=%s: must be a power of two from 512 to 1M", value);
    return -1;
  }
  align = v;
  return 0;
}

static int
plugin_config (const char *key, const char *value)
{
  int r;

  if (strcmp (key, "file") == 0) {
    free (filename);
    /* nbdkit changes directory when it daemonizes. */
    filename = nbdkit_absolute_path (value);
    return filename ? 0 : -1;
  }
  if (strcmp (key, "readonly") == 0) {
    r = nbdkit_parse_bool (value);
    if (r == -1)
      return -1;
    readonly = r;
    return 0;
  }
  if (strcmp (key, "backend") == 0) {
    if (strcmp (value, "io_uring") == 0 || strcmp (value, "uring") == 0)
      backend = PDIO_BACKEND_URING;
    else if (strcmp (value, "psync") == 0)
      backend = PDIO_BACKEND_PSYNC;
    else {
      nbdkit_error ("backend=%s: must be io_uring or psync", value);
      return -1;
    }
    return 0;
  }
  if (strcmp (key, "align") == 0)
    return parse_align (value);

  nbdkit_error ("unknown parameter '%s' (pdio takes file=, readonly=, "
                "backend=, align=)", key);
  return -1;
}

static int
plugin_config_complete (void)
{
  if (filename == NULL) {
    nbdkit_error ("the file=IMAGE parameter is required");
    return -1;
  }
  return 0;
}

#define plugin_config_help \
  "file=<FILENAME>     (required) The image file or block device.\n" \
  "readonly=true       Serve read-only.\n" \
  "backend=io_uring|psync  I/O backend (default io_uring, psync if refused).\n" \
  "align=<N>           Raise the direct-I/O alignment (power of two)."

static int
plugin_get_ready (void)
{
  const struct pdio_config cfg = {
    .file = filename,
    .readonly = readonly,
    .backend = backend,
    .align = align,
    .bounce_canary = bounce_canary (),
    .log = plugin_log,
  };

  if (pthread_key_create (&thread_key, free_thread) != 0) {
    nbdkit_error ("pthread_key_create: out of resources");
    return -1;
  }
  thread_key_made = true;
  return pdio_open (&cfg, &image) == 0 ? 0 : -1;
}

static void *
plugin_open_connection (int readonly_conn)
{
  (void) readonly_conn;
  return image;
}

static void
plugin_close_connection (void *handle)
{
  struct pdio_stats st;
  char buf[512];

  pdio_get_stats (handle, &st);
  pdio_format_stats (&st, buf, sizeof buf);
  nbdkit_debug ("stats: %s", buf);
}

/* The one place an engine error becomes the client's error. */
static int
fail (int r, const char *op, uint32_t count, uint64_t offset)
{
  errno = -r;
  /* A fast zero that would be slow is an answer, not a failure. */
  if (r == -ENOTSUP)
    nbdkit_debug ("%s: %" PRIu32 " bytes at %" PRIu64 ": %m", op, count,
                  offset);
  else
    nbdkit_error ("%s: %" PRIu32 " bytes at %" PRIu64 ": %m", op, count,
                  offset);
  return -1;
}

static int64_t
plugin_get_size (void *handle)
{
  struct pdio_info info;

  pdio_get_info (handle, &info);
  return info.size;
}

static int
plugin_block_size (void *handle, uint32_t *minimum, uint32_t *preferred,
                   uint32_t *maximum)
{
  struct pdio_info info;

  pdio_get_info (handle, &info);
  *minimum = info.block_min;
  *preferred = info.block_preferred;
  *maximum = info.block_max;
  return 0;
}

static int
plugin_can_write (void *handle)
{
  struct pdio_info info;

  pdio_get_info (handle, &info);
  return !info.readonly;
}

static int
plugin_can_extents (void *handle)
{
  struct pdio_info info;

  pdio_get_info (handle, &info);
  return info.can_extents;
}

static int
plugin_can_true (void *handle)
{
  (void) handle;
  return 1;
}

static int
plugin_can_fua (void *handle)
{
  (void) handle;
  return NBDKIT_FUA_NATIVE;
}

/* pdio keeps no cache, by design: advertising NBD_CMD_CACHE would promise
 * something it deliberately does not do.
 */
static int
plugin_can_cache (void *handle)
{
  (void) handle;
  return NBDKIT_CACHE_NONE;
}

/* Every request callback starts here: this worker's engine context. */
#define THREAD_OR_FAIL(t, op, count, offset)                            \
  struct pdio_thread *t = this_thread ();                               \
  if (t == NULL)                                                        \
    return fail (-errno, op, count, offset)

static int
plugin_pread (void *handle, void *buf, uint32_t count, uint64_t offset,
              uint32_t flags)
{
  THREAD_OR_FAIL (t, "pread", count, offset);
  int r = pdio_read (t, buf, count, offset);

  (void) handle;
  (void) flags;
  return r < 0 ? fail (r, "pread", count, offset) : 0;
}

static int
plugin_pwrite (void *handle, const void *buf, uint32_t count,
               uint64_t offset, uint32_t flags)
{
  THREAD_OR_FAIL (t, "pwrite", count, offset);
  int r = pdio_write (t, buf, count, offset,
                      (flags & NBDKIT_FLAG_FUA) ? PDIO_FUA : 0);

  (void) handle;
  return r < 0 ? fail (r, "pwrite", count, offset) : 0;
}

static int
plugin_zero (void *handle, uint32_t count, uint64_t offset, uint32_t flags)
{
  THREAD_OR_FAIL (t, "zero", count, offset);
  unsigned f = 0;
  int r;

  (void) handle;
  if (flags & NBDKIT_FLAG_FUA)
    f |= PDIO_FUA;
  if (flags & NBDKIT_FLAG_MAY_TRIM)
    f |= PDIO_MAY_TRIM;
  if (flags & NBDKIT_FLAG_FAST_ZERO)
    f |= PDIO_FAST_ZERO;
  r = pdio_zero (t, count, offset, f);
  return r < 0 ? fail (r, "zero", count, offset) : 0;
}

static int
plugin_trim (void *handle, uint32_t count, uint64_t offset, uint32_t flags)
{
  THREAD_OR_FAIL (t, "trim", count, offset);
  int r = pdio_trim (t, count, offset,
                     (flags & NBDKIT_FLAG_FUA) ? PDIO_FUA : 0);

  (void) handle;
  return r < 0 ? fail (r, "trim", count, offset) : 0;
}

static int
plugin_flush (void *handle, uint32_t flags)
{
  THREAD_OR_FAIL (t, "flush", 0, 0);
  int r = pdio_flush (t);

  (void) handle;
  (void) flags;
  return r < 0 ? fail (r, "flush", 0, 0) : 0;
}

static int
add_extent (void *opaque, uint64_t offset, uint64_t length, bool hole)
{
  struct nbdkit_extents *extents = opaque;
  uint32_t type = hole ? NBDKIT_EXTENT_HOLE | NBDKIT_EXTENT_ZERO : 0;

  return nbdkit_add_extent (extents, offset, length, type) == -1 ? -EIO : 0;
}

static int
plugin_extents (void *handle, uint32_t count, uint64_t offset,
                uint32_t flags, struct nbdkit_extents *extents)
{
  int r = pdio_extents (handle, count, offset, flags & NBDKIT_FLAG_REQ_ONE,
                        add_extent, extents);

  return r < 0 ? fail (r, "extents", count, offset) : 0;
}

static struct nbdkit_plugin plugin = {
  .name = "pdio",
  .version = PACKAGE_VERSION,
  .longname = "pdio: O_DIRECT image server (a userspace loop device)",
  .description = "Serves an image with every byte through O_DIRECT, so it "
                 "never sits in the host page cache.",
  .magic_config_key = "file",
  .config = plugin_config,
  .config_complete = plugin_config_complete,
  .config_help = plugin_config_help,
  .get_ready = plugin_get_ready,
  .unload = plugin_unload,
  .open = plugin_open_connection,
  .close = plugin_close_connection,
  .get_size = plugin_get_size,
  .block_size = plugin_block_size,
  .can_write = plugin_can_write,
  .can_flush = plugin_can_true,
  .can_fua = plugin_can_fua,
  .can_trim = plugin_can_true,
  .can_zero = plugin_can_true,
  .can_fast_zero = plugin_can_true,
  .can_extents = plugin_can_extents,
  .can_multi_conn = plugin_can_true,
  .can_cache = plugin_can_cache,
  .pread = plugin_pread,
  .pwrite = plugin_pwrite,
  .zero = plugin_zero,
  .trim = plugin_trim,
  .flush = plugin_flush,
  .extents = plugin_extents,
  .errno_is_preserved = 1,
};

NBDKIT_REGISTER_PLUGIN (plugin)
