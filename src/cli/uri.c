/* SPDX-License-Identifier: BSD-3-Clause */
/* NBD URIs (the NBD project's doc/uri.md, on RFC 3986), as libnbd and
 * qemu read them: nbd://[USER@]HOST[:PORT]/EXPORT, nbds://...,
 * nbd+unix:///EXPORT?socket=PATH, nbds+unix:///EXPORT?socket=PATH.
 *
 * pdio attach takes a URI from a command line or an fstab line, and its
 * parts go on to getaddrinfo, a unix socket's path, the record's
 * "key=value" lines and NBD_OPT_GO: so anything that is not a URI is
 * refused, with where it goes wrong, rather than guessed at.  Where the
 * specification leaves it to the client, this follows libnbd: an empty
 * host is localhost, the export is the path without its first "/",
 * percent-decoded.  Where libnbd is lenient (unknown query parameters,
 * raw spaces), this refuses, as the specification recommends.
 *
 * Pure: no system call but inet_pton; the fuzzer and the unit test
 * compile it alone.
 */
#include <config.h>

#include <arpa/inet.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "pdio.h"

/* RFC 3986 section 2.3 (unreserved) and 2.2 (sub-delims). */
static bool
unreserved (unsigned char c)
{
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
    (c >= '0' && c <= '9') || c == '-' || c == '.' || c == '_' || c == '~';
}

static bool
sub_delim (unsigned char c)
{
  return c && strchr ("!$&'()*+,;=", c) != NULL;
}

static int
hexval (unsigned char c)
{
  if (c >= '0' && c <= '9')
    return c - '0';
  if (c >= 'a' && c <= 'f')
    return c - 'a' + 10;
  if (c >= 'A' && c <= 'F')
    return c - 'A' + 10;
  return -1;
}

/* One well-formed UTF-8 sequence at s (at most n bytes): its length, or
 * 0.  Overlong forms, surrogates and code points past U+10FFFF are not
 * UTF-8 (the NBD protocol's strings are).
 */
static size_t
utf8_len (const unsigned char *s, size_t n)
{
  unsigned c = s[0], need, min, cp;

  if (c < 0x80)
    return 1;
  if (c >= 0xc2 && c <= 0xdf)
    need = 1, min = 0x80, cp = c & 0x1f;
  else if (c >= 0xe0 && c <= 0xef)
    need = 2, min = 0x800, cp = c & 0x0f;
  else if (c >= 0xf0 && c <= 0xf4)
    need = 3, min = 0x10000, cp = c & 0x07;
  else
    return 0;
  if (n < need + 1)
    return 0;
  for (unsigned i = 1; i <= need; i++) {
    if ((s[i] & 0xc0) != 0x80)
      return 0;
    cp = cp << 6 | (s[i] & 0x3f);
  }
  if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
    return 0;
  return need + 1;
}

struct parse {
  const char *uri;
  char *why;
  size_t len;
};

static bool __attribute__ ((format (printf, 2, 3)))
refuse (struct parse *p, const char *fmt, ...)
{
  va_list ap;
  int n = snprintf (p->why, p->len, "not a usable NBD URI: ");

  va_start (ap, fmt);
  if (n > 0 && (size_t) n < p->len)
    vsnprintf (p->why + n, p->len - n, fmt, ap);
  va_end (ap);
  return false;
}

/* Decodes the n bytes at s (one component of the URI, every byte already
 * checked to be one RFC 3986 allows there) into out[size]: each %XX
 * becomes its byte.  what names the component in messages.  Refuses a
 * bad escape, a NUL, a control character and anything that is not UTF-8
 * once decoded, and a result that does not fit.
 */
