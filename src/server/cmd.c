/* SPDX-License-Identifier: BSD-3-Clause */
/* NBD commands as engine work: a checked request becomes an engine
 * request (pdio_submit; for BLOCK_STATUS an extents request); it ends in
 * conn_cmd_done, and nbd_cmd_reply turns
 * the result into the reply's bytes.  No socket I/O here: that is the
 * connection's (conn.c).  Every engine request made for a command carries
 * the size the command was judged against (cmd->size, PDIO_SIZED), so a
 * resize never shows one command two sizes.
 *
 * A READ or WRITE longer than NBD_STREAM_OVER is streamed, so that what
 * it holds does not grow with its length: its data goes through
 * NBD_STREAM_SLOTS pieces' buffers in turn.
 *   WRITE: a PDIO_OP_LOCK request holds its whole range from the start
 *   (overlapping writes take effect in order, as for any write); the
 *   connection receives piece after piece into a free slot, and each full
 *   piece is written (PDIO_HELD) once the range is held.  After an error
 *   the rest of the payload is still received, so the stream stays in
 *   step, and dropped; the reply, once every byte is in and every piece
 *   is done, is that first error: nothing beyond what was written is
 *   claimed.
 *   READ: pieces are read ahead into the free slots and sent in order as
 *   one reply: a simple reply's header then the data, or one OFFSET_DATA
 *   chunk for the whole length (so NBD_CMD_FLAG_DF holds) followed by a
 *   NONE chunk.  A read that fails before anything was sent gets a plain
 *   error reply.  After the header went out, a structured reply pads the
 *   failed piece (and those after it, left unread) with zeroes, as the
 *   spec requires, and ends in an ERROR chunk; a simple reply has no way
 *   to say it, and the spec's answer is to hang up (conn.c).
 */
#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <string.h>

#include "cmd.h"
#include "container_of.h"
#include "internal.h"

/* A BLOCK_STATUS reply is built in one pool page: up to 509 extents. */
#define BLOCK_STATUS_BUF 4096

bool
nbd_cmd_streamed (const struct nbd_request *r)
{
  return (r->type == NBD_CMD_READ || r->type == NBD_CMD_WRITE) &&
         r->count > NBD_STREAM_OVER;
}

size_t
nbd_cmd_buf_len (const struct nbd_request *r)
{
  switch (r->type) {
  case NBD_CMD_READ:
  case NBD_CMD_WRITE:
    return nbd_cmd_streamed (r) ? NBD_STREAM_SLOTS * NBD_STREAM_PIECE
                                : r->count;
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
    .op = op, .flags = flags | PDIO_SIZED, .offset = r->offset,
    .count = r->count, .buf = cmd->buf, .done = on_engine_done,
    .arrived = cmd->arrived, .size = cmd->size,
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
                    one ? 1 : NBD_BLOCK_STATUS_ROOM (cmd->buf_len),
                    r->count);
  if (!ctx->can_extents) {
    on_extents_done (&cmd->er, 0);
    return;
  }
  cmd->er = (struct pdio_req) {
    .op = PDIO_OP_EXTENTS, .flags = (one ? PDIO_REQ_ONE : 0) | PDIO_SIZED,
    .offset = r->offset, .count = r->count, .extent = add_extent,
    .opaque = cmd, .done = on_extents_done, .size = cmd->size,
  };
  pdio_submit (cmd->w->t, &cmd->er);
}

/* --- streamed READs and WRITEs -------------------------------------------------- */
/* Pieces end where the image has a multiple of NBD_STREAM_PIECE, not
 * every NBD_STREAM_PIECE bytes of the request: so two pieces in flight
 * together never share a block of the direct-I/O alignment (at most
 * 1 MiB), which both would read, patch and write back (PDIO_HELD takes no
 * range lock to keep them apart), and the pieces of an aligned request
 * are aligned.  The piece at request offset pos is in slot piece_no % N.
 */
