/* SPDX-License-Identifier: BSD-3-Clause */
/* pdio_ktls_enable (src/protocol/ktls.c) on real TLS sessions: a GnuTLS
 * client and server over loopback TCP, for each cipher and version kTLS
 * takes, and one it does not.  The server's side is handed over; then
 * either the kernel took it (plaintext sent and received on the socket
 * must be the client's TLS data, both ways), or it refused with a reason
 * and the session must go on in user space on the same socket.
 *
 * PDIO_TEST_KTLS=yes (the guest, which has the tls module) makes a
 * refusal a failure; =no (a kernel without it) makes a success one; unset,
 * either is checked for what it is.  It also checks what pdio's server
 * relies on when it has kTLS: a TLS 1.3 KeyUpdate from the client makes a
 * plain recv fail with EIO, and recvmsg with room for a control message
 * then reads it as a handshake record.
 */
#include <config.h>

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <linux/tls.h>
#include <time.h>
#include <gnutls/gnutls.h>
#include <gnutls/x509.h>

#include "proto.h"
#include "unit.h"

#ifndef SOL_TLS
#define SOL_TLS 282
#endif

struct end {
  gnutls_session_t s;
  int fd;
  int r;
};

/* A self-signed ECDSA certificate, made once: TLS 1.3's AES-256-GCM
 * suite hashes with SHA-384, which GnuTLS 3.7's PSKs (SHA-256) cannot do.
 */
static gnutls_certificate_credentials_t
server_credentials (void)
{
  static gnutls_certificate_credentials_t cred;
  gnutls_x509_privkey_t key;
  gnutls_x509_crt_t crt;
  time_t now = time (NULL);

  if (cred)
    return cred;
  CHECK (gnutls_x509_privkey_init (&key) == 0 &&
         gnutls_x509_privkey_generate (key, GNUTLS_PK_ECDSA,
                                       GNUTLS_CURVE_TO_BITS
                                       (GNUTLS_ECC_CURVE_SECP256R1), 0) == 0,
         "key");
  CHECK (gnutls_x509_crt_init (&crt) == 0 &&
         gnutls_x509_crt_set_version (crt, 3) == 0 &&
         gnutls_x509_crt_set_serial (crt, "\1", 1) == 0 &&
         gnutls_x509_crt_set_activation_time (crt, now - 60) == 0 &&
         gnutls_x509_crt_set_expiration_time (crt, now + 3600) == 0 &&
         gnutls_x509_crt_set_key (crt, key) == 0 &&
         gnutls_x509_crt_set_dn (crt, "CN=localhost", NULL) == 0 &&
         gnutls_x509_crt_sign2 (crt, crt, key, GNUTLS_DIG_SHA256, 0) == 0,
         "certificate");
  CHECK (gnutls_certificate_allocate_credentials (&cred) == 0 &&
         gnutls_certificate_set_x509_key (cred, &crt, 1, key) == 0,
         "credentials");
  gnutls_x509_crt_deinit (crt);
  gnutls_x509_privkey_deinit (key);
  return cred;
}

static void *
handshake (void *p)
{
  struct end *e = p;

  do
    e->r = gnutls_handshake (e->s);
  while (e->r < 0 && !gnutls_error_is_fatal (e->r));
  /* A failed end must not leave the other waiting. */
  if (e->r < 0)
    shutdown (e->fd, SHUT_RDWR);
  return NULL;
}

