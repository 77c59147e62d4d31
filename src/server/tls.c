/* SPDX-License-Identifier: BSD-3-Clause */
/* TLS with GnuTLS (see tls.h): the credentials, then one session per
 * connection whose records travel through two buffers of its own.
 *
 *   in    ciphertext received: an io_uring recv fills it when GnuTLS
 *         asked for bytes that were not there (pull said EAGAIN), and
 *         GnuTLS's pull takes from it.  Pull only says EAGAIN once in is
 *         empty, so a receive always goes into an empty buffer.
 *   out   ciphertext to send: GnuTLS's push appends, an io_uring send
 *         drains it.  Appending never moves bytes a send in flight points
 *         to: out is only grown or reset while no send is in flight.
 *
 * Every step that waits for the socket ends by queueing the receive or
 * send it waits for; its completion retries the step.  A completion's
 * last act is at most one callback into the connection (a receive or
 * send done, the handshake over, or "settled": nothing of TLS in flight
 * any more), since that callback may free the connection and this
 * session with it.  A receive that can be answered from what is already
 * buffered is answered from a NOP's completion: the connection's
 * callbacks never run from inside its own calls.
 */
#include <config.h>

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <liburing.h>
#include <gnutls/gnutls.h>
#include <gnutls/x509.h>

#include "container_of.h"
#include "engine.h"
#include "proto.h"
#include "tls.h"
#include "vg.h"

/* Ciphertext buffer for receives: larger than the largest TLS record
 * (16 KiB of data plus at most 2 KiB of overhead), so one receive can
 * always bring a whole record and more.
 */
#define TLS_IN_BYTES (64 * 1024)
/* Plaintext encrypted per send: a send round is at most this much data,
 * and out holds its records with room to spare for their overhead and
 * for what the record layer sends on its own (alerts, key updates).
 */
#define TLS_SEND_PLAIN (256 * 1024)
#define TLS_OUT_BYTES (TLS_SEND_PLAIN + 32 * 1024)

/* PSK as nbdkit and qemu offer it. */
#define PRIORITY_X509 "NORMAL"
#define PRIORITY_PSK "NORMAL:+ECDHE-PSK:+DHE-PSK:+PSK"

struct pdio_tls {
  enum pdio_tls_mode mode;
  gnutls_certificate_credentials_t x509;
  gnutls_psk_server_credentials_t psk;
  gnutls_priority_t priority;
  bool verify_peer;
  bool no_ktls;
  char **authz;
  size_t n_authz;
};

struct tls_conn {
  const struct pdio_tls *tls;
  struct pdio_thread *t;
  int fd;
  gnutls_session_t s;
  void (*handshake_done) (void *opaque, const char *why);
  void (*settled) (void *opaque);
  void *opaque;
  bool handshaking;
  char *peer;
  char why[256];

  uint8_t *in;
  size_t in_start, in_end;
  int in_end_res;               /* the socket said: 0 end, -errno; 1 not yet */
  bool sock_rx_pending, rx_nop_pending;
  struct pdio_completion sock_rx_c, rx_nop_c;
  struct pdio_completion *rx_done; /* the connection's receive, if any */
  struct iovec rx_iov[2];
  int rx_iovcnt;
  bool rx_waitall;
  size_t rx_got;
  int rx_result;                /* what the NOP delivers */

  uint8_t *out;
  size_t out_cap, out_len, out_sent;
  bool sock_tx_pending, tx_nop_pending;
  struct pdio_completion sock_tx_c, tx_nop_c;
  struct pdio_completion *tx_done; /* the connection's send, if any */
  size_t tx_plain;              /* its plaintext bytes encrypted into out */
  int tx_err;
};

/* GnuTLS is loaded when TLS is asked for, not linked (proto.h says
 * why); its functions are called through this table.
 */
