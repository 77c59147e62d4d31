/* SPDX-License-Identifier: BSD-3-Clause */
/* The client side of TLS for a remote export (nbds://, nbds+unix://):
 * after NBD_OPT_STARTTLS (negotiate.c), a GnuTLS session on the socket,
 * with the credentials pdio serve, nbdkit and qemu-nbd use:
 *  - x509: DIR/ca-cert.pem, the CA the server's certificate must chain
 *    to (without DIR, the system's trust store), and DIR/client-cert.pem
 *    with DIR/client-key.pem if both are there, for servers that ask for
 *    a client certificate (--tls-authz checks its DN);
 *  - PSK: a psktool file, of which the line of the user name is used.
 * With peer verification (the default) the server's certificate must
 * chain to the CA and name the host of the URI (or tls-hostname=).
 *
 * Each failure is said for what it is: the server refusing STARTTLS (in
 * negotiate.c), a certificate that does not chain, a name that does not
 * match, a key the server does not share.
 *
 * TLS 1.3 servers send a NewSessionTicket once their handshake is done.
 * The client asks for none (GNUTLS_NO_TICKETS), and the rest of the NBD
 * handshake (NBD_OPT_GO and its replies) runs inside the session, so a
 * ticket a server sends anyway is read and dropped by GnuTLS before the
 * socket is handed on (to kTLS or to the relay): the kernel's nbd driver
 * must see data records only.  tls_client_idle says whether anything is
 * left in GnuTLS's buffers.
 *
 * GnuTLS is loaded (dlopen) when a URI asks for TLS, as pdio serve does
 * (src/server/tls.c): a supervisor of a plain link never maps it.
 */
#include <config.h>

#include <errno.h>
#include <limits.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <gnutls/gnutls.h>

#include "pdio.h"
#include "proto.h"

/* As libnbd, nbdkit and qemu-nbd offer PSK. */
#define PRIORITY_X509 "NORMAL"
#define PRIORITY_PSK "NORMAL:+ECDHE-PSK:+DHE-PSK:+PSK"
#define HANDSHAKE_MS 10000

#define GNUTLS_FUNCTIONS(X) \
  X (gnutls_alert_get) \
  X (gnutls_alert_get_name) \
  X (gnutls_certificate_allocate_credentials) \
  X (gnutls_certificate_free_credentials) \
  X (gnutls_certificate_set_x509_crl_file) \
  X (gnutls_certificate_set_x509_key_file) \
  X (gnutls_certificate_set_x509_system_trust) \
  X (gnutls_certificate_set_x509_trust_file) \
  X (gnutls_certificate_verification_status_print) \
  X (gnutls_cipher_get) \
  X (gnutls_cipher_get_name) \
  X (gnutls_credentials_set) \
  X (gnutls_deinit) \
  X (gnutls_error_is_fatal) \
  X (gnutls_global_init) \
  X (gnutls_handshake) \
  X (gnutls_handshake_set_timeout) \
  X (gnutls_init) \
  X (gnutls_priority_set_direct) \
  X (gnutls_protocol_get_name) \
  X (gnutls_protocol_get_version) \
  X (gnutls_psk_allocate_client_credentials) \
  X (gnutls_psk_free_client_credentials) \
  X (gnutls_psk_set_client_credentials) \
  X (gnutls_record_check_pending) \
  X (gnutls_record_get_direction) \
  X (gnutls_record_recv) \
  X (gnutls_record_send) \
  X (gnutls_server_name_set) \
  X (gnutls_session_get_verify_cert_status) \
  X (gnutls_session_set_verify_cert) \
  X (gnutls_strerror) \
  X (gnutls_transport_set_int2)

PDIO_GNUTLS_TABLE (GNUTLS_FUNCTIONS);
static bool gt_loaded;

struct tls_client {
  gnutls_session_t s;
  gnutls_certificate_credentials_t x509;
  gnutls_psk_client_credentials_t psk;
  int fd;
  bool handshaken;
};

static bool
load_gnutls (char *why, size_t len)
{
  if (gt_loaded)
    return true;
  if (pdio_gnutls_load (gt_names, gt.addr, sizeof gt_names / sizeof *gt_names,
                        why, len) < 0)
    return false;
  if (gt.gnutls_global_init () < 0) {
    snprintf (why, len, "%s: cannot initialise GnuTLS", PDIO_GNUTLS_SONAME);
    return false;
  }
  gt_loaded = true;
  return true;
}

bool
tls_client_mode_psk (const struct nbd_uri *u)
{
  return strcmp (u->tls_type, "psk") == 0 ||
    (u->tls_type[0] == '\0' && u->tls_psk_file[0]);
}

