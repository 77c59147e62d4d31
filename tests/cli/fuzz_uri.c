/* SPDX-License-Identifier: BSD-3-Clause */
/* libFuzzer over the NBD URI parser (src/cli/uri.c).  Any bytes: the
 * parser must not read or write out of bounds (ASan), and what it
 * accepts must hold together:
 *  - every part is a string, with no control character in the export,
 *    the host or the socket (they go to getaddrinfo, connect and the
 *    record's lines);
 *  - a unix URI has a socket and no host; a TCP one a host and a port
 *    from 1 to 65535;
 *  - the canonical form parses back to the same parts and to itself.
 */
#include <config.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "pdio.h"

int LLVMFuzzerTestOneInput (const uint8_t *data, size_t size);

static void
no_controls (const char *s)
{
  for (; *s; s++)
    if ((unsigned char) *s < 0x20 || *s == 0x7f)
      abort ();
}

int
LLVMFuzzerTestOneInput (const uint8_t *data, size_t size)
{
  static struct nbd_uri u, v;
  static char canon[NBD_URI_MAX], again[NBD_URI_MAX];
  char why[512];
  char *s = malloc (size + 1);

  if (s == NULL)
    return 0;
  memcpy (s, data, size);
  s[size] = '\0';
  if (nbd_uri_parse (s, &u, why, sizeof why)) {
    if (!nbd_uri_is (s))
      abort ();
    no_controls (u.export_name);
    no_controls (u.host);
    no_controls (u.socket);
    no_controls (u.user);
    if (u.unix_socket) {
      if (u.socket[0] == '\0')
        abort ();
    }
    else {
      unsigned long port = strtoul (u.port, NULL, 10);

      if (u.host[0] == '\0' || u.socket[0] || port < 1 || port > 65535)
        abort ();
    }
    if (nbd_uri_canonical (&u, canon, sizeof canon)) {
      if (!nbd_uri_parse (canon, &v, why, sizeof why) ||
          !nbd_uri_canonical (&v, again, sizeof again) ||
          strcmp (canon, again) != 0 || u.tls != v.tls ||
          u.unix_socket != v.unix_socket ||
          strcmp (u.export_name, v.export_name) != 0 ||
          strcmp (u.socket, v.socket) != 0 ||
          (!u.unix_socket && (strcmp (u.host, v.host) != 0 ||
                              strcmp (u.port, v.port) != 0)))
        abort ();
    }
  }
  else if (why[0] == '\0' || strlen (why) >= sizeof why)
    abort ();
  free (s);
  return 0;
}