#define GNUTLS_FUNCTIONS(X) \
  X (gnutls_certificate_allocate_credentials) \
  X (gnutls_certificate_free_credentials) \
  X (gnutls_certificate_get_peers) \
  X (gnutls_certificate_server_set_request) \
  X (gnutls_certificate_set_x509_crl_file) \
  X (gnutls_certificate_set_x509_key_file) \
  X (gnutls_certificate_set_x509_trust_file) \
  X (gnutls_certificate_verification_status_print) \
  X (gnutls_certificate_verify_peers2) \
  X (gnutls_credentials_set) \
  X (gnutls_deinit) \
  X (gnutls_error_is_fatal) \
  X (gnutls_global_deinit) \
  X (gnutls_global_init) \
  X (gnutls_handshake) \
  X (gnutls_handshake_set_timeout) \
  X (gnutls_init) \
  X (gnutls_priority_deinit) \
  X (gnutls_priority_init) \
  X (gnutls_priority_set) \
  X (gnutls_psk_allocate_server_credentials) \
  X (gnutls_psk_free_server_credentials) \
  X (gnutls_psk_server_get_username) \
  X (gnutls_psk_set_server_credentials_file) \
  X (gnutls_psk_set_server_known_dh_params) \
  X (gnutls_record_check_pending) \
  X (gnutls_record_get_direction) \
  X (gnutls_record_recv) \
  X (gnutls_record_send) \
  X (gnutls_strerror) \
  X (gnutls_transport_set_errno) \
  X (gnutls_transport_set_ptr) \
  X (gnutls_transport_set_pull_function) \
  X (gnutls_transport_set_push_function) \
  X (gnutls_x509_crt_deinit) \
  X (gnutls_x509_crt_get_dn3) \
  X (gnutls_x509_crt_import) \
  X (gnutls_x509_crt_init)
PDIO_GNUTLS_TABLE (GNUTLS_FUNCTIONS);
static bool gt_loaded;

/* 0, or -errno with the reason logged. */
static int
load_gnutls (const struct pdio_log *log)
{
  char why[256];
  int r;

  if (gt_loaded)
    return 0;
  r = pdio_gnutls_load (gt_names, gt.addr, sizeof gt_names / sizeof *gt_names,
                        why, sizeof why);
  if (r < 0) {
    pdio_log_msg (log->error, "%s", why);
    return r;
  }
  gt_loaded = true;
  return 0;
}

/* --- credentials -------------------------------------------------------------- */
static bool
readable (const struct pdio_log *log, const char *path, const char *what)
{
  if (access (path, R_OK) == 0)
    return true;
  pdio_log_msg (log->error, "%s: %s (%s)", path, strerror (errno), what);
  return false;
}

/* psktool writes "identity:hex-key" lines; GnuTLS only reads the file
 * during a handshake, so a bad one is caught here instead, by line.
 */
static int
check_psk_file (const char *path, const struct pdio_log *log)
{
  FILE *fp = fopen (path, "re");
  char line[1024];
  unsigned n = 0, keys = 0;

  if (fp == NULL) {
    pdio_log_msg (log->error, "%s: %s (--tls-psk)", path, strerror (errno));
    return -errno;
  }
  while (fgets (line, sizeof line, fp)) {
    char *colon = strchr (line, ':'), *p;

    n++;
    line[strcspn (line, "\r\n")] = '\0';
    if (line[0] == '\0')
      continue;
    if (colon == NULL || colon == line || colon[1] == '\0')
      goto bad;
    for (p = colon + 1; *p; p++)
      if (!strchr ("0123456789abcdefABCDEF", *p))
        goto bad;
    if ((p - colon - 1) % 2)
      goto bad;
    keys++;
  }
  fclose (fp);
  if (keys == 0) {
    pdio_log_msg (log->error, "%s: no keys (psktool -u NAME -p %s makes "
                  "one)", path, path);
    return -EINVAL;
  }
  return 0;

 bad:
  fclose (fp);
  pdio_log_msg (log->error, "%s: line %u is not IDENTITY:HEX-KEY (psktool's "
                "format)", path, n);
  return -EINVAL;
}