/* The PSK user: tls-username, the URI's user, else the user running pdio,
 * as libnbd does.
 */
static void
psk_user (const struct nbd_uri *u, char *buf, size_t len)
{
  struct passwd *pw;

  if (u->user[0])
    snprintf (buf, len, "%s", u->user);
  else if ((pw = getpwuid (geteuid ())) != NULL)
    snprintf (buf, len, "%s", pw->pw_name);
  else
    snprintf (buf, len, "%u", (unsigned) geteuid ());
}

static bool
load_psk (struct tls_client *t, const struct nbd_uri *u, char *why,
          size_t len)
{
  char user[256], line[1024];
  FILE *fp = fopen (u->tls_psk_file, "re");
  bool found = false;
  int r;

  psk_user (u, user, sizeof user);
  if (fp == NULL) {
    snprintf (why, len, "%s: %m (the PSK file)", u->tls_psk_file);
    return false;
  }
  while (!found && fgets (line, sizeof line, fp)) {
    char *colon = strchr (line, ':');

    line[strcspn (line, "\r\n")] = '\0';
    if (colon && (size_t) (colon - line) == strlen (user) &&
        strncmp (line, user, colon - line) == 0) {
      gnutls_datum_t key = { .data = (unsigned char *) colon + 1,
                             .size = strlen (colon + 1) };

      found = true;
      if ((r = gt.gnutls_psk_allocate_client_credentials (&t->psk)) < 0 ||
          (r = gt.gnutls_psk_set_client_credentials (t->psk, user, &key,
                                                     GNUTLS_PSK_KEY_HEX)) < 0)
        snprintf (why, len, "%s: the key of %s: %s", u->tls_psk_file, user,
                  gt.gnutls_strerror (r));
      else
        r = 0;
    }
  }
  fclose (fp);
  explicit_bzero (line, sizeof line);
  if (!found) {
    snprintf (why, len, "%s: no key for the PSK user \"%s\" (psktool -u %s "
              "-p %s adds one; --tls-username names another)",
              u->tls_psk_file, user, user, u->tls_psk_file);
    return false;
  }
  return r == 0;
}

static bool
load_x509 (struct tls_client *t, const struct nbd_uri *u, char *why,
           size_t len)
{
  const char *dir = u->tls_certificates;
  char ca[PATH_MAX + 32], cert[PATH_MAX + 32], key[PATH_MAX + 32],
       crl[PATH_MAX + 32];
  int r;

  if ((r = gt.gnutls_certificate_allocate_credentials (&t->x509)) < 0) {
    snprintf (why, len, "GnuTLS: %s", gt.gnutls_strerror (r));
    return false;
  }
  if (dir[0] == '\0') {
    r = gt.gnutls_certificate_set_x509_system_trust (t->x509);
    if (r <= 0) {
      snprintf (why, len, "no --tls-certificates DIR and no system trust "
                "store: %s", r == 0 ? "no CA in it" : gt.gnutls_strerror (r));
      return false;
    }
    return true;
  }
  snprintf (ca, sizeof ca, "%s/ca-cert.pem", dir);
  snprintf (cert, sizeof cert, "%s/client-cert.pem", dir);
  snprintf (key, sizeof key, "%s/client-key.pem", dir);
  snprintf (crl, sizeof crl, "%s/ca-crl.pem", dir);
  if (access (ca, R_OK) == -1) {
    snprintf (why, len, "%s: %m (the CA that signs the server's "
              "certificate)", ca);
    return false;
  }
  r = gt.gnutls_certificate_set_x509_trust_file (t->x509, ca,
                                                 GNUTLS_X509_FMT_PEM);
  if (r <= 0) {
    snprintf (why, len, "%s: %s", ca,
              r == 0 ? "no certificate in it" : gt.gnutls_strerror (r));
    return false;
  }
  if (access (cert, F_OK) == 0 && access (key, F_OK) == 0) {
    r = gt.gnutls_certificate_set_x509_key_file (t->x509, cert, key,
                                                 GNUTLS_X509_FMT_PEM);
    if (r < 0) {
      snprintf (why, len, "%s, %s: %s", cert, key, gt.gnutls_strerror (r));
      return false;
    }
  }
  if (access (crl, F_OK) == 0) {
    r = gt.gnutls_certificate_set_x509_crl_file (t->x509, crl,
                                                 GNUTLS_X509_FMT_PEM);
    if (r < 0) {
      snprintf (why, len, "%s: %s", crl, gt.gnutls_strerror (r));
      return false;
    }
  }
  return true;
}