static bool
decode (struct parse *p, const char *what, const char *s, size_t n,
        char *out, size_t size)
{
  size_t o = 0;

  for (size_t i = 0; i < n; i++) {
    unsigned char c = s[i];

    if (c == '%') {
      int hi = i + 1 < n ? hexval (s[i + 1]) : -1;
      int lo = i + 2 < n ? hexval (s[i + 2]) : -1;

      if (hi < 0 || lo < 0)
        return refuse (p, "%s: \"%%\" must be followed by two hex digits",
                       what);
      c = hi << 4 | lo;
      i += 2;
      if (c == 0)
        return refuse (p, "%s: contains %%00 (a NUL byte)", what);
    }
    if (c < 0x20 || c == 0x7f)
      return refuse (p, "%s: contains the control character %#04x", what,
                     c);
    if (o + 1 >= size)
      return refuse (p, "%s: longer than %zu bytes once decoded", what,
                     size - 1);
    out[o++] = c;
  }
  out[o] = '\0';
  for (size_t i = 0, k; i < o; i += k)
    if ((k = utf8_len ((const unsigned char *) out + i, o - i)) == 0)
      return refuse (p, "%s: not valid UTF-8 once decoded (byte %zu)", what,
                     i);
  return true;
}

/* Every byte of s[0..n) may appear in a component whose extra allowed
 * characters (beyond unreserved, sub-delims and %) are extra.
 */
static bool
check_chars (struct parse *p, const char *what, const char *s, size_t n,
             const char *extra)
{
  for (size_t i = 0; i < n; i++) {
    unsigned char c = s[i];

    if (unreserved (c) || sub_delim (c) || c == '%' ||
        (c && strchr (extra, c)))
      continue;
    if (c <= 0x20 || c >= 0x7f)
      return refuse (p, "%s: byte %#04x at offset %zu must be percent-"
                     "encoded", what, c, (size_t) (s - p->uri) + i);
    return refuse (p, "%s: \"%c\" at offset %zu must be percent-encoded",
                   what, c, (size_t) (s - p->uri) + i);
  }
  return true;
}

/* [IPv6] (RFC 3986's IP-literal, RFC 6874's zone as %25ZONE), a dotted
 * IPv4 address or a host name, into u->host (brackets taken off, the zone
 * as getaddrinfo wants it: fe80::1%eth0).
 */
static bool
parse_host (struct parse *p, const char *s, size_t n, struct nbd_uri *u)
{
  unsigned char addr[16];

  if (n && s[0] == '[') {
    const char *zone;
    size_t alen;
    char a[INET6_ADDRSTRLEN + 1];

    if (s[n - 1] != ']')
      return refuse (p, "host: \"[\" without its \"]\"");
    s++, n -= 2;
    zone = memchr (s, '%', n);
    alen = zone ? (size_t) (zone - s) : n;
    if (alen == 0 || alen >= sizeof a)
      return refuse (p, "host: [%.*s] is not an IPv6 address", (int) n, s);
    memcpy (a, s, alen);
    a[alen] = '\0';
    if (inet_pton (AF_INET6, a, addr) != 1)
      return refuse (p, "host: [%.*s] is not an IPv6 address", (int) n, s);
    /* One spelling per address, for the canonical form. */
    inet_ntop (AF_INET6, addr, a, sizeof a);
    if (zone) {
      size_t zlen = n - alen;

      if (zlen < 4 || strncmp (zone, "%25", 3) != 0)
        return refuse (p, "host: an IPv6 zone is written %%25ZONE "
                       "(RFC 6874)");
      for (size_t i = 3; i < zlen; i++)
        if (!unreserved (zone[i]))
          return refuse (p, "host: the IPv6 zone may only hold letters, "
                         "digits and \"-._~\"");
      if (alen + zlen - 2 >= sizeof u->host)
        return refuse (p, "host: too long");
      snprintf (u->host, sizeof u->host, "%s%%%.*s", a, (int) (zlen - 3),
                zone + 3);
    }
    else
      snprintf (u->host, sizeof u->host, "%s", a);
    return true;
  }
  if (memchr (s, '[', n) || memchr (s, ']', n))
    return refuse (p, "host: \"[\" and \"]\" only enclose an IPv6 address");
  if (!check_chars (p, "host", s, n, ""))
    return false;
  if (!decode (p, "host", s, n, u->host, sizeof u->host))
    return false;
  /* A name for the resolver: letters, digits, "-", "." and "_" (DNS and
   * /etc/hosts), which an IPv4 address is too.
   */
  for (const char *h = u->host; *h; h++)
    if (!((*h >= 'a' && *h <= 'z') || (*h >= 'A' && *h <= 'Z') ||
          (*h >= '0' && *h <= '9') || *h == '-' || *h == '.' || *h == '_'))
      return refuse (p, "host: \"%s\" is not a host name or address",
                     u->host);
  if (u->host[0] == '\0')
    snprintf (u->host, sizeof u->host, "localhost");
  for (char *h = u->host; *h; h++)
    if (*h >= 'A' && *h <= 'Z')
      *h += 'a' - 'A';
  return true;
}