static uint32_t
piece_no (const struct nbd_cmd *cmd, uint32_t pos)
{
  return (cmd->nbd.offset % NBD_STREAM_PIECE + pos) / NBD_STREAM_PIECE;
}

static uint32_t
piece_len (const struct nbd_cmd *cmd, uint32_t pos)
{
  uint32_t to_boundary = NBD_STREAM_PIECE -
    (cmd->nbd.offset + pos) % NBD_STREAM_PIECE;

  return cmd->nbd.count - pos < to_boundary ? cmd->nbd.count - pos
                                            : to_boundary;
}

static struct stream_slot *
slot_at (struct nbd_cmd *cmd, uint32_t pos)
{
  return &cmd->stream->slot[piece_no (cmd, pos) % NBD_STREAM_SLOTS];
}

static void
piece_log (const struct stream_slot *sl, int err)
{
  const struct nbd_cmd *cmd = sl->cmd;
  const struct nbd_request *r = &cmd->nbd;

  worker_log (cmd->w, PDIO_LOG_ERROR, "%s: %" PRIu32 " bytes at %" PRIu64
              " (of %" PRIu32 " at %" PRIu64 "): %s",
              r->type == NBD_CMD_READ ? "pread" : "pwrite", sl->len,
              r->offset + sl->pos, r->count, r->offset, strerror (-err));
}

static void
piece_submit (struct stream_slot *sl, enum pdio_op op, unsigned flags,
              void (*done) (struct pdio_req *er, int err))
{
  struct nbd_cmd *cmd = sl->cmd;

  sl->state = SLOT_IO;
  cmd->stream->io++;
  sl->er = (struct pdio_req) {
    .op = op, .flags = flags | PDIO_SIZED,
    .offset = cmd->nbd.offset + sl->pos, .count = sl->len, .buf = sl->buf,
    .done = done, .opaque = sl, .size = cmd->size,
  };
  pdio_submit (cmd->w->t, &sl->er);
}

/* Nothing of st in flight, nothing held: it can be freed. */
static bool
stream_idle (struct nbd_cmd *cmd)
{
  struct nbd_stream *st = cmd->stream;

  if (st->io || st->lock_pending)
    return false;
  if (st->locked) {
    st->locked = false;
    pdio_unlock (cmd->w->t, &st->lock);
  }
  return true;
}

bool
nbd_stream_finish (struct nbd_cmd *cmd)
{
  cmd->stream->finished = true;
  return stream_idle (cmd);
}

/* WRITE: once the payload is all in and every piece is done, the reply;
 * true if cmd was handed back to the connection (or freed).
 */
static bool
write_maybe_end (struct nbd_cmd *cmd)
{
  struct nbd_stream *st = cmd->stream;

  if (st->finished) {
    if (!stream_idle (cmd))
      return false;
    conn_stream_end (cmd);
    return true;
  }
  if (!st->rx_done || !stream_idle (cmd))
    return false;
  cmd->error = nbd_error_of_errno (st->err);
  conn_cmd_done (cmd);
  return true;
}

static void on_piece_written (struct pdio_req *er, int err);

/* A received piece: written if the range is held, kept until it is, or
 * dropped once the request has failed.
 */
static void
write_piece (struct stream_slot *sl)
{
  struct nbd_cmd *cmd = sl->cmd;
  struct nbd_stream *st = cmd->stream;

  if (st->err || st->finished)
    sl->state = SLOT_FREE;
  else if (!st->locked)
    sl->state = SLOT_FULL;
  else
    piece_submit (sl, PDIO_OP_WRITE, PDIO_HELD |
                  ((cmd->nbd.flags & NBD_CMD_FLAG_FUA) ? PDIO_FUA : 0),
                  on_piece_written);
}

