/* SPDX-License-Identifier: BSD-3-Clause */
/* Fixed newstyle negotiation (see handshake.h).  Every option gets the
 * spec's reply; only a broken stream (wrong magic, unknown client flags,
 * an EXPORT_NAME that cannot be answered, an option too long to skip, an
 * option flood) ends in a hang-up.
 */
#include <config.h>

#include <stdlib.h>
#include <string.h>

#include "handshake.h"

/* The longest answer to one option: GO's EXPORT, NAME (the client's name,
 * at most the whole option), DESCRIPTION and BLOCK_SIZE infos and the ACK.
 */
_Static_assert (NBD_HS_OUT_MAX >= 5 * NBD_OPTION_REPLY_LEN +
                NBD_INFO_EXPORT_LEN + NBD_INFO_STRING_LEN (NBD_HS_IN_MAX) +
                NBD_INFO_STRING_LEN (NBD_HS_DESCRIPTION_MAX) +
                NBD_INFO_BLOCK_SIZE_LEN,
                "NBD_HS_OUT_MAX cannot hold the replies to one option");

/* --- output ----------------------------------------------------------------- */
/* Queues one option reply; returns where its len payload bytes go.  The
 * buffer holds the longest answer to one option (asserted above), so
 * running out is a bug, never the client's doing.
 */
static uint8_t *
reply (struct nbd_handshake *h, uint32_t type, uint32_t len)
{
  uint8_t *p;

  if (h->out_len + NBD_OPTION_REPLY_LEN + len > sizeof h->out)
    abort ();
  p = h->out + h->out_len;
  nbd_option_reply (p, h->option, type, len);
  h->out_len += NBD_OPTION_REPLY_LEN + len;
  return p + NBD_OPTION_REPLY_LEN;
}

static void
reply_error (struct nbd_handshake *h, uint32_t type, const char *msg)
{
  size_t n = strlen (msg);
  uint8_t *p;

  /* A failed option forgets the infos and contexts queued before it. */
  h->out_len = 0;
  p = reply (h, type, n);
  memcpy (p, msg, n);
}

static void
expect (struct nbd_handshake *h, int state, size_t n)
{
  h->state = state;
  h->in_need = n;
  h->in_got = 0;
}

static void
hang_up (struct nbd_handshake *h, const char *why)
{
  h->why = why;
  h->state = HS_FINISHED;
  h->close_after_send = true;
}

static void
enter_transmission (struct nbd_handshake *h)
{
  h->session = (struct nbd_session) {
    .size = h->export->size,
    .eflags = nbd_export_flags (h->export, h->structured),
    .block_max = h->export->block_max,
    .structured = h->structured,
    .meta_base_allocation = h->structured && h->meta_base_allocation,
  };
  h->state = HS_FINISHED;
  h->done_after_send = true;
}

/* --- the options ---------------------------------------------------------------- */
static void
opt_export_name (struct nbd_handshake *h)
{
  /* Any name is the one export.  No option reply: raw size and flags. */
  h->out_len = nbd_export_name_reply (h->out, h->export->size,
                                      nbd_export_flags (h->export,
                                                        h->structured),
                                      h->no_zeroes);
  enter_transmission (h);
}

static void
opt_list (struct nbd_handshake *h)
{
  const char *d = h->export->description ? h->export->description : "";
  size_t dn = strnlen (d, NBD_HS_DESCRIPTION_MAX);
  uint8_t *p;

  if (h->option_len) {
    reply_error (h, NBD_REP_ERR_INVALID, "NBD_OPT_LIST takes no data");
    return;
  }
  /* One export; its name is "" (the default), then the description. */
  p = reply (h, NBD_REP_SERVER, NBD_REP_SERVER_LEN (0, dn));
  nbd_rep_server (p, "", 0, d, dn);
  reply (h, NBD_REP_ACK, 0);
}

static void
opt_info_go (struct nbd_handshake *h)
{
  const struct nbd_export *e = h->export;
  struct nbd_info_request r;
  bool want_name = false, want_desc = false;
  uint8_t *p;

  if (!nbd_parse_info_request (h->in, h->option_len, &r)) {
    reply_error (h, NBD_REP_ERR_INVALID, "malformed NBD_OPT_INFO/GO");
    return;
  }
  for (uint16_t i = 0; i < r.n_infos; i++)
    switch (nbd_info_request_item (&r, i)) {
    case NBD_INFO_NAME: want_name = true; break;
    case NBD_INFO_DESCRIPTION: want_desc = e->description != NULL; break;
    default: break;             /* EXPORT and BLOCK_SIZE always go out */
    }

  p = reply (h, NBD_REP_INFO, NBD_INFO_EXPORT_LEN);
  nbd_info_export (p, e->size, nbd_export_flags (e, h->structured));
  if (want_name) {
    /* The client's own name is as canonical as any: all names are one. */
    p = reply (h, NBD_REP_INFO, NBD_INFO_STRING_LEN (r.name_len));
    nbd_info_string (p, NBD_INFO_NAME, r.name, r.name_len);
  }
  if (want_desc) {
    size_t dn = strnlen (e->description, NBD_HS_DESCRIPTION_MAX);

    p = reply (h, NBD_REP_INFO, NBD_INFO_STRING_LEN (dn));
    nbd_info_string (p, NBD_INFO_DESCRIPTION, e->description, dn);
  }
  /* Sent whether asked or not (the spec allows it): the minimum is what
   * lets a client avoid read-modify-write.
   */
  p = reply (h, NBD_REP_INFO, NBD_INFO_BLOCK_SIZE_LEN);
  nbd_info_block_size (p, e->block_min, e->block_preferred, e->block_max);
  reply (h, NBD_REP_ACK, 0);
  if (h->option == NBD_OPT_GO)
    enter_transmission (h);
}

