/* SPDX-License-Identifier: BSD-3-Clause */
/* What pdio serve prints once it serves, with either server: the NBD URI
 * and the nbd-client command that attaches it by hand, with the block
 * size pdio attach chooses by default (the server's direct-I/O alignment,
 * within the kernel's limits).  With TLS both carry what the client must
 * bring, as placeholders for its own paths: CLIENTDIR, the directory of
 * its ca-cert.pem, client-cert.pem and client-key.pem; or IDENTITY and
 * KEYS, its PSK identity and key file.
 */
#include <config.h>

#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "pdio.h"

void
print_uri_and_attach (const char *socket, const char *bind,
                      const char *port, const struct pdio_tls_config *tls,
                      uint32_t dio_align, bool readonly)
{
  uint32_t bs = dio_align < MIN_BLOCK_SIZE ? MIN_BLOCK_SIZE : dio_align;
  char host[256] = "HOST", uri_host[260];

  if (bs > MAX_BLOCK_SIZE)
    bs = MAX_BLOCK_SIZE;
  if (socket) {
    printf ("uri: nbd+unix:///?socket=%s\n", socket);
    printf ("attach: nbd-client -unix %s /dev/nbd0 -b %" PRIu32 " -C %d%s\n",
            socket, bs, DEFAULT_CONNECTIONS, readonly ? " -readonly" : "");
    fflush (stdout);
    return;
  }
  if (tls && tls->mode == PDIO_TLS_OFF)
    tls = NULL;
  /* The address served on; for a wildcard, this machine's name. */
  if (bind == NULL)
    snprintf (host, sizeof host, "localhost");
  else if (strcmp (bind, "::") && strcmp (bind, "0.0.0.0"))
    snprintf (host, sizeof host, "%s", bind);
  else if (gethostname (host, sizeof host) == -1)
    snprintf (host, sizeof host, "HOST");
  snprintf (uri_host, sizeof uri_host, strchr (host, ':') ? "[%s]" : "%s",
            host);
  if (tls == NULL) {
    printf ("uri: nbd://%s:%s/\n", uri_host, port);
    printf ("attach: nbd-client %s %s /dev/nbd0 -b %" PRIu32 " -C %d%s\n",
            host, port, bs, DEFAULT_CONNECTIONS, readonly ? " -readonly" : "");
  }
  else if (tls->certificates) {
    /* Without -cacertfile nbd-client would not check the server at all;
     * the client's certificate is asked for only with --tls-verify-peer.
     */
    printf ("uri: nbds://%s:%s/?tls-certificates=CLIENTDIR\n", uri_host,
            port);
    printf ("attach: nbd-client %s %s /dev/nbd0 -b %" PRIu32 " -C %d%s "
            "-enable-tls -cacertfile CLIENTDIR/ca-cert.pem%s\n",
            host, port, bs, DEFAULT_CONNECTIONS, readonly ? " -readonly" : "",
            tls->verify_peer ? " -certfile CLIENTDIR/client-cert.pem "
            "-keyfile CLIENTDIR/client-key.pem" : "");
    printf ("tls: x509, certificates in %s; CLIENTDIR: the client's "
            "directory of ca-cert.pem%s%s\n", tls->certificates,
            tls->verify_peer ? ", client-cert.pem and client-key.pem"
            : " (the CA that signed server-cert.pem)",
            tls->mode == PDIO_TLS_ON ? "; plain clients served too" : "");
  }
  else {
    /* nbd-client (3.24) speaks x509 only; libnbd and qemu speak PSK. */
    printf ("uri: nbds://IDENTITY@%s:%s/?tls-psk-file=KEYS\n", uri_host,
            port);
    if (tls->mode == PDIO_TLS_ON)
      printf ("attach: nbd-client %s %s /dev/nbd0 -b %" PRIu32 " -C %d%s "
              "(in plain text: nbd-client has x509 only)\n", host, port, bs,
              DEFAULT_CONNECTIONS, readonly ? " -readonly" : "");
    else
      printf ("attach: none with PSK: nbd-client has x509 only "
              "(--tls-certificates)\n");
    printf ("tls: PSK, keys in %s; IDENTITY: the client's name in it, "
            "KEYS: the client's file with that line\n", tls->psk_file);
  }
  fflush (stdout);
}
