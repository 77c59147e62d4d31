/* SPDX-License-Identifier: BSD-3-Clause */
/* The NBD URI parser (src/cli/uri.c, compiled in alone): the examples of
 * the NBD project's doc/uri.md and libnbd's, each with the parts it must
 * give and its canonical form; then hostile and invalid URIs, each with
 * the words its refusal must contain, so that the message names what is
 * wrong.
 */
#include <config.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pdio.h"
#include "unit.h"

static const struct {
  const char *uri;
  bool tls, unix_socket;
  const char *host, *port, *export_name, *socket, *user;
  const char *canonical;
} good[] = {
  /* doc/uri.md's table of export names. */
  { "nbd://example.com/disk", false, false, "example.com", "10809", "disk",
    "", "", "nbd://example.com:10809/disk" },
  { "nbd+unix:///disk?socket=sock", false, true, "", "10809", "disk",
    "sock", "", "nbd+unix:///disk?socket=sock" },
  { "nbd://example.com/", false, false, "example.com", "10809", "", "", "",
    "nbd://example.com:10809/" },
  { "nbd://example.com", false, false, "example.com", "10809", "", "", "",
    "nbd://example.com:10809/" },
  { "nbd://example.com//disk", false, false, "example.com", "10809",
    "/disk", "", "", "nbd://example.com:10809//disk" },
  { "nbd://example.com/hello%20world", false, false, "example.com",
    "10809", "hello world", "", "", "nbd://example.com:10809/hello%20world" },
  /* Ports, case, IPv4 and IPv6, and what libnbd makes of no host. */
  { "nbd://storage1:10810/vm-disk", false, false, "storage1", "10810",
    "vm-disk", "", "", "nbd://storage1:10810/vm-disk" },
  { "NBD://Storage1.Example:/x", false, false, "storage1.example", "10809",
    "x", "", "", "nbd://storage1.example:10809/x" },
  { "nbd://192.0.2.7:1/", false, false, "192.0.2.7", "1", "", "", "",
    "nbd://192.0.2.7:1/" },
  { "nbd://[::1]:10809/e", false, false, "::1", "10809", "e", "", "",
    "nbd://[::1]:10809/e" },
  { "nbd://[2001:DB8:0:0::1]/", false, false, "2001:db8::1", "10809", "",
    "", "", "nbd://[2001:db8::1]:10809/" },
  { "nbd://[fe80::1%25eth0]:65535/", false, false, "fe80::1%eth0",
    "65535", "", "", "", "nbd://[fe80::1%25eth0]:65535/" },
  { "nbd:///", false, false, "localhost", "10809", "", "", "",
    "nbd://localhost:10809/" },
  /* Unix sockets; percent-decoding of every part. */
  { "nbd+unix:///?socket=/run/pdio/x.sock", false, true, "", "10809", "",
    "/run/pdio/x.sock", "", "nbd+unix:///?socket=/run/pdio/x.sock" },
  { "nbd+unix:/e?socket=/s", false, true, "", "10809", "e", "/s", "",
    "nbd+unix:///e?socket=/s" },
  { "nbd+unix:///a%2Fb%3Fc?socket=/tmp/my%20sock", false, true, "",
    "10809", "a/b?c", "/tmp/my sock", "",
    "nbd+unix:///a/b%3Fc?socket=/tmp/my%20sock" },
  { "nbd://h/caf%C3%A9", false, false, "h", "10809", "caf\xc3\xa9", "", "",
    "nbd://h:10809/caf%C3%A9" },
  { "nbd://h/e?x-client-thing=1", false, false, "h", "10809", "e", "", "",
    "nbd://h:10809/e" },
  /* TLS: parsed, left out of the canonical form. */
  { "nbds://alice@storage1/disk?tls-psk-file=/etc/keys", true, false,
    "storage1", "10809", "disk", "", "alice",
    "nbds://storage1:10809/disk" },
  { "nbds+unix:///d?socket=/s&tls-certificates=/c&tls-verify-peer=0", true,
    true, "", "10809", "d", "/s", "", "nbds+unix:///d?socket=/s" },
};