void
tls_client_free (struct tls_client *t)
{
  if (t == NULL)
    return;
  if (t->s)
    gt.gnutls_deinit (t->s);
  if (t->x509)
    gt.gnutls_certificate_free_credentials (t->x509);
  if (t->psk)
    gt.gnutls_psk_free_client_credentials (t->psk);
  free (t);
}

/* SNI takes a DNS name, never an address. */
static bool
is_dns_name (const char *name)
{
  return strchr (name, ':') == NULL &&
    strspn (name, "0123456789.") != strlen (name);
}

/* The host name the certificate must carry: tls-hostname=, else the
 * URI's host; none for a unix socket (the CA is still checked).
 */
static const char *
verify_name (const struct nbd_uri *u)
{
  if (u->tls_hostname[0])
    return u->tls_hostname;
  return u->unix_socket ? NULL : u->host;
}

struct tls_client *
tls_client_new (const struct nbd_uri *u, int fd, char *why, size_t len)
{
  struct tls_client *t;
  bool psk = tls_client_mode_psk (u);
  const char *name = verify_name (u);
  int r;

  if (!load_gnutls (why, len))
    return NULL;
  if (strcmp (u->tls_type, "anon") == 0) {
    snprintf (why, len, "tls-type=anon: anonymous TLS is not supported "
              "(x509 or psk)");
    return NULL;
  }
  t = calloc (1, sizeof *t);
  if (t == NULL) {
    snprintf (why, len, "calloc: %m");
    return NULL;
  }
  t->fd = fd;
  if (!(psk ? load_psk (t, u, why, len) : load_x509 (t, u, why, len)))
    goto fail;
  /* GnuTLS's own sends on the socket: a server that hangs up (one that
   * refuses the client after the handshake, --tls-authz) must not kill
   * attach, or the supervisor and its relay, with SIGPIPE.
   */
  r = gt.gnutls_init (&t->s, GNUTLS_CLIENT | GNUTLS_NO_TICKETS |
                      GNUTLS_NO_SIGNAL);
  if (r == 0)
    r = gt.gnutls_priority_set_direct (t->s, psk ? PRIORITY_PSK
                                                 : PRIORITY_X509, NULL);
  if (r == 0)
    r = psk ? gt.gnutls_credentials_set (t->s, GNUTLS_CRD_PSK, t->psk)
            : gt.gnutls_credentials_set (t->s, GNUTLS_CRD_CERTIFICATE,
                                         t->x509);
  if (r == 0 && !psk && name && is_dns_name (name))
    r = gt.gnutls_server_name_set (t->s, GNUTLS_NAME_DNS, name,
                                   strlen (name));
  if (r < 0) {
    snprintf (why, len, "GnuTLS: %s", gt.gnutls_strerror (r));
    goto fail;
  }
  if (!psk && u->tls_verify_peer != 0)
    gt.gnutls_session_set_verify_cert (t->s, name, 0);
  gt.gnutls_transport_set_int2 (t->s, fd, fd);
  gt.gnutls_handshake_set_timeout (t->s, HANDSHAKE_MS);
  return t;

 fail:
  tls_client_free (t);
  return NULL;
}

/* A handshake that failed: what it means for the user. */
static void
handshake_failed (struct tls_client *t, const struct nbd_uri *u, int r,
                  char *why, size_t len)
{
  bool psk = tls_client_mode_psk (u);
  char user[256];

  if (r == GNUTLS_E_CERTIFICATE_VERIFICATION_ERROR) {
    gnutls_datum_t out = { NULL, 0 };
    unsigned status = gt.gnutls_session_get_verify_cert_status (t->s);

    gt.gnutls_certificate_verification_status_print (status,
                                                     GNUTLS_CRT_X509, &out,
                                                     0);
    if (status & GNUTLS_CERT_UNEXPECTED_OWNER)
      snprintf (why, len, "the server's certificate is not for \"%s\" "
                "(tls-hostname= names the host it must be for): %s",
                verify_name (u), out.data ? (char *) out.data : "");
    else
      snprintf (why, len, "the server's certificate was refused (%s%s): "
                "%s", u->tls_certificates[0] ? u->tls_certificates
                                             : "the system's CAs",
                u->tls_certificates[0] ? "/ca-cert.pem" : "",
                out.data ? (char *) out.data : "");
    if (out.data)
      (*gt.gnutls_free) (out.data);
    return;
  }
  /* A server that does not share the key cannot decrypt our Finished:
   * it says so in an alert, or (pdio serve, nbdkit) just hangs up.
   */
  if (psk && (r == GNUTLS_E_FATAL_ALERT_RECEIVED ||
              r == GNUTLS_E_DECRYPTION_FAILED ||
              r == GNUTLS_E_PREMATURE_TERMINATION)) {
    psk_user (u, user, sizeof user);
    snprintf (why, len, "the server refused the PSK of user \"%s\" from %s "
              "(a wrong key, or a user it does not know): %s", user,
              u->tls_psk_file, r == GNUTLS_E_FATAL_ALERT_RECEIVED
              ? gt.gnutls_alert_get_name (gt.gnutls_alert_get (t->s))
              : gt.gnutls_strerror (r));
    return;
  }
  if (r == GNUTLS_E_FATAL_ALERT_RECEIVED)
    snprintf (why, len, "the TLS handshake failed: the server said: %s",
              gt.gnutls_alert_get_name (gt.gnutls_alert_get (t->s)));
  else
    snprintf (why, len, "the TLS handshake failed: %s",
              gt.gnutls_strerror (r));
}