static int
load_x509 (struct pdio_tls *tls, const char *dir, const struct pdio_log *log)
{
  char ca[4096], cert[4096], key[4096], crl[4096];
  int r;

  snprintf (ca, sizeof ca, "%s/ca-cert.pem", dir);
  snprintf (cert, sizeof cert, "%s/server-cert.pem", dir);
  snprintf (key, sizeof key, "%s/server-key.pem", dir);
  snprintf (crl, sizeof crl, "%s/ca-crl.pem", dir);
  if (!readable (log, ca, "the CA that signs clients' certificates") ||
      !readable (log, cert, "the server's certificate") ||
      !readable (log, key, "the server's private key"))
    return -ENOENT;
  if (gt.gnutls_certificate_allocate_credentials (&tls->x509) < 0)
    return -ENOMEM;
  r = gt.gnutls_certificate_set_x509_trust_file (tls->x509, ca,
                                              GNUTLS_X509_FMT_PEM);
  if (r <= 0) {
    pdio_log_msg (log->error, "%s: %s", ca, r == 0 ? "no certificate in it"
                  : gt.gnutls_strerror (r));
    return -EINVAL;
  }
  r = gt.gnutls_certificate_set_x509_key_file (tls->x509, cert, key,
                                            GNUTLS_X509_FMT_PEM);
  if (r < 0) {
    pdio_log_msg (log->error, "%s, %s: %s", cert, key, gt.gnutls_strerror (r));
    return -EINVAL;
  }
  /* Optional, as for nbdkit and qemu. */
  if (access (crl, F_OK) == 0) {
    r = gt.gnutls_certificate_set_x509_crl_file (tls->x509, crl,
                                              GNUTLS_X509_FMT_PEM);
    if (r < 0) {
      pdio_log_msg (log->error, "%s: %s", crl, gt.gnutls_strerror (r));
      return -EINVAL;
    }
  }
  return 0;
}

int
pdio_tls_new (const struct pdio_tls_config *cfg, const struct pdio_log *log,
              struct pdio_tls **out)
{
  struct pdio_tls *tls = calloc (1, sizeof *tls);
  const char *prio, *err_pos = NULL;
  int r;

  *out = NULL;
  if (tls == NULL)
    return -ENOMEM;
  tls->mode = cfg->mode;
  tls->verify_peer = cfg->verify_peer;
  tls->no_ktls = cfg->no_ktls;
  r = load_gnutls (log);
  if (r < 0) {
    free (tls);
    return r;
  }
  r = gt.gnutls_global_init ();
  if (r < 0) {
    pdio_log_msg (log->error, "GnuTLS: %s", gt.gnutls_strerror (r));
    free (tls);
    return -EIO;
  }
  if (cfg->certificates)
    r = load_x509 (tls, cfg->certificates, log);
  else if ((r = check_psk_file (cfg->psk_file, log)) == 0) {
    r = gt.gnutls_psk_allocate_server_credentials (&tls->psk);
    if (r == 0)
      r = gt.gnutls_psk_set_server_credentials_file (tls->psk, cfg->psk_file);
    if (r == 0)
      r = gt.gnutls_psk_set_server_known_dh_params (tls->psk,
                                                 GNUTLS_SEC_PARAM_MEDIUM);
    if (r < 0) {
      pdio_log_msg (log->error, "%s: %s", cfg->psk_file, gt.gnutls_strerror (r));
      r = -EINVAL;
    }
  }
  prio = cfg->certificates ? PRIORITY_X509 : PRIORITY_PSK;
  if (r == 0 && (r = gt.gnutls_priority_init (&tls->priority, prio, &err_pos)) < 0) {
    pdio_log_msg (log->error, "GnuTLS priority %s: %s", prio,
                  gt.gnutls_strerror (r));
    r = -EINVAL;
  }
  if (r == 0 && cfg->n_authz) {
    tls->authz = calloc (cfg->n_authz, sizeof *tls->authz);
    if (tls->authz == NULL)
      r = -ENOMEM;
    for (size_t i = 0; r == 0 && i < cfg->n_authz; i++) {
      if ((tls->authz[i] = strdup (cfg->authz[i])) == NULL)
        r = -ENOMEM;
      tls->n_authz = i + 1;
    }
  }
  if (r < 0) {
    pdio_tls_free (tls);
    return r;
  }
  *out = tls;
  return 0;
}

