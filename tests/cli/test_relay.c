/* SPDX-License-Identifier: BSD-3-Clause */
/* The client side of nbds:// without a kernel: negotiate.c's STARTTLS
 * and NBD_OPT_GO with tls_client.c's credentials, then relay.c's loop,
 * which here carries the bytes of a libnbd client instead of the nbd
 * driver's.
 *
 *   test_relay URI            the handshake only: prints the export's
 *                             size, or the error, and exits 0 or 1
 *   test_relay URI SOCKET     then listens on the unix SOCKET, greets one
 *                             client in oldstyle NBD (the transmission
 *                             phase the kernel is given, without options:
 *                             libnbd reads it), and relays for it until
 *                             either side ends
 */
#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "pdio.h"
#include "proto.h"
#include "byteorder.h"

static int
listen_unix (const char *path)
{
  struct sockaddr_un sa = { .sun_family = AF_UNIX };
  int fd = socket (AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

  snprintf (sa.sun_path, sizeof sa.sun_path, "%s", path);
  unlink (path);
  if (fd == -1 || bind (fd, (struct sockaddr *) &sa, sizeof sa) == -1 ||
      listen (fd, 1) == -1) {
    fprintf (stderr, "test_relay: %s: %m\n", path);
    exit (2);
  }
  return fd;
}

int
main (int argc, char **argv)
{
  struct nbd_uri u;
  struct nbd_offer o;
  struct tls_client *t = NULL;
  char why[2048], desc[128] = "plain";
  uint8_t hello[152] = "NBDMAGIC";
  int fd, lfd, cfd, pipefd[2], r;

  if (argc < 2 || argc > 3) {
    fprintf (stderr, "usage: test_relay URI [SOCKET]\n");
    return 2;
  }
  if (!nbd_uri_parse (argv[1], &u, why, sizeof why)) {
    fprintf (stderr, "test_relay: %s\n", why);
    return 2;
  }
  fd = nbd_handshake_uri (&u, 5000, &o, &t, why, sizeof why);
  if (fd == -1) {
    printf ("error: %s\n", why);
    return 1;
  }
  if (t) {
    tls_client_describe (t, desc, sizeof desc);
    if (!tls_client_idle (t)) {
      printf ("error: GnuTLS holds data after NBD_OPT_GO\n");
      return 1;
    }
  }
  printf ("size %" PRIu64 ", flags %#x, %s\n", o.size, o.eflags, desc);
  fflush (stdout);
  if (argc == 2 || t == NULL)
    return 0;

  lfd = listen_unix (argv[2]);
  printf ("listening\n");
  fflush (stdout);
  cfd = accept4 (lfd, NULL, NULL, SOCK_CLOEXEC);
  if (cfd == -1) {
    perror ("accept");
    return 2;
  }
  /* Oldstyle: magic, 0x00420281861253, size, 32-bit flags, 124 zeroes. */
  nbd_put64 (hello + 8, 0x00420281861253ULL);
  nbd_put64 (hello + 16, o.size);
  nbd_put32 (hello + 24, o.eflags);
  if (write (cfd, hello, sizeof hello) != sizeof hello) {
    perror ("write");
    return 2;
  }
  if (pipe (pipefd) == -1) {
    perror ("pipe");
    return 2;
  }
  r = relay_run (t, cfd, pipefd[0]);
  printf ("relay ended: %s\n", r ? strerror (-r) : "ok");
  tls_client_free (t);
  close (fd);
  return r ? 1 : 0;
}
