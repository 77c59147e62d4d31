/* SPDX-License-Identifier: BSD-3-Clause */
/* Messages, number parsing and the few environment settings. */
#include <config.h>

#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "pdio.h"

/* Every message names the command and the thing that is wrong:
 * "pdio attach: /img: No such file or directory".  Callers pass the whole
 * text; this only ends the line.
 */
static void __attribute__ ((format (printf, 1, 0)))
vsay (const char *fmt, va_list ap)
{
  vfprintf (stderr, fmt, ap);
  fputc ('\n', stderr);
}

void
errorf (const char *fmt, ...)
{
  va_list ap;

  va_start (ap, fmt);
  vsay (fmt, ap);
  va_end (ap);
}

/* The same today; separate so that a quiet mode could drop warnings. */
void
warnf (const char *fmt, ...)
{
  va_list ap;

  va_start (ap, fmt);
  vsay (fmt, ap);
  va_end (ap);
}

bool
parse_uint (const char *s, unsigned long min, unsigned long max,
            unsigned long *out)
{
  char *end;
  unsigned long v;

  if (s == NULL || *s < '0' || *s > '9')
    return false;
  errno = 0;
  v = strtoul (s, &end, 10);
  if (errno || *end || v < min || v > max)
    return false;
  *out = v;
  return true;
}

bool
parse_size (const char *s, uint64_t *out)
{
  static const char units[] = "KMGTP";
  const char *u;
  char *end;
  uint64_t v;
  unsigned shift = 0;

  if (s == NULL || *s < '0' || *s > '9')
    return false;
  errno = 0;
  v = strtoull (s, &end, 10);
  if (errno)
    return false;
  if (*end) {
    u = strchr (units, toupper ((unsigned char) *end));
    if (u == NULL || *u == '\0')
      return false;
    shift = 10 * (u - units + 1);
    end++;
    if (strcmp (end, "iB") != 0 && *end != '\0')
      return false;
  }
  if (shift && v > (UINT64_MAX >> shift))
    return false;
  *out = v << shift;
  return true;
}

static const char *
env_or (const char *name, const char *dflt)
{
  const char *v = getenv (name);

  return v && *v ? v : dflt;
}

const char *
rundir (void)
{
  return env_or ("PDIO_RUNDIR", "/run/pdio");
}

bool
make_rundir (const char *cmd)
{
  const char *dir = rundir ();
  struct stat st;

  if (mkdir (dir, 0700) == -1 && errno != EEXIST) {
    errorf ("%s: %s: %m", cmd, dir);
    return false;
  }
  /* One made by an older pdio, or by mkdir -p under a loose umask, is
   * tightened: whoever can reach a socket in it can write the image.
   */
  if (lstat (dir, &st) == -1) {
    errorf ("%s: %s: %m", cmd, dir);
    return false;
  }
  if (!S_ISDIR (st.st_mode) || st.st_uid != geteuid ()) {
    errorf ("%s: %s: not a directory owned by this user: refusing to keep "
            "sockets there", cmd, dir);
    return false;
  }
  if ((st.st_mode & 07777) != 0700 && chmod (dir, 0700) == -1) {
    errorf ("%s: %s: cannot make it 0700: %m", cmd, dir);
    return false;
  }
  return true;
}

const char *
sysfs (void)
{
  const char *fake = test_sysfs ();

  return fake ? fake : "/sys";
}

const char *
plugin_name (const char *option)
{
  return option ? option : env_or ("PDIO_PLUGIN", "pdio");
}

bool
need_root (const char *cmd)
{
  if (geteuid () == 0)
    return true;
  errorf ("%s: must be run as root (it attaches and detaches kernel block "
          "devices)", cmd);
  return false;
}

bool
read_line (const char *path, char *buf, size_t len)
{
  FILE *fp = fopen (path, "re");
  bool ok;

  if (fp == NULL)
    return false;
  ok = fgets (buf, len, fp) != NULL;
  fclose (fp);
  if (ok)
    buf[strcspn (buf, "\n")] = '\0';
  return ok;
}

void
msleep (unsigned ms)
{
  struct timespec ts = { .tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L };

  while (nanosleep (&ts, &ts) == -1 && errno == EINTR)
    ;
}

const char *
one_operand (const char *cmd, int argc, char **argv, const char *what,
             void (*usage) (FILE *))
{
  if (optind == argc - 1)
    return argv[optind];
  if (optind == argc)
    errorf ("%s: no %s given", cmd, what);
  else
    errorf ("%s: only one %s, please", cmd, what);
  usage (stderr);
  return NULL;
}