static const struct {
  const char *uri, *says;
} bad[] = {
  { "", "no scheme" },
  { "/var/lib/disk.img", "no scheme" },
  { "http://example.com/", "scheme \"http\"" },
  { "nbd+vsock://2/", "scheme \"nbd+vsock\"" },
  { "nbd:disk", "no \"//HOST\"" },
  { "nbd://h:0/", "port: 0" },
  { "nbd://h:65536/", "from 1 to 65535" },
  { "nbd://h:99999999999999999999/", "from 1 to 65535" },
  { "nbd://h:-1/", "not a number" },
  { "nbd://h:1x/", "not a number" },
  { "nbd://[::1/", "without its \"]\"" },
  { "nbd://[::1]x/", "after \"]\"" },
  { "nbd://[not-v6]/", "not an IPv6 address" },
  { "nbd://[fe80::1%eth0]/", "%25ZONE" },
  { "nbd://[fe80::1%25]/", "%25ZONE" },
  { "nbd://[fe80::1%25e/th]/", "without its" },
  { "nbd://a]b/", "only enclose an IPv6" },
  { "nbd://user:secret@h/", "password" },
  { "nbd://@h/", "user: empty" },
  { "nbd://h%2Fx/", "not a host name" },
  { "nbd://h%00/", "%00" },
  { "nbd://h/a%00b", "%00" },
  { "nbd://h/a%0ab", "control character 0x0a" },
  { "nbd://h/a%7fb", "control character 0x7f" },
  { "nbd://h/a%", "two hex digits" },
  { "nbd://h/a%4", "two hex digits" },
  { "nbd://h/a%zz", "two hex digits" },
  { "nbd://h/a b", "0x20 at offset 9" },
  { "nbd://h/a\nb", "0x0a" },
  { "nbd://h/caf\xc3\xa9", "0xc3" },
  { "nbd://h/a\"b", "\"\"\" at offset 9" },
  { "nbd://h/%C3%28", "not valid UTF-8" },
  { "nbd://h/%ED%A0%80", "not valid UTF-8" },
  { "nbd://h/%C0%AF", "not valid UTF-8" },
  { "nbd://h/%F4%90%80%80", "not valid UTF-8" },
  { "nbd://h/e#frag", "fragment" },
  { "nbd://h/e?socket=/s", "socket= is for nbd+unix" },
  { "nbd://h/e?tls-certificates=/c", "without TLS" },
  { "nbd://h/e?foo=1", "unknown parameter \"foo\"" },
  { "nbd://h/e?socket", "no \"=VALUE\"" },
  { "nbd://h/e?&", "empty parameter" },
  { "nbd://h/e?x-a=1&&x-b=2", "empty parameter" },
  { "nbd+unix:///e", "?socket=PATH is required" },
  { "nbd+unix:///e?socket=", "socket: empty" },
  { "nbd+unix:///e?socket=%00abstract", "%00" },
  { "nbd+unix://host/e?socket=/s", "take no host" },
  { "nbd+unix:///e?socket=/a&socket=/b", "given twice" },
  { "nbds://h/e?tls-verify-peer=maybe", "not 0 or 1" },
  { "nbds://h/e?tls-type=rot13", "not x509, psk or anon" },
  { "nbds://alice@h/e?tls-username=bob", "differs" },
};

/* A socket path longer than sun_path, an export past the protocol's 4096
 * bytes, a URI past NBD_URI_MAX, and a host past 255 bytes.
 */