/* A handshaken pair over loopback TCP with priority prio. */
static void
pair (const char *prio, struct end *srv, struct end *cli)
{
  static gnutls_certificate_credentials_t ccred;
  struct sockaddr_in a = { .sin_family = AF_INET,
                           .sin_addr.s_addr = htonl (INADDR_LOOPBACK) };
  socklen_t alen = sizeof a;
  pthread_t th;
  int l;

  /* The client verifies nothing: the keys are what is tested. */
  if (ccred == NULL)
    CHECK (gnutls_certificate_allocate_credentials (&ccred) == 0, "creds");
  l = socket (AF_INET, SOCK_STREAM, 0);
  CHECK (l >= 0 && bind (l, (struct sockaddr *) &a, sizeof a) == 0 &&
         listen (l, 1) == 0 &&
         getsockname (l, (struct sockaddr *) &a, &alen) == 0, "%m");
  cli->fd = socket (AF_INET, SOCK_STREAM, 0);
  CHECK (connect (cli->fd, (struct sockaddr *) &a, sizeof a) == 0, "%m");
  srv->fd = accept (l, NULL, NULL);
  CHECK (srv->fd >= 0, "%m");
  close (l);

  CHECK (gnutls_init (&srv->s, GNUTLS_SERVER) == 0, "init");
  CHECK (gnutls_init (&cli->s, GNUTLS_CLIENT) == 0, "init");
  CHECK (gnutls_priority_set_direct (srv->s, prio, NULL) == 0, "%s", prio);
  CHECK (gnutls_priority_set_direct (cli->s, prio, NULL) == 0, "%s", prio);
  gnutls_credentials_set (srv->s, GNUTLS_CRD_CERTIFICATE,
                          server_credentials ());
  gnutls_credentials_set (cli->s, GNUTLS_CRD_CERTIFICATE, ccred);
  gnutls_transport_set_int (srv->s, srv->fd);
  gnutls_transport_set_int (cli->s, cli->fd);
  CHECK (pthread_create (&th, NULL, handshake, cli) == 0, "thread");
  handshake (srv);
  pthread_join (th, NULL);
  CHECK (srv->r == 0 && cli->r == 0, "handshake: %s / %s",
         gnutls_strerror (srv->r), gnutls_strerror (cli->r));
}

static void
done (struct end *srv, struct end *cli)
{
  gnutls_deinit (srv->s);
  gnutls_deinit (cli->s);
  close (srv->fd);
  close (cli->fd);
}

/* The socket still speaks user-space TLS, both ways. */
static void
check_userspace (struct end *srv, struct end *cli)
{
  char buf[16] = "";

  CHECK (gnutls_record_send (cli->s, "ping", 4) == 4, "client send");
  CHECK (gnutls_record_recv (srv->s, buf, sizeof buf) == 4 &&
         memcmp (buf, "ping", 4) == 0, "server recv");
  CHECK (gnutls_record_send (srv->s, "pong", 4) == 4, "server send");
  CHECK (gnutls_record_recv (cli->s, buf, sizeof buf) == 4 &&
         memcmp (buf, "pong", 4) == 0, "client recv");
}

/* The kernel holds the server's keys: its plain socket I/O is the
 * client's TLS.  Large enough to take several records each way.
 */
static void
check_kernel (struct end *srv, struct end *cli)
{
  static char out[100000], in[sizeof out];
  size_t got = 0;
  ssize_t r;

  for (size_t i = 0; i < sizeof out; i++)
    out[i] = (char) (i * 7 + 1);
  CHECK (gnutls_record_send (cli->s, "ping", 4) == 4, "client send");
  CHECK (recv (srv->fd, in, sizeof in, 0) == 4 && memcmp (in, "ping", 4) == 0,
         "kernel recv: %m");
  CHECK (send (srv->fd, out, sizeof out, 0) == (ssize_t) sizeof out,
         "kernel send: %m");
  while (got < sizeof in) {
    r = gnutls_record_recv (cli->s, in + got, sizeof in - got);
    CHECK (r > 0, "client recv: %s", gnutls_strerror ((int) r));
    got += r;
  }
  CHECK (memcmp (in, out, sizeof in) == 0, "the client read other bytes");
}

