/* SPDX-License-Identifier: BSD-3-Clause */
/* The NBD spec's rules, as pdio applies them: the flags an export
 * advertises, the verdict on a request, the error an errno becomes.  The
 * bytes themselves are handshake_wire.c's and transmission_wire.c's.
 * Pure functions only.
 */
#include <config.h>

#include <errno.h>

#include "proto.h"

uint16_t
nbd_export_flags (const struct nbd_export *e, bool structured)
{
  uint16_t f = NBD_FLAG_HAS_FLAGS | NBD_FLAG_SEND_FLUSH |
               NBD_FLAG_CAN_MULTI_CONN;

  /* As nbdkit does for the plugin: a read-only export offers no FUA, trim
   * or zeroes (they all write).
   */
  if (e->readonly)
    f |= NBD_FLAG_READ_ONLY;
  else
    f |= NBD_FLAG_SEND_FUA | NBD_FLAG_SEND_TRIM |
         NBD_FLAG_SEND_WRITE_ZEROES | NBD_FLAG_SEND_FAST_ZERO;
  if (structured)
    f |= NBD_FLAG_SEND_DF;
  return f;
}

/* The command flags a command may carry in this session. */
static uint16_t
allowed_flags (uint16_t type, const struct nbd_session *s)
{
  uint16_t f = (s->eflags & NBD_FLAG_SEND_FUA) ? NBD_CMD_FLAG_FUA : 0;

  switch (type) {
  case NBD_CMD_READ:
    return f | ((s->eflags & NBD_FLAG_SEND_DF) ? NBD_CMD_FLAG_DF : 0);
  case NBD_CMD_WRITE_ZEROES:
    return f | NBD_CMD_FLAG_NO_HOLE |
           ((s->eflags & NBD_FLAG_SEND_FAST_ZERO) ? NBD_CMD_FLAG_FAST_ZERO : 0);
  case NBD_CMD_BLOCK_STATUS:
    return f | NBD_CMD_FLAG_REQ_ONE;
  default:
    return f;
  }
}

static bool
in_range (const struct nbd_request *r, uint64_t size)
{
  return r->offset <= size && r->count <= size - r->offset;
}

struct nbd_verdict
nbd_check_request (const struct nbd_request *r, const struct nbd_session *s)
{
  struct nbd_verdict v = { 0 };
  bool readonly = s->eflags & NBD_FLAG_READ_ONLY;

  /* A WRITE's payload follows whatever the verdict. */
  if (r->type == NBD_CMD_WRITE)
    v.discard = r->count;
  /* DISC has no reply to carry an error: whatever its flags, it ends
   * the session.
   */
  if (r->type == NBD_CMD_DISC)
    return v;

  switch (r->type) {
  case NBD_CMD_READ: case NBD_CMD_WRITE: case NBD_CMD_FLUSH:
  case NBD_CMD_TRIM: case NBD_CMD_WRITE_ZEROES: case NBD_CMD_DISC:
    break;
  case NBD_CMD_BLOCK_STATUS:
    if (!s->meta_base_allocation)
      v.error = NBD_EINVAL;     /* no context selected: the spec's EINVAL */
    break;
  default:
    v.error = NBD_EINVAL;       /* unknown command */
  }
  /* A change to a read-only export is EPERM whatever else is wrong with
   * it (as nbdkit answers: its flags are not even looked at).
   */
  if (v.error == 0 && readonly &&
      (r->type == NBD_CMD_WRITE || r->type == NBD_CMD_TRIM ||
       r->type == NBD_CMD_WRITE_ZEROES))
    v.error = NBD_EPERM;
  if (v.error == 0 && (r->flags & ~allowed_flags (r->type, s)))
    v.error = NBD_EINVAL;
  if (v.error)
    return v;

  switch (r->type) {
  case NBD_CMD_DISC:
    break;
  case NBD_CMD_FLUSH:
    if (r->offset || r->count)
      v.error = NBD_EINVAL;     /* reserved, MUST be zero */
    break;
  case NBD_CMD_READ:
    if (r->count == 0)
      v.error = NBD_EINVAL;
    else if (r->count > NBD_MAX_REQUEST)
      /* DF asks for one chunk: EOVERFLOW is the spec's answer to "too
       * big to send unfragmented".
       */
      v.error = (r->flags & NBD_CMD_FLAG_DF) ? NBD_EOVERFLOW : NBD_EINVAL;
    else if (!in_range (r, s->size))
      v.error = NBD_EINVAL;
    break;
  case NBD_CMD_WRITE:
    if (r->count == 0 || r->count > NBD_MAX_REQUEST)
      v.error = NBD_EINVAL;
    else if (!in_range (r, s->size))
      v.error = NBD_ENOSPC;
    else
      v.discard = 0;            /* the payload is the request's data */
    break;
  case NBD_CMD_WRITE_ZEROES:
    if (r->count == 0)
      v.error = NBD_EINVAL;
    else if (!in_range (r, s->size))
      v.error = NBD_ENOSPC;
    break;
  case NBD_CMD_TRIM:
    if (r->count == 0 || !in_range (r, s->size))
      v.error = NBD_EINVAL;
    break;
  case NBD_CMD_BLOCK_STATUS:
    if (r->count == 0 || !in_range (r, s->size))
      v.error = NBD_EINVAL;
    break;
  }
  return v;
}

uint32_t
nbd_error_of_errno (int err)
{
  switch (err < 0 ? -err : err) {
  case 0: return 0;
  case EPERM: case EROFS: return NBD_EPERM;
  case ENOMEM: return NBD_ENOMEM;
  case EINVAL: return NBD_EINVAL;
  case ENOSPC: case EDQUOT: case EFBIG: return NBD_ENOSPC;
  case EOVERFLOW: return NBD_EOVERFLOW;
  case ENOTSUP:
#if EOPNOTSUPP != ENOTSUP
  case EOPNOTSUPP:
#endif
    return NBD_ENOTSUP;
  case ESHUTDOWN: return NBD_ESHUTDOWN;
  default: return NBD_EIO;
  }
}