void
pdio_tls_free (struct pdio_tls *tls)
{
  if (tls == NULL)
    return;
  if (tls->x509)
    gt.gnutls_certificate_free_credentials (tls->x509);
  if (tls->psk)
    gt.gnutls_psk_free_server_credentials (tls->psk);
  if (tls->priority)
    gt.gnutls_priority_deinit (tls->priority);
  for (size_t i = 0; i < tls->n_authz; i++)
    free (tls->authz[i]);
  free (tls->authz);
  free (tls);
  gt.gnutls_global_deinit ();
}

enum pdio_tls_mode
pdio_tls_mode (const struct pdio_tls *tls)
{
  return tls ? tls->mode : PDIO_TLS_OFF;
}

/* --- the transport: GnuTLS's side of the two buffers ------------------------ */
static ssize_t
pull (gnutls_transport_ptr_t p, void *buf, size_t len)
{
  struct tls_conn *tc = p;
  size_t n = tc->in_end - tc->in_start;

  if (n == 0) {
    if (tc->in_end_res <= 0) {
      if (tc->in_end_res == 0)
        return 0;
      gt.gnutls_transport_set_errno (tc->s, -tc->in_end_res);
      return -1;
    }
    gt.gnutls_transport_set_errno (tc->s, EAGAIN);
    return -1;
  }
  if (n > len)
    n = len;
  memcpy (buf, tc->in + tc->in_start, n);
  tc->in_start += n;
  if (tc->in_start == tc->in_end)
    tc->in_start = tc->in_end = 0;
  return n;
}

static ssize_t
push (gnutls_transport_ptr_t p, const void *buf, size_t len)
{
  struct tls_conn *tc = p;

  if (tc->out_cap - tc->out_len < len) {
    size_t cap = tc->out_len + len;
    uint8_t *o;

    /* A send in flight points into out: it cannot move now. */
    if (tc->sock_tx_pending ||
        (o = realloc (tc->out, cap)) == NULL) {
      gt.gnutls_transport_set_errno (tc->s, EAGAIN);
      return -1;
    }
    tc->out = o;
    tc->out_cap = cap;
  }
  memcpy (tc->out + tc->out_len, buf, len);
  tc->out_len += len;
  return len;
}

/* --- the ring ------------------------------------------------------------------ */
static bool
queue_sock_recv (struct tls_conn *tc)
{
  struct io_uring_sqe *sqe;

  if (tc->sock_rx_pending)
    return true;
  if ((sqe = pdio_thread_sqe (tc->t)) == NULL)
    return false;
  /* in is empty here (see the top of the file). */
  tc->in_start = tc->in_end = 0;
  io_uring_prep_recv (sqe, tc->fd, tc->in, TLS_IN_BYTES, 0);
  io_uring_sqe_set_data (sqe, &tc->sock_rx_c);
  tc->sock_rx_pending = true;
  return true;
}

static bool
queue_sock_send (struct tls_conn *tc)
{
  struct io_uring_sqe *sqe;

  if (tc->sock_tx_pending || tc->out_sent == tc->out_len)
    return true;
  if ((sqe = pdio_thread_sqe (tc->t)) == NULL)
    return false;
  {
    const struct iovec iov = { .iov_base = tc->out + tc->out_sent,
                               .iov_len = tc->out_len - tc->out_sent };

    vg_check_iov (&iov, 1);
  }
  io_uring_prep_send (sqe, tc->fd, tc->out + tc->out_sent,
                      tc->out_len - tc->out_sent, MSG_NOSIGNAL);
  io_uring_sqe_set_data (sqe, &tc->sock_tx_c);
  tc->sock_tx_pending = true;
  return true;
}

