/* SPDX-License-Identifier: BSD-3-Clause */
/* A device's counters (server.h): the file mapped, and the two points
 * of a request the connection tells (devstats_received at its header,
 * devstats_replied once its reply is sent).  Latency is taken with
 * clock_gettime (CLOCK_MONOTONIC), which the vDSO answers without a
 * system call: the worker's loop keeps only whole seconds, too coarse.
 */
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cmd.h"
#include "internal.h"

static size_t
file_len (uint32_t n_slots)
{
  return sizeof (struct pdio_devstats) +
         (size_t) n_slots * sizeof (struct pdio_devstats_slot);
}

static bool
layout_known (const struct pdio_devstats *h)
{
  return h->magic == PDIO_DEVSTATS_MAGIC &&
         h->version == PDIO_DEVSTATS_VERSION &&
         h->header_size == sizeof *h &&
         h->slot_size == sizeof (struct pdio_devstats_slot) &&
         h->n_ops == PDIO_DEVSTATS_OPS && h->n_errs == PDIO_DEVSTATS_ERRS &&
         h->n_buckets == PDIO_DEVSTATS_BUCKETS;
}

/* A server that starts afresh: whatever its predecessor had in flight
 * died with it (the kernel resends it to this one).
 */
static void
drop_in_flight (struct pdio_devstats *h)
{
  struct pdio_devstats_slot *slot = (struct pdio_devstats_slot *) (h + 1);

  for (uint32_t s = 0; s < h->n_slots; s++)
    for (int k = 0; k < PDIO_DEVSTATS_OPS; k++) {
      struct pdio_devstats_op *op = &slot[s].op[k];
      uint64_t left = op->started - op->finished;

      op->dropped += left;
      op->finished = op->started;
    }
}

int
pdio_devstats_open (const char *path, unsigned n_slots, bool server,
                    bool fresh, const struct pdio_log *log,
                    struct pdio_devstats_map *m)
{
  struct pdio_devstats *h;
  struct stat st;
  size_t len;
  int fd, err;