/* Does a query pick base:allocation?  For LIST, the namespace alone
 * ("base:") is a wildcard over it.
 */
static bool
query_matches (const uint8_t *q, uint32_t n, bool list)
{
  static const char ctx[] = NBD_CONTEXT_BASE_ALLOCATION;

  if (n == sizeof ctx - 1 && memcmp (q, ctx, n) == 0)
    return true;
  return list && n == 5 && memcmp (q, "base:", 5) == 0;
}

static void
opt_meta_context (struct nbd_handshake *h)
{
  static const char ctx[] = NBD_CONTEXT_BASE_ALLOCATION;
  bool list = h->option == NBD_OPT_LIST_META_CONTEXT;
  struct nbd_meta_request m;
  const uint8_t *q;
  uint32_t pos = 0, q_len;
  bool match = false;
  uint8_t *p;

  /* SET replaces the selection even when it fails. */
  if (!list)
    h->meta_base_allocation = false;
  if (!h->structured) {
    reply_error (h, NBD_REP_ERR_INVALID,
                 "negotiate NBD_OPT_STRUCTURED_REPLY first");
    return;
  }
  if (!nbd_parse_meta_request (h->in, h->option_len, &m)) {
    reply_error (h, NBD_REP_ERR_INVALID, "malformed meta context option");
    return;
  }
  while (nbd_meta_request_next (&m, &pos, &q, &q_len))
    match |= query_matches (q, q_len, list);
  /* No query: LIST lists everything, SET selects nothing. */
  if (m.n_queries == 0)
    match = list;
  if (match) {
    p = reply (h, NBD_REP_META_CONTEXT,
               NBD_META_CONTEXT_REPLY_LEN (sizeof ctx - 1));
    nbd_meta_context_reply (p, list ? 0 : NBD_META_ID_BASE_ALLOCATION, ctx,
                            sizeof ctx - 1);
  }
  if (!list)
    h->meta_base_allocation = match;
  reply (h, NBD_REP_ACK, 0);
}

static void
opt_starttls (struct nbd_handshake *h)
{
  if (h->tls_mode == PDIO_TLS_OFF)
    /* NOTLS mode: the spec's answer for a server that will not do TLS. */
    reply_error (h, NBD_REP_ERR_POLICY, "TLS is not offered here (pdio "
                 "serve --tls-certificates or --tls-psk offers it)");
  else if (h->tls_active)
    reply_error (h, NBD_REP_ERR_INVALID, "TLS is on already");
  else if (h->option_len)
    reply_error (h, NBD_REP_ERR_INVALID, "NBD_OPT_STARTTLS takes no data");
  else {
    reply (h, NBD_REP_ACK, 0);
    h->state = HS_FINISHED;
    h->starttls_after_send = true;
  }
}

/* FORCEDTLS before STARTTLS: true if the option was answered (refused). */
static bool
tls_required (struct nbd_handshake *h)
{
  if (h->tls_mode != PDIO_TLS_REQUIRE || h->tls_active ||
      h->option == NBD_OPT_STARTTLS || h->option == NBD_OPT_ABORT)
    return false;
  h->refused = "a client asked for the export without TLS, which is "
    "required (--tls=require)";
  /* EXPORT_NAME has no error reply: the spec says hang up. */
  if (h->option == NBD_OPT_EXPORT_NAME)
    hang_up (h, "NBD_OPT_EXPORT_NAME before TLS, which is required");
  else
    reply_error (h, NBD_REP_ERR_TLS_REQD, "TLS is required: send "
                 "NBD_OPT_STARTTLS first");
  return true;
}

static void
handle_option (struct nbd_handshake *h)
{
  if (tls_required (h)) {
    if (h->state != HS_FINISHED)
      expect (h, HS_OPT_HEADER, NBD_OPTION_HEADER_LEN);
    return;
  }
  switch (h->option) {
  case NBD_OPT_EXPORT_NAME:
    opt_export_name (h);
    break;
  case NBD_OPT_ABORT:
    reply (h, NBD_REP_ACK, 0);
    h->why = "the client sent NBD_OPT_ABORT";
    h->state = HS_FINISHED;
    h->close_after_send = true;
    return;
  case NBD_OPT_LIST:
    opt_list (h);
    break;
  case NBD_OPT_STARTTLS:
    opt_starttls (h);
    break;
  case NBD_OPT_INFO:
  case NBD_OPT_GO:
    opt_info_go (h);
    break;
  case NBD_OPT_STRUCTURED_REPLY:
    if (h->option_len)
      reply_error (h, NBD_REP_ERR_INVALID,
                   "NBD_OPT_STRUCTURED_REPLY takes no data");
    else {
      h->structured = true;
      reply (h, NBD_REP_ACK, 0);
    }
    break;
  case NBD_OPT_LIST_META_CONTEXT:
  case NBD_OPT_SET_META_CONTEXT:
    opt_meta_context (h);
    break;
  default:
    reply_error (h, NBD_REP_ERR_UNSUP, "");
  }
  if (h->state != HS_FINISHED)
    expect (h, HS_OPT_HEADER, NBD_OPTION_HEADER_LEN);
}