static void
check_lengths (void)
{
  static char uri[NBD_URI_MAX + 64];
  struct nbd_uri u;
  char why[512];
  int n;

  n = snprintf (uri, sizeof uri, "nbd+unix:///?socket=/");
  memset (uri + n, 'a', 200);
  uri[n + 200] = '\0';
  CHECK (!nbd_uri_parse (uri, &u, why, sizeof why) &&
         strstr (why, "longer than a unix socket"), "long socket: %s", why);

  n = snprintf (uri, sizeof uri, "nbd://h/");
  memset (uri + n, 'e', 4096);
  uri[n + 4096] = '\0';
  CHECK (nbd_uri_parse (uri, &u, why, sizeof why) &&
         strlen (u.export_name) == 4096, "4096-byte export: %s", why);
  uri[n + 4096] = 'e';
  uri[n + 4097] = '\0';
  CHECK (!nbd_uri_parse (uri, &u, why, sizeof why) &&
         strstr (why, "longer than 4096 bytes"), "4097-byte export: %s", why);

  memset (uri + n, 'e', NBD_URI_MAX);
  uri[NBD_URI_MAX + 1] = '\0';
  CHECK (!nbd_uri_parse (uri, &u, why, sizeof why) &&
         strstr (why, "longer than 16384"), "long URI: %s", why);

  n = snprintf (uri, sizeof uri, "nbd://");
  memset (uri + n, 'h', 300);
  strcpy (uri + n + 300, "/e");
  CHECK (!nbd_uri_parse (uri, &u, why, sizeof why) &&
         strstr (why, "host: longer than 255"), "long host: %s", why);
}

int
main (void)
{
  struct nbd_uri u;
  char why[512], canon[NBD_URI_MAX];

  for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
    CHECK (nbd_uri_is (good[i].uri), "%s: not taken for a URI",
           good[i].uri);
    CHECK (nbd_uri_parse (good[i].uri, &u, why, sizeof why),
           "%s: refused: %s", good[i].uri, why);
    CHECK (u.tls == good[i].tls && u.unix_socket == good[i].unix_socket,
           "%s: tls %d unix %d", good[i].uri, u.tls, u.unix_socket);
    if (!u.unix_socket)
      CHECK (strcmp (u.host, good[i].host) == 0 &&
             strcmp (u.port, good[i].port) == 0,
             "%s: host \"%s\" port \"%s\"", good[i].uri, u.host, u.port);
    CHECK (strcmp (u.export_name, good[i].export_name) == 0,
           "%s: export \"%s\"", good[i].uri, u.export_name);
    CHECK (strcmp (u.socket, good[i].socket) == 0, "%s: socket \"%s\"",
           good[i].uri, u.socket);
    CHECK (strcmp (u.user, good[i].user) == 0, "%s: user \"%s\"",
           good[i].uri, u.user);
    CHECK (nbd_uri_canonical (&u, canon, sizeof canon) &&
           strcmp (canon, good[i].canonical) == 0,
           "%s: canonical %s, expected %s", good[i].uri, canon,
           good[i].canonical);
    /* The canonical form is a URI that means the same. */
    {
      struct nbd_uri v;
      char again[NBD_URI_MAX];

      CHECK (nbd_uri_parse (canon, &v, why, sizeof why) &&
             nbd_uri_canonical (&v, again, sizeof again) &&
             strcmp (again, canon) == 0, "%s: canonical form %s does not "
             "parse back to itself (%s)", good[i].uri, canon, why);
    }
  }
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    why[0] = '\0';
    CHECK (!nbd_uri_parse (bad[i].uri, &u, why, sizeof why),
           "\"%s\": accepted", bad[i].uri);
    CHECK (strstr (why, bad[i].says) != NULL &&
           strncmp (why, "not a usable NBD URI: ", 22) == 0,
           "\"%s\": the message \"%s\" does not say \"%s\"", bad[i].uri, why,
           bad[i].says);
  }
  check_lengths ();
  CHECK (!nbd_uri_is ("/dev/nbd0") && !nbd_uri_is ("nbd0") &&
         !nbd_uri_is ("./nbd:x"), "a path taken for a URI");
  printf ("%zu URIs parsed as expected, %zu refused with the right "
          "message\n", sizeof good / sizeof good[0],
          sizeof bad / sizeof bad[0]);
  return 0;
}
