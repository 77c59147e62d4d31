/* SPDX-License-Identifier: BSD-3-Clause */
/* JSON strings for pdio list --json.  What goes in one is a path or a
 * message, and a Linux path is any bytes but NUL: quotes, backslashes and
 * control characters are escaped; valid UTF-8 passes through; a byte that
 * is not part of valid UTF-8 becomes \udcXX, the lone surrogate Python's
 * os.fsdecode makes of it, so that the output is still valid JSON and the
 * exact bytes can be had back (json.loads, then os.fsencode).
 */
#include <config.h>

#include <stdio.h>

#include "pdio.h"

/* The length of the valid UTF-8 sequence at s (RFC 3629: no overlong
 * forms, no surrogates, nothing above U+10FFFF), or 0 if there is none.
 */
static int
utf8_length (const unsigned char *s)
{
  unsigned char c = s[0];
  unsigned char lo = 0x80, hi = 0xbf;
  int n;

  if (c >= 0xc2 && c <= 0xdf)
    n = 2;
  else if (c >= 0xe0 && c <= 0xef) {
    n = 3;
    if (c == 0xe0)
      lo = 0xa0;                /* overlong below U+0800 */
    else if (c == 0xed)
      hi = 0x9f;                /* U+D800..U+DFFF */
  }
  else if (c >= 0xf0 && c <= 0xf4) {
    n = 4;
    if (c == 0xf0)
      lo = 0x90;                /* overlong below U+10000 */
    else if (c == 0xf4)
      hi = 0x8f;                /* above U+10FFFF */
  }
  else
    return 0;
  /* The first continuation byte has the narrower range; a NUL ends the
   * string and fails every test here, so nothing is read past it.
   */
  if (s[1] < lo || s[1] > hi)
    return 0;
  for (int i = 2; i < n; i++)
    if (s[i] < 0x80 || s[i] > 0xbf)
      return 0;
  return n;
}

void
json_string (FILE *fp, const char *str)
{
  const unsigned char *s = (const unsigned char *) str;

  putc ('"', fp);
  while (*s) {
    unsigned char c = *s;
    int n;

    if (c == '"' || c == '\\') {
      fprintf (fp, "\\%c", c);
      s++;
    }
    else if (c < 0x20 || c == 0x7f) {
      /* DEL is valid JSON, but no terminal should get it raw. */
      fprintf (fp, "\\u%04x", c);
      s++;
    }
    else if (c < 0x80) {
      putc (c, fp);
      s++;
    }
    else if ((n = utf8_length (s)) > 0) {
      fwrite (s, 1, n, fp);
      s += n;
    }
    else {
      fprintf (fp, "\\udc%02x", c);
      s++;
    }
  }
  putc ('"', fp);
}