static bool
queue_nop (struct tls_conn *tc, struct pdio_completion *c, bool *pending)
{
  struct io_uring_sqe *sqe = pdio_thread_sqe (tc->t);

  if (sqe == NULL)
    return false;
  io_uring_prep_nop (sqe);
  io_uring_sqe_set_data (sqe, c);
  *pending = true;
  return true;
}

bool
tls_conn_busy (const struct tls_conn *tc)
{
  return tc->sock_rx_pending || tc->sock_tx_pending || tc->rx_nop_pending ||
         tc->tx_nop_pending;
}

/* The completion's last act: whatever the connection is owed. */
static void
tell_settled (struct tls_conn *tc)
{
  /* Nothing else will call back: tell it once nothing is in flight. */
  if (!tls_conn_busy (tc))
    tc->settled (tc->opaque);
}

/* --- the handshake --------------------------------------------------------------- */
/* Who the peer is, and whether it is let in: NULL, or why not. */
static const char *
authorize (struct tls_conn *tc)
{
  const struct pdio_tls *tls = tc->tls;

  if (tls->psk) {
    const char *id = gt.gnutls_psk_server_get_username (tc->s);

    if (id == NULL)
      return "no PSK identity";
    tc->peer = strdup (id);
  }
  else if (tls->verify_peer) {
    const gnutls_datum_t *certs;
    unsigned status = 0, n = 0;
    gnutls_x509_crt_t crt;
    gnutls_datum_t dn = { NULL, 0 };
    int r;

    r = gt.gnutls_certificate_verify_peers2 (tc->s, &status);
    if (r < 0) {
      snprintf (tc->why, sizeof tc->why, "client certificate: %s",
                gt.gnutls_strerror (r));
      return tc->why;
    }
    if (status) {
      gnutls_datum_t msg;

      if (gt.gnutls_certificate_verification_status_print
          (status, GNUTLS_CRT_X509, &msg, 0) == 0) {
        snprintf (tc->why, sizeof tc->why, "client certificate refused: %s",
                  msg.data);
        (*gt.gnutls_free) (msg.data);
      }
      else
        snprintf (tc->why, sizeof tc->why, "client certificate refused");
      return tc->why;
    }
    certs = gt.gnutls_certificate_get_peers (tc->s, &n);
    if (certs == NULL || n == 0)
      return "no client certificate";
    if (gt.gnutls_x509_crt_init (&crt) < 0)
      return "out of memory";
    r = gt.gnutls_x509_crt_import (crt, &certs[0], GNUTLS_X509_FMT_DER);
    if (r == 0)
      r = gt.gnutls_x509_crt_get_dn3 (crt, &dn, 0);
    gt.gnutls_x509_crt_deinit (crt);
    if (r < 0)
      return "cannot read the client certificate's name";
    tc->peer = strndup ((const char *) dn.data, dn.size);
    (*gt.gnutls_free) (dn.data);
  }
  if (tls->n_authz == 0)
    return NULL;
  for (size_t i = 0; tc->peer && i < tls->n_authz; i++)
    if (strcmp (tc->peer, tls->authz[i]) == 0)
      return NULL;
  snprintf (tc->why, sizeof tc->why, "%s \"%s\" is not in --tls-authz",
            tls->psk ? "PSK identity" : "client certificate",
            tc->peer ? tc->peer : "");
  return tc->why;
}

/* Runs the handshake as far as the buffers allow.  Ends by queueing what
 * it waits for, or with handshake_done.  The caller must not touch tc
 * afterwards.
 */