/* --- input ---------------------------------------------------------------------- */
static void
got_client_flags (struct nbd_handshake *h)
{
  uint32_t flags = nbd_parse_client_flags (h->in);

  /* The spec: drop a client that sets a flag we did not offer. */
  if (flags & ~(NBD_FLAG_C_FIXED_NEWSTYLE | NBD_FLAG_C_NO_ZEROES)) {
    hang_up (h, "unknown client flags");
    return;
  }
  h->no_zeroes = flags & NBD_FLAG_C_NO_ZEROES;
  expect (h, HS_OPT_HEADER, NBD_OPTION_HEADER_LEN);
}

static void
got_option_header (struct nbd_handshake *h)
{
  if (!nbd_parse_option_header (h->in, &h->option, &h->option_len)) {
    hang_up (h, "bad option magic");
    return;
  }
  if (++h->options > NBD_HS_MAX_OPTIONS) {
    hang_up (h, "too many options");
    return;
  }
  if (h->option_len <= sizeof h->in) {
    if (h->option_len)
      expect (h, HS_OPT_DATA, h->option_len);
    else
      handle_option (h);
    return;
  }
  /* Too long to keep.  EXPORT_NAME cannot be refused politely. */
  if (h->option == NBD_OPT_EXPORT_NAME || h->option_len > NBD_HS_DISCARD_MAX) {
    hang_up (h, "option too long");
    return;
  }
  h->discard_left = h->option_len;
  expect (h, HS_OPT_DISCARD,
          h->discard_left < sizeof h->in ? h->discard_left : sizeof h->in);
}

static void
got_discard (struct nbd_handshake *h)
{
  h->discard_left -= h->in_need;
  if (h->discard_left) {
    expect (h, HS_OPT_DISCARD,
            h->discard_left < sizeof h->in ? h->discard_left : sizeof h->in);
    return;
  }
  if (!tls_required (h))
    reply_error (h, NBD_REP_ERR_TOO_BIG, "option too long");
  expect (h, HS_OPT_HEADER, NBD_OPTION_HEADER_LEN);
}

void
nbd_hs_init (struct nbd_handshake *h, const struct nbd_export *export,
             enum pdio_tls_mode tls)
{
  memset (h, 0, offsetof (struct nbd_handshake, in));
  h->export = export;
  h->tls_mode = tls;
  h->out_len = nbd_greeting (h->out,
                             NBD_FLAG_FIXED_NEWSTYLE | NBD_FLAG_NO_ZEROES);
  expect (h, HS_CLIENT_FLAGS, NBD_CLIENT_FLAGS_LEN);
}

enum nbd_hs_action
nbd_hs_next (struct nbd_handshake *h, void **buf, size_t *len)
{
  if (h->out_len) {
    *buf = h->out;
    *len = h->out_len;
    return NBD_HS_SEND;
  }
  if (h->close_after_send)
    return NBD_HS_CLOSE;
  if (h->done_after_send)
    return NBD_HS_DONE;
  if (h->starttls_after_send)
    return NBD_HS_STARTTLS;
  *buf = h->in + h->in_got;
  *len = h->in_need - h->in_got;
  return NBD_HS_RECV;
}

void
nbd_hs_tls_started (struct nbd_handshake *h)
{
  if (!h->starttls_after_send)
    return;                     /* a caller bug */
  h->starttls_after_send = false;
  h->tls_active = true;
  h->refused = NULL;
  /* The spec: what plain text negotiated may have been tampered with. */
  h->structured = h->meta_base_allocation = false;
  expect (h, HS_OPT_HEADER, NBD_OPTION_HEADER_LEN);
}

void
nbd_hs_sent (struct nbd_handshake *h)
{
  h->out_len = 0;
}

void
nbd_hs_received (struct nbd_handshake *h, size_t n)
{
  if (h->state == HS_FINISHED || n > h->in_need - h->in_got)
    return;                     /* a caller bug; ignore rather than overrun */
  h->in_got += n;
  if (h->in_got < h->in_need)
    return;
  switch (h->state) {
  case HS_CLIENT_FLAGS: got_client_flags (h); break;
  case HS_OPT_HEADER: got_option_header (h); break;
  case HS_OPT_DATA: handle_option (h); break;
  case HS_OPT_DISCARD: got_discard (h); break;
  case HS_FINISHED: break;
  }
}