static bool
parse_port (struct parse *p, const char *s, size_t n, struct nbd_uri *u)
{
  unsigned long v = 0;

  if (n == 0)
    return true;                /* "host:" is the default port (RFC 3986) */
  for (size_t i = 0; i < n; i++) {
    if (s[i] < '0' || s[i] > '9')
      return refuse (p, "port: \"%.*s\" is not a number", (int) n, s);
    v = v * 10 + (s[i] - '0');
    if (v > 65535)
      return refuse (p, "port: %.*s is not from 1 to 65535", (int) n, s);
  }
  if (v == 0)
    return refuse (p, "port: 0 is not a port to connect to");
  snprintf (u->port, sizeof u->port, "%lu", v);
  return true;
}

/* //[USERINFO@]HOST[:PORT] -- s[0..n) is what follows "//". */
static bool
parse_authority (struct parse *p, const char *s, size_t n,
                 struct nbd_uri *u)
{
  const char *at = memrchr (s, '@', n), *hostp, *colon = NULL;
  size_t hlen;

  if (at) {
    size_t ulen = at - s;

    if (memchr (s, ':', ulen))
      return refuse (p, "a password in the URI is not supported (use "
                     "tls-psk-file=)");
    if (!check_chars (p, "user", s, ulen, "") ||
        !decode (p, "user", s, ulen, u->user, sizeof u->user))
      return false;
    if (u->user[0] == '\0')
      return refuse (p, "user: empty before \"@\"");
    hostp = at + 1;
  }
  else
    hostp = s;
  hlen = s + n - hostp;
  if (hlen && hostp[0] == '[') {
    const char *close = memchr (hostp, ']', hlen);

    if (close == NULL)
      return refuse (p, "host: \"[\" without its \"]\"");
    if (close + 1 < hostp + hlen) {
      if (close[1] != ':')
        return refuse (p, "host: \"%c\" after \"]\" (a port is \":PORT\")",
                       close[1]);
      colon = close + 1;
    }
  }
  else
    colon = memchr (hostp, ':', hlen);
  if (!parse_host (p, hostp, colon ? (size_t) (colon - hostp) : hlen, u))
    return false;
  return colon == NULL ||
    parse_port (p, colon + 1, hostp + hlen - colon - 1, u);
}

/* One key=value of the query.  Unknown keys are refused (the
 * specification: "SHOULD be diagnosed"), but for x-* ones, which are
 * experiments of other clients.
 */