static void
on_piece_written (struct pdio_req *er, int err)
{
  struct stream_slot *sl = er->opaque;
  struct nbd_cmd *cmd = sl->cmd;
  struct nbd_stream *st = cmd->stream;

  st->io--;
  sl->state = SLOT_FREE;
  if (err) {
    piece_log (sl, err);
    if (st->err == 0)
      st->err = err;
  }
  /* Last: the connection may receive into the slot, or hang up. */
  if (!write_maybe_end (cmd))
    conn_stream_progress (cmd);
}

static void
on_locked (struct pdio_req *er, int err)
{
  struct nbd_cmd *cmd = er->opaque;
  struct nbd_stream *st = cmd->stream;

  st->lock_pending = false;
  if (err) {
    worker_log (cmd->w, PDIO_LOG_ERROR, "pwrite: %" PRIu32 " bytes at %" PRIu64
                ": %s", cmd->nbd.count, cmd->nbd.offset, strerror (-err));
    st->err = err;
  }
  else
    st->locked = true;
  for (unsigned i = 0; i < NBD_STREAM_SLOTS; i++)
    if (st->slot[i].state == SLOT_FULL)
      write_piece (&st->slot[i]);
  if (!write_maybe_end (cmd))
    conn_stream_progress (cmd);
}

uint8_t *
nbd_stream_rx_buf (struct nbd_cmd *cmd, size_t *len)
{
  struct nbd_stream *st = cmd->stream;
  struct stream_slot *sl = slot_at (cmd, st->next);

  if (sl->state == SLOT_FREE) {
    sl->state = SLOT_FILLING;
    sl->pos = st->next;
    sl->len = piece_len (cmd, st->next);
    sl->got = 0;
  }
  if (sl->state != SLOT_FILLING)
    return NULL;
  *len = sl->len - sl->got;
  return sl->buf + sl->got;
}

void
nbd_stream_received (struct nbd_cmd *cmd, size_t n)
{
  struct nbd_stream *st = cmd->stream;
  struct stream_slot *sl = slot_at (cmd, st->next);

  sl->got += n;
  if (sl->got == sl->len) {
    st->next += sl->len;
    write_piece (sl);
  }
}

void
nbd_stream_rx_end (struct nbd_cmd *cmd)
{
  cmd->stream->rx_done = true;
  write_maybe_end (cmd);
}

static void on_piece_read (struct pdio_req *er, int err);

/* READ: fills the free slots with the next pieces, in order; after an
 * error a piece is zeroes (the padding a structured reply owes), not read.
 */
static void
read_ahead (struct nbd_cmd *cmd)
{
  struct nbd_stream *st = cmd->stream;
  uint32_t count = cmd->nbd.count;

  while (st->next < count && !st->finished) {
    struct stream_slot *sl = slot_at (cmd, st->next);

    if (sl->state != SLOT_FREE)
      break;
    sl->pos = st->next;
    sl->len = piece_len (cmd, st->next);
    st->next += sl->len;
    if (st->err) {
      memset (sl->buf, 0, sl->len);
      sl->state = SLOT_READY;
      continue;
    }
    piece_submit (sl, PDIO_OP_READ, 0, on_piece_read);
  }
}

static void
on_piece_read (struct pdio_req *er, int err)
{
  struct stream_slot *sl = er->opaque;
  struct nbd_cmd *cmd = sl->cmd;
  struct nbd_stream *st = cmd->stream;

  st->io--;
  sl->state = SLOT_READY;
  if (err) {
    piece_log (sl, err);
    if (st->err == 0)
      st->err = err;
    memset (sl->buf, 0, sl->len);
  }
  if (st->finished) {
    if (stream_idle (cmd))
      conn_stream_end (cmd);
    return;
  }
  conn_stream_ready (cmd);
}