  *m = (struct pdio_devstats_map) { .fd = -1 };
  fd = open (path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd == -1) {
    err = -errno;
    pdio_log_msg (log->error, "stats file %s: %s", path, strerror (-err));
    return err;
  }
  /* The server, its successor and the supervisor may come at once. */
  if (flock (fd, LOCK_EX) == -1 || fstat (fd, &st) == -1) {
    err = -errno;
    pdio_log_msg (log->error, "stats file %s: %s", path, strerror (-err));
    close (fd);
    return err;
  }
  if (st.st_size == 0) {
    struct pdio_devstats fresh_h = {
      .magic = PDIO_DEVSTATS_MAGIC, .version = PDIO_DEVSTATS_VERSION,
      .header_size = sizeof fresh_h,
      .slot_size = sizeof (struct pdio_devstats_slot),
      .n_ops = PDIO_DEVSTATS_OPS, .n_errs = PDIO_DEVSTATS_ERRS,
      .n_buckets = PDIO_DEVSTATS_BUCKETS,
    };
    struct timespec ts;

    clock_gettime (CLOCK_REALTIME, &ts);
    fresh_h.created = ts.tv_sec * UINT64_C (1000000000) + ts.tv_nsec;
    if (pwrite (fd, &fresh_h, sizeof fresh_h, 0) != sizeof fresh_h) {
      err = errno ? -errno : -ENOSPC;
      pdio_log_msg (log->error, "stats file %s: cannot write: %s", path,
                    strerror (-err));
      goto fail;
    }
    st.st_size = sizeof fresh_h;
  }
  if ((size_t) st.st_size < sizeof *h) {
    err = -EPROTO;
    pdio_log_msg (log->error, "stats file %s: %lld bytes, too short for "
                  "pdio's counters", path, (long long) st.st_size);
    goto fail;
  }
  {
    struct pdio_devstats cur;

    if (pread (fd, &cur, sizeof cur, 0) != sizeof cur || !layout_known (&cur)) {
      err = -EPROTO;
      pdio_log_msg (log->error, "stats file %s: not pdio's counters of "
                    "version %d (another pdio's, or not a stats file): "
                    "remove it", path, PDIO_DEVSTATS_VERSION);
      goto fail;
    }
    if (cur.n_slots > n_slots)
      n_slots = cur.n_slots;
    if ((size_t) st.st_size < file_len (cur.n_slots)) {
      err = -EPROTO;
      pdio_log_msg (log->error, "stats file %s: shorter than its %u slots",
                    path, cur.n_slots);
      goto fail;
    }
  }
  /* Grown before n_slots says so: a reader never maps past the end. */
  len = file_len (n_slots);
  if ((size_t) st.st_size < len && ftruncate (fd, len) == -1) {
    err = -errno;
    pdio_log_msg (log->error, "stats file %s: cannot grow it: %s", path,
                  strerror (-err));
    goto fail;
  }
  h = mmap (NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (h == MAP_FAILED) {
    err = -errno;
    pdio_log_msg (log->error, "stats file %s: mmap: %s", path,
                  strerror (-err));
    goto fail;
  }
  __atomic_store_n (&h->n_slots, n_slots, __ATOMIC_RELEASE);
  if (server) {
    if (fresh)
      drop_in_flight (h);
    h->server_starts++;
  }
  flock (fd, LOCK_UN);
  m->fd = fd;
  m->h = h;
  m->len = len;
  return 0;

fail:
  close (fd);
  return err;
}

int
pdio_devstats_open_ro (const char *path, struct pdio_devstats_map *m,
                       char *why, size_t len)
{
  struct pdio_devstats cur;
  struct stat st;
  void *p;
  int err;

  *m = (struct pdio_devstats_map) { .fd = -1 };
  m->fd = open (path, O_RDONLY | O_CLOEXEC);
  if (m->fd == -1) {
    err = -errno;
    snprintf (why, len, "%s: %s", path, strerror (-err));
    return err;
  }
  if (fstat (m->fd, &st) == -1 ||
      pread (m->fd, &cur, sizeof cur, 0) != sizeof cur ||
      !layout_known (&cur) ||
      (size_t) st.st_size < file_len (cur.n_slots)) {
    snprintf (why, len, "%s: not pdio's counters of version %d", path,
              PDIO_DEVSTATS_VERSION);
    close (m->fd);
    m->fd = -1;
    return -EPROTO;
  }
  m->len = file_len (cur.n_slots);
  p = mmap (NULL, m->len, PROT_READ, MAP_SHARED, m->fd, 0);
  if (p == MAP_FAILED) {
    err = -errno;
    snprintf (why, len, "%s: mmap: %s", path, strerror (-err));
    close (m->fd);
    m->fd = -1;
    return err;
  }
  m->h = p;
  return 0;
}

void
pdio_devstats_close (struct pdio_devstats_map *m)
{
  if (m->h)
    munmap (m->h, m->len);
  if (m->fd >= 0)
    close (m->fd);
  *m = (struct pdio_devstats_map) { .fd = -1 };
}

void
pdio_devstats_sum (const struct pdio_devstats_map *m,
                   struct pdio_devstats_op out[PDIO_DEVSTATS_OPS])
{
  const struct pdio_devstats_slot *slot =
    (const struct pdio_devstats_slot *) (m->h + 1);
  /* Only the slots mapped: a server may have grown the file since. */
  uint32_t n = (m->len - sizeof *m->h) / sizeof *slot;