static bool
parse_param (struct parse *p, const char *s, size_t n, struct nbd_uri *u,
             unsigned *seen)
{
  static const char *const keys[] = {
    "socket", "tls-certificates", "tls-psk-file", "tls-hostname",
    "tls-verify-peer", "tls-type", "tls-username",
  };
  char key[64], value[PATH_MAX];
  const char *eq = memchr (s, '=', n);
  size_t klen = eq ? (size_t) (eq - s) : n, k;

  if (!decode (p, "query", s, klen, key, sizeof key))
    return false;
  if (eq == NULL)
    return refuse (p, "query: \"%s\" has no \"=VALUE\"", key);
  if (!decode (p, key, eq + 1, s + n - eq - 1, value, sizeof value))
    return false;
  for (k = 0; k < sizeof keys / sizeof keys[0]; k++)
    if (strcmp (key, keys[k]) == 0)
      break;
  if (k == sizeof keys / sizeof keys[0]) {
    if (strncmp (key, "x-", 2) == 0)
      return true;
    return refuse (p, "query: unknown parameter \"%s\"", key);
  }
  if (*seen & 1u << k)
    return refuse (p, "query: %s given twice", key);
  *seen |= 1u << k;
  switch (k) {
  case 0:
    if (value[0] == '\0')
      return refuse (p, "socket: empty");
    if (strlen (value) >= sizeof u->socket)
      return refuse (p, "socket: longer than a unix socket's %zu bytes",
                     sizeof u->socket - 1);
    snprintf (u->socket, sizeof u->socket, "%s", value);
    break;
  case 1:
    snprintf (u->tls_certificates, sizeof u->tls_certificates, "%s", value);
    break;
  case 2:
    snprintf (u->tls_psk_file, sizeof u->tls_psk_file, "%s", value);
    break;
  case 3:
    if (strlen (value) >= sizeof u->tls_hostname)
      return refuse (p, "tls-hostname: too long");
    snprintf (u->tls_hostname, sizeof u->tls_hostname, "%s", value);
    break;
  case 4:
    if (strcmp (value, "1") == 0 || strcasecmp (value, "true") == 0)
      u->tls_verify_peer = 1;
    else if (strcmp (value, "0") == 0 || strcasecmp (value, "false") == 0)
      u->tls_verify_peer = 0;
    else
      return refuse (p, "tls-verify-peer: \"%s\" is not 0 or 1", value);
    break;
  case 5:
    if (strcmp (value, "x509") && strcmp (value, "psk") &&
        strcmp (value, "anon"))
      return refuse (p, "tls-type: \"%s\" is not x509, psk or anon", value);
    snprintf (u->tls_type, sizeof u->tls_type, "%s", value);
    break;
  case 6:
    if (strlen (value) >= sizeof u->user)
      return refuse (p, "tls-username: too long");
    if (u->user[0] && strcmp (u->user, value) != 0)
      return refuse (p, "tls-username: \"%s\" differs from the user "
                     "\"%s\" before \"@\"", value, u->user);
    snprintf (u->user, sizeof u->user, "%s", value);
    break;
  }
  return true;
}

static const struct {
  const char *name;
  bool tls, unix_socket;
} schemes[] = {
  { "nbd", false, false },
  { "nbds", true, false },
  { "nbd+unix", false, true },
  { "nbds+unix", true, true },
};

bool
nbd_uri_is (const char *s)
{
  for (size_t i = 0; i < sizeof schemes / sizeof schemes[0]; i++) {
    size_t n = strlen (schemes[i].name);

    if (strncasecmp (s, schemes[i].name, n) == 0 && s[n] == ':')
      return true;
  }
  return false;
}