static void
handshake_step (struct tls_conn *tc)
{
  const char *why = NULL;
  int r;

  do
    r = gt.gnutls_handshake (tc->s);
  while (r < 0 && r != GNUTLS_E_AGAIN && !gt.gnutls_error_is_fatal (r));
  if (!queue_sock_send (tc))
    why = "cannot queue a send";
  else if (r == GNUTLS_E_AGAIN) {
    /* Waiting for room in out: the send's completion comes back here. */
    if (gt.gnutls_record_get_direction (tc->s) == 1 && tc->sock_tx_pending)
      return;
    if (queue_sock_recv (tc))
      return;
    why = "cannot queue a receive";
  }
  else if (r < 0) {
    snprintf (tc->why, sizeof tc->why, "TLS handshake failed: %s",
              gt.gnutls_strerror (r));
    why = tc->why;
  }
  else
    why = authorize (tc);
  tc->handshaking = false;
  tc->handshake_done (tc->opaque, why);
}

/* --- receiving ------------------------------------------------------------------ */
/* rx_fill's answer when the receive waits for the socket: no byte count
 * or -errno can be it.
 */
#define RX_WAITING INT_MIN

/* Decrypts into the connection's receive as far as it goes: its result
 * (bytes, 0, -errno), or RX_WAITING with a socket receive queued.
 */
static int
rx_fill (struct tls_conn *tc)
{
  size_t total = 0;

  for (int i = 0; i < tc->rx_iovcnt; i++)
    total += tc->rx_iov[i].iov_len;
  while (tc->rx_got < total) {
    size_t at = tc->rx_got;
    int i = 0;
    ssize_t r;

    while (at >= tc->rx_iov[i].iov_len)
      at -= tc->rx_iov[i++].iov_len;
    r = gt.gnutls_record_recv (tc->s, (uint8_t *) tc->rx_iov[i].iov_base + at,
                            tc->rx_iov[i].iov_len - at);
    if (r > 0) {
      tc->rx_got += r;
      continue;
    }
    if (r == 0)
      return tc->rx_got;        /* the peer closed TLS */
    if (r == GNUTLS_E_AGAIN) {
      if (tc->rx_got && !tc->rx_waitall)
        return tc->rx_got;
      if (tc->in_end_res <= 0)  /* the socket is done: partial or end */
        return tc->rx_got ? (int) tc->rx_got : tc->in_end_res;
      return queue_sock_recv (tc) ? RX_WAITING : -ENOMEM;
    }
    if (gt.gnutls_error_is_fatal (r) || r == GNUTLS_E_REHANDSHAKE)
      return tc->rx_got ? (int) tc->rx_got
             : r == GNUTLS_E_PREMATURE_TERMINATION ? 0 : -EPROTO;
    /* A warning alert: go on. */
  }
  return tc->rx_got;
}

/* The connection's receive, as far as it goes; the caller must not touch
 * tc afterwards.
 */
static void
rx_step (struct tls_conn *tc)
{
  struct pdio_completion *done = tc->rx_done;
  int r;

  if (done == NULL) {
    tell_settled (tc);
    return;
  }
  r = rx_fill (tc);
  if (r == RX_WAITING)
    return;
  /* What a record-layer read made GnuTLS want to say (a key update). */
  queue_sock_send (tc);
  tc->rx_done = NULL;
  done->fn (done, r, 0);
}

static void
on_sock_recv (struct pdio_completion *pc, int res, uint32_t flags)
{
  struct tls_conn *tc = container_of (pc, struct tls_conn, sock_rx_c);

  (void) flags;
  tc->sock_rx_pending = false;
  if (res > 0) {
    /* For valgrind, which cannot see into the ring (vg.h). */
    const struct iovec iov = { .iov_base = tc->in, .iov_len = TLS_IN_BYTES };

    vg_kernel_wrote_iov (&iov, 1, res);
    tc->in_end = res;
  }
  else
    tc->in_end_res = res == -EINTR || res == -EAGAIN ? 1 : res;
  if (res == -EINTR || res == -EAGAIN) {
    if (queue_sock_recv (tc))
      return;
    tc->in_end_res = -ENOMEM;
  }
  if (tc->handshaking)
    handshake_step (tc);
  else
    rx_step (tc);
}

