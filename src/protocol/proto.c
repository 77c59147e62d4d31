/* The NBD wire format: see proto.h.  Pure functions only. */
#include <config.h>

#include <errno.h>
#include <string.h>

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

bool
nbd_parse_request (const uint8_t buf[NBD_REQUEST_LEN], struct nbd_request *r)
{
  if (nbd_get32 (buf) != NBD_REQUEST_MAGIC)
    return false;
  r->flags = nbd_get16 (buf + 4);
  r->type = nbd_get16 (buf + 6);
  r->cookie = nbd_get64 (buf + 8);
  r->offset = nbd_get64 (buf + 16);
  r->count = nbd_get32 (buf + 24);
  return true;
}

void
nbd_request_bytes (uint8_t buf[NBD_REQUEST_LEN], const struct nbd_request *r)
{
  nbd_put32 (buf, NBD_REQUEST_MAGIC);
  nbd_put16 (buf + 4, r->flags);
  nbd_put16 (buf + 6, r->type);
  nbd_put64 (buf + 8, r->cookie);
  nbd_put64 (buf + 16, r->offset);
  nbd_put32 (buf + 24, r->count);
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

size_t
nbd_simple_reply (uint8_t *buf, uint64_t cookie, uint32_t error)
{
  nbd_put32 (buf, NBD_SIMPLE_REPLY_MAGIC);
  nbd_put32 (buf + 4, error);
  nbd_put64 (buf + 8, cookie);
  return NBD_SIMPLE_REPLY_LEN;
}

size_t
nbd_chunk_header (uint8_t *buf, uint16_t flags, uint16_t type,
                  uint64_t cookie, uint32_t payload_len)
{
  nbd_put32 (buf, NBD_STRUCTURED_REPLY_MAGIC);
  nbd_put16 (buf + 4, flags);
  nbd_put16 (buf + 6, type);
  nbd_put64 (buf + 8, cookie);
  nbd_put32 (buf + 16, payload_len);
  return NBD_CHUNK_HEADER_LEN;
}

size_t
nbd_offset_data_header (uint8_t *buf, uint64_t cookie, uint64_t offset,
                        uint32_t data_len, bool last)
{
  nbd_chunk_header (buf, last ? NBD_REPLY_FLAG_DONE : 0,
                    NBD_REPLY_TYPE_OFFSET_DATA, cookie, data_len + 8);
  nbd_put64 (buf + NBD_CHUNK_HEADER_LEN, offset);
  return NBD_OFFSET_DATA_HEADER_LEN;
}

size_t
nbd_none_chunk (uint8_t *buf, uint64_t cookie)
{
  return nbd_chunk_header (buf, NBD_REPLY_FLAG_DONE, NBD_REPLY_TYPE_NONE,
                           cookie, 0);
}

size_t
nbd_error_chunk (uint8_t *buf, uint64_t cookie, uint32_t error)
{
  nbd_chunk_header (buf, NBD_REPLY_FLAG_DONE, NBD_REPLY_TYPE_ERROR, cookie, 6);
  nbd_put32 (buf + NBD_CHUNK_HEADER_LEN, error);
  nbd_put16 (buf + NBD_CHUNK_HEADER_LEN + 4, 0);        /* no message */
  return NBD_ERROR_CHUNK_LEN;
}

void
nbd_extents_init (struct nbd_extents *x, uint8_t *buf, size_t max,
                  uint32_t count)
{
  *x = (struct nbd_extents) { .buf = buf, .max = max, .limit = count };
}

bool
nbd_extents_add (struct nbd_extents *x, uint64_t length, uint32_t flags)
{
  uint8_t *last;

  if (length == 0)
    return true;
  if (length > x->limit - x->total)
    length = x->limit - x->total;       /* never describe past the request */
  if (length == 0)
    return false;
  last = x->buf + NBD_BLOCK_STATUS_LEN (x->n) - 8;
  /* Merge a run of the same status, as long as its length fits 32 bits. */
  if (x->n && x->last_flags == flags &&
      nbd_get32 (last) + length <= UINT32_MAX) {
    nbd_put32 (last, nbd_get32 (last) + (uint32_t) length);
    x->total += length;
    return x->total < x->limit;
  }
  if (x->n == x->max)
    return false;
  last = x->buf + NBD_BLOCK_STATUS_LEN (x->n);
  /* The limit is a 32-bit request count, so length fits. */
  nbd_put32 (last, (uint32_t) length);
  nbd_put32 (last + 4, flags);
  x->n++;
  x->last_flags = flags;
  x->total += length;
  return x->total < x->limit;
}

size_t
nbd_extents_finish (struct nbd_extents *x, uint64_t cookie)
{
  size_t len = NBD_BLOCK_STATUS_LEN (x->n);

  nbd_chunk_header (x->buf, NBD_REPLY_FLAG_DONE, NBD_REPLY_TYPE_BLOCK_STATUS,
                    cookie, (uint32_t) (len - NBD_CHUNK_HEADER_LEN));
  nbd_put32 (x->buf + NBD_CHUNK_HEADER_LEN, NBD_META_ID_BASE_ALLOCATION);
  return len;
}

bool
nbd_parse_option_header (const uint8_t buf[NBD_OPTION_HEADER_LEN],
                         uint32_t *option, uint32_t *length)
{
  if (nbd_get64 (buf) != NBD_IHAVEOPT)
    return false;
  *option = nbd_get32 (buf + 8);
  *length = nbd_get32 (buf + 12);
  return true;
}

size_t
nbd_option_reply (uint8_t *buf, uint32_t option, uint32_t type,
                  uint32_t length)
{
  nbd_put64 (buf, NBD_REP_MAGIC);
  nbd_put32 (buf + 8, option);
  nbd_put32 (buf + 12, type);
  nbd_put32 (buf + 16, length);
  return NBD_OPTION_REPLY_LEN;
}

/* The client's side of the option haggling: what pdio(1) sends and reads
 * when it negotiates the sockets it hands to the kernel.
 */
size_t
nbd_option_header (uint8_t *buf, uint32_t option, uint32_t length)
{
  nbd_put64 (buf, NBD_IHAVEOPT);
  nbd_put32 (buf + 8, option);
  nbd_put32 (buf + 12, length);
  return NBD_OPTION_HEADER_LEN;
}

bool
nbd_parse_option_reply (const uint8_t buf[NBD_OPTION_REPLY_LEN],
                        uint32_t *option, uint32_t *type, uint32_t *length)
{
  *option = nbd_get32 (buf + 8);
  *type = nbd_get32 (buf + 12);
  *length = nbd_get32 (buf + 16);
  return nbd_get64 (buf) == NBD_REP_MAGIC;
}