bool
tls_client_handshake (struct tls_client *t, const struct nbd_uri *u,
                      char *why, size_t len)
{
  int r;

  /* A blocking socket: GNUTLS_E_AGAIN is its receive timeout expiring. */
  do
    r = gt.gnutls_handshake (t->s);
  while (r < 0 && r != GNUTLS_E_AGAIN && !gt.gnutls_error_is_fatal (r));
  if (r < 0) {
    handshake_failed (t, u, r, why, len);
    return false;
  }
  t->handshaken = true;
  return true;
}

/* Errors of a record: errno for the caller's %m. */
static void
set_errno (int r)
{
  switch (r) {
  case GNUTLS_E_AGAIN:
    errno = ETIMEDOUT;
    break;
  case GNUTLS_E_PREMATURE_TERMINATION:
  case GNUTLS_E_PUSH_ERROR:
  case GNUTLS_E_PULL_ERROR:
    errno = ECONNRESET;
    break;
  default:
    errno = EPROTO;
  }
}

/* Moves all n bytes through the session, receiving (rx) or sending;
 * send only reads buf.
 */
static bool
transfer (struct tls_client *t, void *buf, size_t n, bool rx)
{
  for (char *p = buf; n; ) {
    ssize_t r = rx ? gt.gnutls_record_recv (t->s, p, n)
                   : gt.gnutls_record_send (t->s, p, n);

    if (r == 0 && rx) {
      errno = ECONNRESET;
      return false;
    }
    if (r < 0) {
      if (r == GNUTLS_E_INTERRUPTED)
        continue;
      set_errno (r);
      return false;
    }
    p += r;
    n -= r;
  }
  return true;
}

bool
tls_client_read (struct tls_client *t, void *buf, size_t n)
{
  return transfer (t, buf, n, true);
}

bool
tls_client_write (struct tls_client *t, const void *buf, size_t n)
{
  return transfer (t, (void *) buf, n, false);
}

bool
tls_client_idle (struct tls_client *t)
{
  return gt.gnutls_record_check_pending (t->s) == 0;
}

void
tls_client_describe (struct tls_client *t, char *buf, size_t len)
{
  snprintf (buf, len, "%s, %s",
            gt.gnutls_protocol_get_name (gt.gnutls_protocol_get_version
                                         (t->s)),
            gt.gnutls_cipher_get_name (gt.gnutls_cipher_get (t->s)));
}

void *
tls_client_session (struct tls_client *t)
{
  return t->s;
}

int
tls_client_fd (struct tls_client *t)
{
  return t->fd;
}

/* --- the relay's non-blocking records ------------------------------------ */
ssize_t
tls_client_recv_some (struct tls_client *t, void *buf, size_t n)
{
  ssize_t r;

  do
    r = gt.gnutls_record_recv (t->s, buf, n);
  while (r == GNUTLS_E_INTERRUPTED);
  if (r == GNUTLS_E_AGAIN)
    return -EAGAIN;
  /* Servers hang up without close_notify after NBD_CMD_DISC (pdio serve,
   * nbdkit): an end like any other; a reply cut short is the kernel's to
   * notice, by its framing.
   */
  if (r == GNUTLS_E_PREMATURE_TERMINATION)
    return 0;
  if (r < 0)
    return -EPROTO;
  return r;
}

ssize_t
tls_client_send_some (struct tls_client *t, const void *buf, size_t n)
{
  ssize_t r;

  do
    r = gt.gnutls_record_send (t->s, buf, n);
  while (r == GNUTLS_E_INTERRUPTED);
  if (r == GNUTLS_E_AGAIN)
    return -EAGAIN;
  if (r < 0)
    return -EPIPE;
  return r;
}

size_t
tls_client_pending (struct tls_client *t)
{
  return gt.gnutls_record_check_pending (t->s);
}

bool
tls_client_wants_write (struct tls_client *t)
{
  return gt.gnutls_record_get_direction (t->s) == 1;
}