/* A KeyUpdate on a kTLS receive: what the server's -EIO handling reads. */
static void
check_key_update (struct end *srv, struct end *cli)
{
  unsigned char buf[64], cbuf[CMSG_SPACE (sizeof (unsigned char))];
  struct iovec iov = { buf, sizeof buf };
  struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1,
                      .msg_control = cbuf, .msg_controllen = sizeof cbuf };
  struct cmsghdr *c;
  ssize_t r;

  CHECK (gnutls_session_key_update (cli->s, 0) == 0, "key update");
  r = recv (srv->fd, buf, sizeof buf, 0);
  CHECK (r == -1 && errno == EIO, "plain recv of a KeyUpdate: %zd %m", r);
  r = recvmsg (srv->fd, &m, 0);
  c = CMSG_FIRSTHDR (&m);
  CHECK (r >= 1 && c && c->cmsg_level == SOL_TLS &&
         c->cmsg_type == TLS_GET_RECORD_TYPE &&
         *CMSG_DATA (c) == 22 && buf[0] == 24,
         "recvmsg: %zd, record type %d, first byte %d", r,
         c ? *CMSG_DATA (c) : -1, r > 0 ? buf[0] : -1);
}

int
main (void)
{
  static const struct {
    const char *name, *prio;
    bool takes;
  } cases[] = {
    { "TLS 1.3 AES-128-GCM",
      "NORMAL:-VERS-ALL:+VERS-TLS1.3:-CIPHER-ALL:+AES-128-GCM", true },
    { "TLS 1.3 AES-256-GCM",
      "NORMAL:-VERS-ALL:+VERS-TLS1.3:-CIPHER-ALL:+AES-256-GCM", true },
    { "TLS 1.3 CHACHA20-POLY1305",
      "NORMAL:-VERS-ALL:+VERS-TLS1.3:-CIPHER-ALL:+CHACHA20-POLY1305", true },
    { "TLS 1.2 AES-128-GCM",
      "NORMAL:-VERS-ALL:+VERS-TLS1.2:-CIPHER-ALL:+AES-128-GCM", true },
    { "TLS 1.2 AES-256-GCM",
      "NORMAL:-VERS-ALL:+VERS-TLS1.2:-CIPHER-ALL:+AES-256-GCM", true },
    { "TLS 1.2 CHACHA20-POLY1305",
      "NORMAL:-VERS-ALL:+VERS-TLS1.2:-CIPHER-ALL:+CHACHA20-POLY1305", true },
    { "TLS 1.2 AES-128-CBC",
      "NORMAL:-VERS-ALL:+VERS-TLS1.2:-CIPHER-ALL:+AES-128-CBC:+SHA1:+SHA256",
      false },
  };
  const char *want = getenv ("PDIO_TEST_KTLS");
  bool key_update_checked = false;

  CHECK (gnutls_global_init () == 0, "gnutls_global_init");
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    struct end srv, cli;
    char why[256] = "";
    int r;

    pair (cases[i].prio, &srv, &cli);
    r = pdio_ktls_enable (srv.s, srv.fd, true, why, sizeof why);
    printf ("%s: %d: %s\n", cases[i].name, r, why);
    CHECK (r == 0 || r == -1, "%d", r);
    CHECK (why[0] != '\0', "no reason given");
    if (!cases[i].takes) {
      CHECK (r == -1 && strstr (why, "is not one kTLS takes"), "%s", why);
      check_userspace (&srv, &cli);
    }
    else if (r == 0) {
      CHECK (want == NULL || strcmp (want, "no") != 0, "kTLS was not expected");
      CHECK (strstr (why, "kTLS ") == why, "%s", why);
      check_kernel (&srv, &cli);
      if (strstr (cases[i].name, "1.3")) {
        check_key_update (&srv, &cli);
        key_update_checked = true;
      }
    }
    else {
      CHECK (want == NULL || strcmp (want, "yes") != 0, "kTLS refused: %s",
             why);
      /* A kernel without the module: the one reason that is not ours. */
      CHECK (strstr (why, "TCP_ULP"), "%s", why);
      check_userspace (&srv, &cli);
    }
    done (&srv, &cli);
  }
  if (key_update_checked)
    printf ("a KeyUpdate on kTLS RX: recv EIO, recvmsg type 22 (handshake)\n");
  gnutls_global_deinit ();
  return 0;
}