  memset (out, 0, PDIO_DEVSTATS_OPS * sizeof *out);
  for (uint32_t s = 0; s < n; s++)
    for (int k = 0; k < PDIO_DEVSTATS_OPS; k++) {
      const uint64_t *in = (const uint64_t *) &slot[s].op[k];
      uint64_t *o = (uint64_t *) &out[k];
      size_t max = offsetof (struct pdio_devstats_op, max_in_flight) /
                   sizeof (uint64_t);

      for (size_t i = 0; i < sizeof out[k] / sizeof (uint64_t); i++) {
        uint64_t v = __atomic_load_n (&in[i], __ATOMIC_RELAXED);

        if (i == max)
          o[i] = v > o[i] ? v : o[i];
        else
          o[i] += v;
      }
    }
}

/* --- the worker's side: one writer per slot --------------------------------- */
static inline void
bump (uint64_t *p, uint64_t by)
{
  __atomic_store_n (p, __atomic_load_n (p, __ATOMIC_RELAXED) + by,
                    __ATOMIC_RELAXED);
}

static inline uint64_t
now_ns (void)
{
  struct timespec ts;

  clock_gettime (CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * UINT64_C (1000000000) + ts.tv_nsec;
}

static enum pdio_devstats_opk
op_kind (uint16_t type)
{
  switch (type) {
  case NBD_CMD_READ: return PDIO_OPK_READ;
  case NBD_CMD_WRITE: return PDIO_OPK_WRITE;
  case NBD_CMD_FLUSH: return PDIO_OPK_FLUSH;
  case NBD_CMD_TRIM: return PDIO_OPK_TRIM;
  case NBD_CMD_WRITE_ZEROES: return PDIO_OPK_ZERO;
  case NBD_CMD_BLOCK_STATUS: return PDIO_OPK_BLOCK_STATUS;
  default: return PDIO_OPK_OTHER;
  }
}

static enum pdio_devstats_err
err_kind (uint32_t nbd_error)
{
  switch (nbd_error) {
  case NBD_EPERM: return PDIO_ERRK_EPERM;
  case NBD_EIO: return PDIO_ERRK_EIO;
  case NBD_ENOMEM: return PDIO_ERRK_ENOMEM;
  case NBD_EINVAL: return PDIO_ERRK_EINVAL;
  case NBD_ENOSPC: return PDIO_ERRK_ENOSPC;
  case NBD_EOVERFLOW: return PDIO_ERRK_EOVERFLOW;
  case NBD_ENOTSUP: return PDIO_ERRK_ENOTSUP;
  case NBD_ESHUTDOWN: return PDIO_ERRK_ESHUTDOWN;
  default: return PDIO_ERRK_OTHER;
  }
}

static inline struct pdio_devstats_op *
op_of (const struct worker *w, const struct nbd_cmd *cmd)
{
  struct pdio_devstats_slot *slot =
    (struct pdio_devstats_slot *) (w->ctx->stats + 1);

  return &slot[w->id].op[op_kind (cmd->nbd.type)];
}

uint64_t
devstats_clock (const struct worker *w)
{
  return w->ctx->stats ? now_ns () : 0;
}

void
devstats_received (struct worker *w, struct nbd_cmd *cmd, uint64_t at)
{
  struct pdio_devstats_op *op;
  uint64_t held;

  if (w->ctx->stats == NULL)
    return;
  op = op_of (w, cmd);
  cmd->stats = NBD_CMD_STATS_STARTED;
  /* A header that came with a hand-over has no time of its own. */
  cmd->received_ns = at ? at : now_ns ();
  bump (&op->started, 1);
  held = op->started - op->finished;
  if (held > op->max_in_flight)
    __atomic_store_n (&op->max_in_flight, held, __ATOMIC_RELAXED);
}

void
devstats_replied (struct worker *w, struct nbd_cmd *cmd)
{
  struct pdio_devstats_op *op;
  uint64_t ns;

  if (cmd->stats != NBD_CMD_STATS_STARTED)
    return;
  op = op_of (w, cmd);
  cmd->stats = NBD_CMD_STATS_DONE;
  ns = now_ns () - cmd->received_ns;
  bump (&op->requests, 1);
  if (cmd->error)
    bump (&op->errors[err_kind (cmd->error)], 1);
  else if (cmd->nbd.type != NBD_CMD_FLUSH)
    bump (&op->bytes, cmd->nbd.count);
  bump (&op->latency_sum_ns, ns);
  bump (&op->buckets[pdio_devstats_bucket (ns)], 1);
  bump (&op->finished, 1);
}

void
devstats_gone (struct worker *w, struct nbd_cmd *cmd, bool dropped)
{
  struct pdio_devstats_op *op;

  if (cmd->stats != NBD_CMD_STATS_STARTED)
    return;
  op = op_of (w, cmd);
  cmd->stats = NBD_CMD_STATS_DONE;
  if (dropped)
    bump (&op->dropped, 1);
  bump (&op->finished, 1);
}
