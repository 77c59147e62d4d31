/* SPDX-License-Identifier: BSD-3-Clause */
/* A TLS NBD client that sends a TLS 1.3 KeyUpdate mid-session, which no
 * usual client (nbd-client, libnbd, qemu, Python's ssl) can be made to do:
 *
 *   tls_keyupdate HOST PORT CA-CERT CERT KEY
 *
 * Fixed newstyle, STARTTLS (GnuTLS, TLS 1.3, the server's certificate
 * checked against CA-CERT), NBD_OPT_GO on the default export; then a 4 KiB
 * READ at 0, gnutls_session_key_update (GNUTLS_KU_PEER: the server must
 * update its key too), and the same READ again.  Prints each step, and
 * how many TLS 1.3 session tickets the server sent.  Exit
 * status: 0 both READs answered alike; 3 the server ended the connection
 * after the KeyUpdate (what pdio serve does where the kernel holds the
 * keys and cannot take new ones); 1 anything else.
 */
#include <config.h>

#include <netdb.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/socket.h>
#include <gnutls/gnutls.h>

#include "byteorder.h"
#include "proto.h"

static gnutls_session_t s;
static int fd = -1;
static unsigned tickets;

static int
on_ticket (gnutls_session_t t, unsigned htype, unsigned when,
           unsigned incoming, const gnutls_datum_t *msg)
{
  (void) t;
  (void) htype;
  (void) when;
  (void) msg;
  if (incoming)
    tickets++;
  return 0;
}

static void
die (const char *what)
{
  fprintf (stderr, "tls_keyupdate: %s\n", what);
  exit (1);
}

/* Plain (before TLS) or TLS, all of len: false at the end of the stream. */
static bool
get (void *buf, size_t len)
{
  size_t got = 0;

  while (got < len) {
    ssize_t r = s ? gnutls_record_recv (s, (uint8_t *) buf + got, len - got)
                  : recv (fd, (uint8_t *) buf + got, len - got, 0);

    if (r == GNUTLS_E_AGAIN || r == GNUTLS_E_INTERRUPTED)
      continue;
    if (r <= 0) {
      if (s && r < 0)
        fprintf (stderr, "tls_keyupdate: receive: %s\n",
                 gnutls_strerror ((int) r));
      return false;
    }
    got += r;
  }
  return true;
}

static bool
put (const void *buf, size_t len)
{
  ssize_t r = s ? gnutls_record_send (s, buf, len) : send (fd, buf, len, 0);

  return r == (ssize_t) len;
}

static void
option (uint32_t opt, const void *data, uint32_t len)
{
  uint8_t h[16];

  nbd_put64 (h, NBD_IHAVEOPT);
  nbd_put32 (h + 8, opt);
  nbd_put32 (h + 12, len);
  if (!put (h, sizeof h) || (len && !put (data, len)))
    die ("cannot send an option");
}

/* The replies to an option up to its last: the last's type. */
static uint32_t
replies (void)
{
  uint8_t r[20], skip[1024];
  uint32_t type, len;

  do {
    if (!get (r, sizeof r) || nbd_get64 (r) != NBD_REP_MAGIC)
      die ("bad option reply");
    type = nbd_get32 (r + 12);
    len = nbd_get32 (r + 16);
    if (len > sizeof skip || !get (skip, len))
      die ("bad option reply length");
  } while (type == NBD_REP_INFO);
  return type;
}

/* One 4 KiB READ at 0 into buf: false if the connection ended. */
static bool
read0 (uint64_t cookie, uint8_t buf[4096])
{
  uint8_t q[NBD_REQUEST_LEN] = { 0 }, a[NBD_SIMPLE_REPLY_LEN];

  nbd_put32 (q, NBD_REQUEST_MAGIC);
  nbd_put16 (q + 6, NBD_CMD_READ);
  nbd_put64 (q + 8, cookie);
  nbd_put64 (q + 16, 0);
  nbd_put32 (q + 24, 4096);
  if (!put (q, sizeof q) || !get (a, sizeof a))
    return false;
  if (nbd_get32 (a) != NBD_SIMPLE_REPLY_MAGIC || nbd_get32 (a + 4) != 0 ||
      nbd_get64 (a + 8) != cookie)
    die ("bad READ reply");
  return get (buf, 4096);
}