bool
nbd_uri_parse (const char *uri, struct nbd_uri *u, char *why, size_t len)
{
  struct parse p = { .uri = uri, .why = why, .len = len };
  const char *colon = strchr (uri, ':'), *s, *end, *path, *query, *hash;
  size_t n = strlen (uri), i, plen;
  unsigned seen = 0;

  *u = (struct nbd_uri) { .tls_verify_peer = -1 };
  snprintf (u->port, sizeof u->port, "%s", NBD_URI_DEFAULT_PORT);
  if (n > NBD_URI_MAX)
    return refuse (&p, "longer than %d bytes", NBD_URI_MAX);
  if (colon == NULL)
    return refuse (&p, "no scheme (nbd://, nbds://, nbd+unix://, "
                   "nbds+unix://)");
  for (i = 0; i < sizeof schemes / sizeof schemes[0]; i++)
    if ((size_t) (colon - uri) == strlen (schemes[i].name) &&
        strncasecmp (uri, schemes[i].name, colon - uri) == 0)
      break;
  if (i == sizeof schemes / sizeof schemes[0])
    return refuse (&p, "scheme \"%.*s\" is none of nbd, nbds, nbd+unix, "
                   "nbds+unix", (int) (colon - uri > 32 ? 32 : colon - uri),
                   uri);
  u->tls = schemes[i].tls;
  u->unix_socket = schemes[i].unix_socket;
  s = colon + 1;
  end = uri + n;

  hash = strchr (s, '#');
  if (hash)
    return refuse (&p, "a fragment (\"#...\") has no meaning in an NBD "
                   "URI; an export name with \"#\" is written %%23");
  query = strchr (s, '?');
  if (query == NULL)
    query = end;

  /* hier-part: "//" authority path-abempty, or a path without one. */
  if (query - s >= 2 && s[0] == '/' && s[1] == '/') {
    const char *a = s + 2, *slash = memchr (a, '/', query - a);
    const char *aend = slash ? slash : query;

    if (u->unix_socket) {
      if (aend != a)
        return refuse (&p, "%s: URIs take no host (\"%.*s\"): the socket "
                       "is ?socket=PATH", schemes[i].name,
                       (int) (aend - a), a);
    }
    else if (!parse_authority (&p, a, aend - a, u))
      return false;
    path = aend;
  }
  else {
    if (!u->unix_socket)
      return refuse (&p, "%s: no \"//HOST\" after \"%s:\"", schemes[i].name,
                     schemes[i].name);
    path = s;
  }
  plen = query - path;
  if (plen && path[0] != '/')
    return refuse (&p, "the export must follow a \"/\"");
  if (!check_chars (&p, "export", path, plen, ":@/") ||
      !decode (&p, "export", plen ? path + 1 : path, plen ? plen - 1 : 0,
               u->export_name, sizeof u->export_name))
    return false;

  if (query < end) {
    const char *q = query + 1;

    if (!check_chars (&p, "query", q, end - q, ":@/?"))
      return false;
    while (q < end) {
      const char *amp = memchr (q, '&', end - q);
      const char *pend = amp ? amp : end;

      if (pend == q)
        return refuse (&p, "query: an empty parameter (\"&&\" or a "
                       "trailing \"&\")");
      if (!parse_param (&p, q, pend - q, u, &seen))
        return false;
      q = amp ? amp + 1 : end;
    }
  }
  if (u->unix_socket && u->socket[0] == '\0')
    return refuse (&p, "%s: ?socket=PATH is required", schemes[i].name);
  if (!u->unix_socket && u->socket[0])
    return refuse (&p, "socket= is for nbd+unix:// and nbds+unix:// URIs");
  if (!u->tls && (u->tls_certificates[0] || u->tls_psk_file[0] ||
                  u->tls_type[0] || u->tls_hostname[0]))
    return refuse (&p, "TLS parameters in a URI without TLS (use nbds:// "
                   "or nbds+unix://)");
  return true;
}

/* Percent-encodes s into out[size] for the canonical form: unreserved
 * bytes as they are, and those in keep.
 */
static size_t
encode (const char *s, const char *keep, char *out, size_t size)
{
  static const char hex[] = "0123456789ABCDEF";
  size_t o = 0;

  for (; *s; s++) {
    unsigned char c = *s;

    if (unreserved (c) || (c && strchr (keep, c))) {
      if (o + 1 < size)
        out[o++] = c;
    }
    else if (o + 3 < size) {
      out[o++] = '%';
      out[o++] = hex[c >> 4];
      out[o++] = hex[c & 15];
    }
  }
  if (size)
    out[o < size ? o : size - 1] = '\0';
  return o;
}

bool
nbd_uri_canonical (const struct nbd_uri *u, char *buf, size_t len)
{
  char ex[3 * sizeof u->export_name], sock[3 * sizeof u->socket];
  int n;

  encode (u->export_name, "/:@!$'()*+,;=", ex, sizeof ex);
  if (u->unix_socket) {
    encode (u->socket, "/:@!$'()*+,;=", sock, sizeof sock);
    n = snprintf (buf, len, "%s:///%s?socket=%s",
                  u->tls ? "nbds+unix" : "nbd+unix", ex, sock);
  }
  else {
    const char *zone = strchr (u->host, '%');

    if (strchr (u->host, ':'))
      n = snprintf (buf, len, "%s://[%.*s%s%s]:%s/%s", u->tls ? "nbds" : "nbd",
                    (int) (zone ? zone - u->host : (int) strlen (u->host)),
                    u->host, zone ? "%25" : "", zone ? zone + 1 : "",
                    u->port, ex);
    else
      n = snprintf (buf, len, "%s://%s:%s/%s", u->tls ? "nbds" : "nbd",
                    u->host, u->port, ex);
  }
  return n > 0 && (size_t) n < len;
}
