/* NBD commands as engine work: a checked request becomes an engine
 * request (pdio_submit; for BLOCK_STATUS an extents request); it ends in
 * conn_cmd_done, and nbd_cmd_reply turns
 * the result into the reply's bytes.  No socket I/O here: that is the
 * connection's (conn.c).
 */
#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <string.h>

#include "cmd.h"
#include "internal.h"

/* A BLOCK_STATUS reply is built in one pool page: up to 509 extents. */
#define BLOCK_STATUS_BUF 4096

size_t
nbd_cmd_buf_len (const struct nbd_request *r)
{
  switch (r->type) {
  case NBD_CMD_READ:
  case NBD_CMD_WRITE:
    return r->count;
  case NBD_CMD_BLOCK_STATUS:
    return BLOCK_STATUS_BUF;
  default:
    return 0;
  }
}

static void
on_engine_done (struct pdio_req *er, int err)
{
  struct nbd_cmd *cmd = container_of (er, struct nbd_cmd, er);
  const struct nbd_request *r = &cmd->nbd;

  cmd->error = nbd_error_of_errno (err);
  /* Named as the plugin names them, so both front ends log alike.  A
   * fast zero that would be slow is an answer, not a failure.
   */
  if (err)
    worker_log (cmd->w, err == -ENOTSUP ? PDIO_LOG_DEBUG : PDIO_LOG_ERROR,
                "%s: %" PRIu32 " bytes at %" PRIu64 ": %s",
                r->type == NBD_CMD_READ ? "pread" :
                r->type == NBD_CMD_WRITE ? "pwrite" :
                r->type == NBD_CMD_WRITE_ZEROES ? "zero" :
                r->type == NBD_CMD_TRIM ? "trim" : "flush",
                r->count, r->offset, strerror (-err));
  conn_cmd_done (cmd);
}

static void
submit_engine (struct nbd_cmd *cmd)
{
  const struct nbd_request *r = &cmd->nbd;
  unsigned flags = (r->flags & NBD_CMD_FLAG_FUA) ? PDIO_FUA : 0;
  enum pdio_op op;

  switch (r->type) {
  case NBD_CMD_READ: op = PDIO_OP_READ; flags = 0; break;
  case NBD_CMD_WRITE: op = PDIO_OP_WRITE; break;
  case NBD_CMD_TRIM: op = PDIO_OP_TRIM; break;
  case NBD_CMD_WRITE_ZEROES:
    op = PDIO_OP_ZERO;
    if (!(r->flags & NBD_CMD_FLAG_NO_HOLE))
      flags |= PDIO_MAY_TRIM;
    if (r->flags & NBD_CMD_FLAG_FAST_ZERO)
      flags |= PDIO_FAST_ZERO;
    break;
  default: op = PDIO_OP_FLUSH; flags = 0; break;
  }
  cmd->er = (struct pdio_req) {
    .op = op, .flags = flags, .offset = r->offset, .count = r->count,
    .buf = cmd->buf, .done = on_engine_done, .arrived = cmd->arrived,
  };
  pdio_submit (cmd->w->t, &cmd->er);
}

static int
add_extent (void *opaque, uint64_t offset, uint64_t length, bool hole)
{
  struct nbd_cmd *cmd = opaque;

  (void) offset;
  return nbd_extents_add (&cmd->extents, length,
                          hole ? NBD_STATE_HOLE | NBD_STATE_ZERO : 0) ? 0 : 1;
}

/* The reply chunk, built in cmd's buf. */
static void
on_extents_done (struct pdio_req *er, int err)
{
  struct nbd_cmd *cmd = container_of (er, struct nbd_cmd, er);
  const struct nbd_request *r = &cmd->nbd;

  if (err < 0) {
    worker_log (cmd->w, PDIO_LOG_ERROR, "extents: %" PRIu32 " bytes at %"
                PRIu64 ": %s", r->count, r->offset, strerror (-err));
    cmd->error = nbd_error_of_errno (err);
  }
  else {
    /* No information is "data": always a safe answer. */
    if (cmd->extents.n == 0)
      nbd_extents_add (&cmd->extents, r->count, 0);
    cmd->payload = cmd->buf;
    cmd->payload_len = nbd_extents_finish (&cmd->extents, r->cookie);
  }
  conn_cmd_done (cmd);
}

/* SEEK_DATA/SEEK_HOLE may block (FUSE, NFS): the engine runs them off
 * this thread, and the reply is built from the completion.
 */
static void
block_status (struct nbd_cmd *cmd)
{
  const struct server_ctx *ctx = cmd->w->ctx;
  const struct nbd_request *r = &cmd->nbd;
  bool one = r->flags & NBD_CMD_FLAG_REQ_ONE;

  nbd_extents_init (&cmd->extents, cmd->buf,
                    one ? 1 : (cmd->buf_len - NBD_BLOCK_STATUS_LEN (0)) / 8,
                    r->count);
  if (!ctx->can_extents) {
    on_extents_done (&cmd->er, 0);
    return;
  }
  cmd->er = (struct pdio_req) {
    .op = PDIO_OP_EXTENTS, .flags = one ? PDIO_REQ_ONE : 0,
    .offset = r->offset, .count = r->count, .extent = add_extent,
    .opaque = cmd, .done = on_extents_done,
  };
  pdio_submit (cmd->w->t, &cmd->er);
}

void
nbd_cmd_start (struct nbd_cmd *cmd)
{
  if (cmd->nbd.type == NBD_CMD_BLOCK_STATUS)
    block_status (cmd);
  else
    submit_engine (cmd);
}

/* Structured replies when negotiated for READ and BLOCK_STATUS, which
 * need them, and for errors (an error chunk); the spec allows the shorter
 * simple reply for the other successes.
 */
void
nbd_cmd_reply (struct nbd_cmd *cmd, bool structured)
{
  const struct nbd_request *r = &cmd->nbd;

  if (cmd->error) {
    cmd->payload = NULL;
    cmd->payload_len = 0;
    cmd->hdr_len = structured
      ? nbd_error_chunk (cmd->hdr, r->cookie, cmd->error)
      : nbd_simple_reply (cmd->hdr, r->cookie, cmd->error);
  }
  else if (r->type == NBD_CMD_READ) {
    cmd->hdr_len = structured
      ? nbd_offset_data_header (cmd->hdr, r->cookie, r->offset, r->count)
      : nbd_simple_reply (cmd->hdr, r->cookie, 0);
    cmd->payload = cmd->buf;
    cmd->payload_len = r->count;
  }
  else if (r->type == NBD_CMD_BLOCK_STATUS)
    cmd->hdr_len = 0;           /* the whole chunk is the payload */
  else
    cmd->hdr_len = nbd_simple_reply (cmd->hdr, r->cookie, 0);
}