static void
on_rx_nop (struct pdio_completion *pc, int res, uint32_t flags)
{
  struct tls_conn *tc = container_of (pc, struct tls_conn, rx_nop_c);
  struct pdio_completion *done = tc->rx_done;

  (void) res;
  (void) flags;
  tc->rx_nop_pending = false;
  tc->rx_done = NULL;
  done->fn (done, tc->rx_result, 0);
}

bool
tls_conn_recv (struct tls_conn *tc, const struct iovec *iov, int iovcnt,
               bool waitall, struct pdio_completion *done)
{
  tc->rx_done = done;
  tc->rx_iovcnt = iovcnt;
  for (int i = 0; i < iovcnt; i++)
    tc->rx_iov[i] = iov[i];
  tc->rx_waitall = waitall;
  tc->rx_got = 0;
  /* GnuTLS may hold whole records it read ahead, which neither in nor
   * gnutls_record_check_pending shows: ask it first.  What it answers at
   * once is delivered from a NOP's completion.
   */
  tc->rx_result = rx_fill (tc);
  if (tc->rx_result == RX_WAITING)
    return true;
  queue_sock_send (tc);
  return queue_nop (tc, &tc->rx_nop_c, &tc->rx_nop_pending);
}

void *
tls_conn_recv_token (struct tls_conn *tc)
{
  return &tc->sock_rx_c;
}

/* --- sending ---------------------------------------------------------------------- */
static void
tx_deliver (struct tls_conn *tc, int res)
{
  struct pdio_completion *done = tc->tx_done;

  tc->tx_done = NULL;
  done->fn (done, res, 0);
}

static void
on_sock_send (struct pdio_completion *pc, int res, uint32_t flags)
{
  struct tls_conn *tc = container_of (pc, struct tls_conn, sock_tx_c);

  (void) flags;
  tc->sock_tx_pending = false;
  if (res == -EINTR || res == -EAGAIN) {
    if (!queue_sock_send (tc))
      tc->tx_err = -ENOMEM;
  }
  else if (res <= 0)
    tc->tx_err = res == 0 ? -EPIPE : res;
  else {
    tc->out_sent += res;
    if (tc->out_sent == tc->out_len)
      tc->out_sent = tc->out_len = 0;
    else if (!queue_sock_send (tc))
      tc->tx_err = -ENOMEM;
  }
  if (tc->sock_tx_pending && !tc->tx_err)
    return;                     /* more of out to go */
  if (tc->handshaking) {
    if (tc->tx_err) {
      tc->handshaking = false;
      tc->handshake_done (tc->opaque, "send failed in the TLS handshake");
      return;
    }
    handshake_step (tc);
    return;
  }
  if (tc->tx_done)
    tx_deliver (tc, tc->tx_err ? tc->tx_err : (int) tc->tx_plain);
  else
    tell_settled (tc);
}

static void
on_tx_nop (struct pdio_completion *pc, int res, uint32_t flags)
{
  struct tls_conn *tc = container_of (pc, struct tls_conn, tx_nop_c);

  (void) res;
  (void) flags;
  tc->tx_nop_pending = false;
  tx_deliver (tc, tc->tx_err ? tc->tx_err : -EPROTO);
}

bool
tls_conn_send (struct tls_conn *tc, const struct iovec *iov, int iovcnt,
               struct pdio_completion *done)
{
  size_t plain = 0;

  tc->tx_done = done;
  for (int i = 0; i < iovcnt && plain < TLS_SEND_PLAIN && !tc->tx_err; i++) {
    size_t off = 0;

    while (off < iov[i].iov_len && plain < TLS_SEND_PLAIN) {
      size_t n = iov[i].iov_len - off;
      ssize_t r;

      if (n > TLS_SEND_PLAIN - plain)
        n = TLS_SEND_PLAIN - plain;
      r = gt.gnutls_record_send (tc->s, (const uint8_t *) iov[i].iov_base + off,
                              n);
      if (r < 0) {
        tc->tx_err = -EPROTO;
        break;
      }
      off += r;
      plain += r;
    }
  }
  tc->tx_plain = plain;
  if (tc->tx_err || plain == 0) {
    if (!tc->tx_err)
      tc->tx_err = -EPROTO;
    return queue_nop (tc, &tc->tx_nop_c, &tc->tx_nop_pending);
  }
  return queue_sock_send (tc);
}

