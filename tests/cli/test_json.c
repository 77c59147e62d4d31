/* SPDX-License-Identifier: BSD-3-Clause */
/* json_string (src/cli/json.c), which pdio list --json writes every path
 * and message with: each case is a string and the exact JSON it must
 * become.  Paths are bytes: quotes, backslashes, controls, DEL, valid
 * UTF-8 of every length, and bytes that are not UTF-8 (stray
 * continuations, overlong forms, encoded surrogates, code points above
 * U+10FFFF, sequences cut short by the end of the string).
 */
#include <config.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pdio.h"
#include "unit.h"

static const struct {
  const char *in, *out;
} cases[] = {
  { "", "\"\"" },
  { "/var/lib/images/a.img", "\"/var/lib/images/a.img\"" },
  { "a\"b", "\"a\\\"b\"" },
  { "a\\b", "\"a\\\\b\"" },
  { "\\\"", "\"\\\\\\\"\"" },
  { "\x01\t\n\r\x1f", "\"\\u0001\\u0009\\u000a\\u000d\\u001f\"" },
  { "del\x7f", "\"del\\u007f\"" },
  { "/ ~", "\"/ ~\"" },
  /* Valid UTF-8, 2, 3 and 4 bytes, and the ends of each range. */
  { "caf\xc3\xa9", "\"caf\xc3\xa9\"" },
  { "\xc2\x80", "\"\xc2\x80\"" },
  { "\xe2\x82\xac", "\"\xe2\x82\xac\"" },
  { "\xe0\xa0\x80", "\"\xe0\xa0\x80\"" },
  { "\xed\x9f\xbf", "\"\xed\x9f\xbf\"" },             /* U+D7FF */
  { "\xee\x80\x80", "\"\xee\x80\x80\"" },             /* U+E000 */
  { "\xef\xbf\xbf", "\"\xef\xbf\xbf\"" },             /* U+FFFF */
  { "\xf0\x9f\x98\x80", "\"\xf0\x9f\x98\x80\"" },
  { "\xf4\x8f\xbf\xbf", "\"\xf4\x8f\xbf\xbf\"" },     /* U+10FFFF */
  /* Not UTF-8: each byte that starts no valid sequence is \udcXX. */
  { "\xff", "\"\\udcff\"" },
  { "a\x80z", "\"a\\udc80z\"" },
  { "\xc0\xaf", "\"\\udcc0\\udcaf\"" },               /* overlong '/' */
  { "\xc1\xbf", "\"\\udcc1\\udcbf\"" },
  { "\xe0\x9f\xbf", "\"\\udce0\\udc9f\\udcbf\"" },    /* overlong */
  { "\xed\xa0\x80", "\"\\udced\\udca0\\udc80\"" },    /* U+D800 */
  { "\xf0\x8f\xbf\xbf", "\"\\udcf0\\udc8f\\udcbf\\udcbf\"" },
  { "\xf4\x90\x80\x80", "\"\\udcf4\\udc90\\udc80\\udc80\"" }, /* > U+10FFFF */
  { "\xf5\x80\x80\x80", "\"\\udcf5\\udc80\\udc80\\udc80\"" },
  { "\xc3", "\"\\udcc3\"" },                          /* cut short */
  { "\xe2\x82", "\"\\udce2\\udc82\"" },
  { "\xf0\x9f\x98", "\"\\udcf0\\udc9f\\udc98\"" },
  { "\xe2\x82x", "\"\\udce2\\udc82x\"" },
  { "\xc3\xa9\xff\xc3\xa9", "\"\xc3\xa9\\udcff\xc3\xa9\"" },
};

int
main (void)
{
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char *buf = NULL;
    size_t len = 0;
    FILE *fp = open_memstream (&buf, &len);

    CHECK (fp != NULL, "open_memstream");
    json_string (fp, cases[i].in);
    CHECK (fclose (fp) == 0, "fclose");
    CHECK (strcmp (buf, cases[i].out) == 0,
           "case %zu: got %s, expected %s", i, buf, cases[i].out);
    free (buf);
  }
  printf ("%zu strings written as expected\n",
          sizeof cases / sizeof cases[0]);
  return 0;
}
