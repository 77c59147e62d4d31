/* What pdio serve prints once it serves, with either server: the NBD URI
 * and the nbd-client command that attaches it by hand, with the block
 * size pdio attach chooses by default (the server's direct-I/O alignment,
 * within the kernel's limits).
 */
#include <config.h>

#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "pdio.h"

void
print_uri_and_attach (const char *socket, const char *bind,
                      const char *port, const char *tls, uint32_t dio_align,
                      bool readonly)
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
  /* The address served on; for a wildcard, this machine's name. */
  if (bind == NULL)
    snprintf (host, sizeof host, "localhost");
  else if (strcmp (bind, "::") && strcmp (bind, "0.0.0.0"))
    snprintf (host, sizeof host, "%s", bind);
  else if (gethostname (host, sizeof host) == -1)
    snprintf (host, sizeof host, "HOST");
  snprintf (uri_host, sizeof uri_host, strchr (host, ':') ? "[%s]" : "%s",
            host);
  /* With TLS the client needs its credentials too: see pdio(1). */
  printf ("uri: nbd%s://%s:%s/\n", tls ? "s" : "", uri_host, port);
  printf ("attach: nbd-client %s %s /dev/nbd0 -b %" PRIu32 " -C %d%s%s\n",
          host, port, bs, DEFAULT_CONNECTIONS, readonly ? " -readonly" : "",
          tls ? " -enable-tls" : "");
  if (tls)
    printf ("tls: %s\n", tls);
  fflush (stdout);
}