bool
nbd_stream_piece (struct nbd_cmd *cmd, bool structured)
{
  struct nbd_stream *st = cmd->stream;
  const struct nbd_request *r = &cmd->nbd;
  struct stream_slot *sl = slot_at (cmd, st->sent);

  cmd->hdr_len = 0;
  cmd->payload = NULL;
  cmd->payload_len = 0;
  if (!st->started) {
    if (st->err) {
      /* Nothing went out yet: a plain error reply says it all. */
      cmd->error = nbd_error_of_errno (st->err);
      cmd->hdr_len = structured
        ? nbd_error_chunk (cmd->hdr, r->cookie, cmd->error)
        : nbd_simple_reply (cmd->hdr, r->cookie, cmd->error);
      st->started = st->last = true;
      return true;
    }
    if (sl->state != SLOT_READY)
      return false;
    cmd->hdr_len = structured
      ? nbd_offset_data_header (cmd->hdr, r->cookie, r->offset, r->count,
                                false)
      : nbd_simple_reply (cmd->hdr, r->cookie, 0);
    st->started = true;
  }
  else if (st->err && !structured)
    return false;               /* never zeroes as data: conn.c hangs up */
  else if (st->sent == r->count) {
    /* Structured: the final chunk, which says how it went. */
    cmd->hdr_len = st->err
      ? nbd_error_chunk (cmd->hdr, r->cookie, nbd_error_of_errno (st->err))
      : nbd_none_chunk (cmd->hdr, r->cookie);
    st->last = true;
    return true;
  }
  else if (sl->state != SLOT_READY || sl->pos != st->sent)
    return false;
  cmd->payload = sl->buf;
  cmd->payload_len = sl->len;
  st->last = !structured && sl->pos + sl->len == r->count;
  return true;
}

bool
nbd_stream_sent (struct nbd_cmd *cmd)
{
  struct nbd_stream *st = cmd->stream;

  if (cmd->payload_len) {
    struct stream_slot *sl = slot_at (cmd, st->sent);

    st->sent += sl->len;
    sl->state = SLOT_FREE;
  }
  cmd->hdr_len = 0;
  cmd->payload = NULL;
  cmd->payload_len = 0;
  if (st->last)
    return true;
  read_ahead (cmd);
  return false;
}

bool
nbd_stream_broken (const struct nbd_cmd *cmd, bool structured)
{
  return !structured && cmd->stream->started && !cmd->stream->last &&
         cmd->stream->err;
}

static void
stream_start (struct nbd_cmd *cmd)
{
  struct nbd_stream *st = cmd->stream;
  const struct nbd_request *r = &cmd->nbd;

  for (unsigned i = 0; i < NBD_STREAM_SLOTS; i++) {
    st->slot[i].cmd = cmd;
    st->slot[i].buf = (uint8_t *) cmd->buf + i * NBD_STREAM_PIECE;
    st->slot[i].state = SLOT_FREE;
  }
  if (r->type == NBD_CMD_READ) {
    read_ahead (cmd);
    return;
  }
  st->lock_pending = true;
  st->lock = (struct pdio_req) {
    .op = PDIO_OP_LOCK, .flags = PDIO_SIZED, .offset = r->offset,
    .count = r->count, .done = on_locked, .opaque = cmd, .size = cmd->size,
  };
  pdio_submit (cmd->w->t, &st->lock);
}

void
nbd_cmd_start (struct nbd_cmd *cmd)
{
  if (cmd->stream)
    stream_start (cmd);
  else if (cmd->nbd.type == NBD_CMD_BLOCK_STATUS)
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
      ? nbd_offset_data_header (cmd->hdr, r->cookie, r->offset, r->count,
                                true)
      : nbd_simple_reply (cmd->hdr, r->cookie, 0);
    cmd->payload = cmd->buf;
    cmd->payload_len = r->count;
  }
  else if (r->type == NBD_CMD_BLOCK_STATUS)
    cmd->hdr_len = 0;           /* the whole chunk is the payload */
  else
    cmd->hdr_len = nbd_simple_reply (cmd->hdr, r->cookie, 0);
}