int
main (int argc, char **argv)
{
  gnutls_certificate_credentials_t cred;
  gnutls_session_t t;
  struct addrinfo hints = { .ai_socktype = SOCK_STREAM }, *ai;
  uint8_t greet[18], flags[4], first[4096], second[4096];
  uint8_t go[6] = { 0 };        /* name length 0, no info requests */
  int r;

  if (argc != 6)
    die ("usage: tls_keyupdate HOST PORT CA-CERT CERT KEY");
  if (getaddrinfo (argv[1], argv[2], &hints, &ai) != 0)
    die ("cannot resolve the address");
  fd = socket (ai->ai_family, ai->ai_socktype, 0);
  if (fd < 0 || connect (fd, ai->ai_addr, ai->ai_addrlen) < 0)
    die ("cannot connect");
  if (!get (greet, sizeof greet) || nbd_get64 (greet) != NBD_MAGIC ||
      nbd_get64 (greet + 8) != NBD_IHAVEOPT)
    die ("not an NBD newstyle server");
  nbd_put32 (flags, NBD_FLAG_C_FIXED_NEWSTYLE | NBD_FLAG_C_NO_ZEROES);
  if (!put (flags, sizeof flags))
    die ("cannot send the client flags");
  option (NBD_OPT_STARTTLS, NULL, 0);
  if (replies () != NBD_REP_ACK)
    die ("STARTTLS refused");

  if (gnutls_certificate_allocate_credentials (&cred) < 0 ||
      gnutls_certificate_set_x509_trust_file (cred, argv[3],
                                              GNUTLS_X509_FMT_PEM) <= 0 ||
      gnutls_certificate_set_x509_key_file (cred, argv[4], argv[5],
                                            GNUTLS_X509_FMT_PEM) < 0)
    die ("cannot load the certificates");
  if (gnutls_init (&t, GNUTLS_CLIENT) < 0 ||
      gnutls_priority_set_direct (t, "NORMAL:-VERS-ALL:+VERS-TLS1.3",
                                  NULL) < 0 ||
      gnutls_credentials_set (t, GNUTLS_CRD_CERTIFICATE, cred) < 0)
    die ("cannot make a TLS session");
  gnutls_session_set_verify_cert (t, "localhost", 0);
  gnutls_handshake_set_hook_function (t, GNUTLS_HANDSHAKE_NEW_SESSION_TICKET,
                                      GNUTLS_HOOK_POST, on_ticket);
  gnutls_transport_set_int (t, fd);
  do
    r = gnutls_handshake (t);
  while (r < 0 && !gnutls_error_is_fatal (r));
  if (r < 0) {
    fprintf (stderr, "tls_keyupdate: handshake: %s\n", gnutls_strerror (r));
    return 1;
  }
  s = t;
  printf ("TLS: %s\n", gnutls_session_get_desc (s));

  option (NBD_OPT_GO, go, sizeof go);
  if (replies () != NBD_REP_ACK)
    die ("NBD_OPT_GO refused");
  if (!read0 (1, first))
    die ("the first READ was not answered");
  printf ("READ before the KeyUpdate: answered\n");
  /* TLS 1.3 tickets come after the handshake, read with the first data. */
  printf ("session tickets received: %u\n", tickets);

  r = gnutls_session_key_update (s, GNUTLS_KU_PEER);
  if (r < 0) {
    fprintf (stderr, "tls_keyupdate: key update: %s\n", gnutls_strerror (r));
    return 1;
  }
  printf ("KeyUpdate sent\n");
  if (!read0 (2, second)) {
    printf ("the server ended the connection after the KeyUpdate\n");
    return 3;
  }
  if (memcmp (first, second, sizeof first) != 0)
    die ("the two READs of the same block differ");
  printf ("READ after the KeyUpdate: answered, the same bytes\n");
  gnutls_bye (s, GNUTLS_SHUT_RDWR);
  return 0;
}