/* --- a session ------------------------------------------------------------------- */
struct tls_conn *
tls_conn_new (const struct pdio_tls *tls, struct pdio_thread *t, int fd,
              void (*handshake_done) (void *opaque, const char *why),
              void (*settled) (void *opaque), void *opaque, const char **why)
{
  struct tls_conn *tc = malloc (sizeof *tc);
  int r;

  *why = "out of memory";
  if (tc == NULL)
    return NULL;
  *tc = (struct tls_conn) {
    .tls = tls, .t = t, .fd = fd,
    .handshake_done = handshake_done, .settled = settled, .opaque = opaque,
    .in_end_res = 1,
    .sock_rx_c.fn = on_sock_recv, .sock_tx_c.fn = on_sock_send,
    .rx_nop_c.fn = on_rx_nop, .tx_nop_c.fn = on_tx_nop,
  };
  tc->in = malloc (TLS_IN_BYTES);
  tc->out = malloc (TLS_OUT_BYTES);
  tc->out_cap = TLS_OUT_BYTES;
  if (tc->in == NULL || tc->out == NULL)
    goto fail;
  /* No session tickets: no resumption is offered, and nothing of the
   * handshake is left to send once the kernel may hold the keys.
   */
  r = gt.gnutls_init (&tc->s, GNUTLS_SERVER | GNUTLS_NONBLOCK |
                      GNUTLS_NO_TICKETS);
  if (r < 0)
    goto fail;
  r = gt.gnutls_priority_set (tc->s, tls->priority);
  if (r == 0)
    r = tls->psk ? gt.gnutls_credentials_set (tc->s, GNUTLS_CRD_PSK, tls->psk)
                 : gt.gnutls_credentials_set (tc->s, GNUTLS_CRD_CERTIFICATE,
                                           tls->x509);
  if (r < 0) {
    *why = gt.gnutls_strerror (r);
    goto fail;
  }
  if (tls->x509)
    gt.gnutls_certificate_server_set_request (tc->s, tls->verify_peer
                                           ? GNUTLS_CERT_REQUIRE
                                           : GNUTLS_CERT_IGNORE);
  /* The connection's own clock bounds the handshake (its watchdog). */
  gt.gnutls_handshake_set_timeout (tc->s, GNUTLS_INDEFINITE_TIMEOUT);
  gt.gnutls_transport_set_ptr (tc->s, tc);
  gt.gnutls_transport_set_pull_function (tc->s, pull);
  gt.gnutls_transport_set_push_function (tc->s, push);
  return tc;

 fail:
  tls_conn_free (tc);
  return NULL;
}

int
tls_conn_to_kernel (struct tls_conn *tc, char *why, size_t len)
{
  if (tc->tls->no_ktls) {
    snprintf (why, len, "kTLS is off");
    return -1;
  }
  /* The kernel starts from the session's sequence numbers: no record may
   * be half sent, nor read from the socket and not yet decrypted.
   */
  if (tls_conn_busy (tc) || tc->out_sent != tc->out_len) {
    snprintf (why, len, "TLS records are still being sent");
    return -1;
  }
  if (tc->in_start != tc->in_end) {
    snprintf (why, len, "the client sent records ahead of the switch");
    return -1;
  }
  return pdio_ktls_enable (tc->s, tc->fd, true, why, len);
}

void
tls_conn_handshake (struct tls_conn *tc)
{
  tc->handshaking = true;
  handshake_step (tc);
}

const char *
tls_conn_peer (const struct tls_conn *tc)
{
  return tc->peer;
}

void
tls_conn_free (struct tls_conn *tc)
{
  if (tc == NULL)
    return;
  if (tc->s)
    gt.gnutls_deinit (tc->s);
  free (tc->in);
  free (tc->out);
  free (tc->peer);
  free (tc);
}
