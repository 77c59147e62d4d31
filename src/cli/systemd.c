/* SPDX-License-Identifier: BSD-3-Clause */
/* The three calls placement.c makes to systemd's manager: make a slice,
 * make a scope around a running process, set a unit's MemoryMin.
 *
 * Over the manager's private socket, /run/systemd/private (root only),
 * as systemctl does as root: the system bus is not up yet when fstab's
 * mounts run at boot, and busctl(1) cannot speak to the private socket
 * (it always says Hello to a bus daemon first).  A forked child opens
 * libsystemd (dlopen) and makes the call with sd-bus, then exits: pdio
 * does not link libsystemd, and the supervisor's memory never holds it.
 * The child runs like any program pdio starts, without the supervisor's
 * protections (unprotect_child).
 */
#include <config.h>

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "pdio.h"

#define LIBSYSTEMD "libsystemd.so.0"
#define PRIVATE_SOCKET "unix:path=/run/systemd/private"

/* sd-bus, as <systemd/sd-bus.h> declares it (that header is not needed
 * to build pdio).
 */
typedef struct sd_bus sd_bus;
typedef struct sd_bus_message sd_bus_message;
typedef struct {
  const char *name;
  const char *message;
  int need_free;
} sd_bus_error;

struct sdbus {
  int (*bus_new) (sd_bus **bus);
  int (*set_address) (sd_bus *bus, const char *address);
  int (*start) (sd_bus *bus);
  int (*new_method_call) (sd_bus *bus, sd_bus_message **m,
                          const char *destination, const char *path,
                          const char *interface, const char *member);
  int (*append) (sd_bus_message *m, const char *types, ...);
  int (*call) (sd_bus *bus, sd_bus_message *m, uint64_t usec,
               sd_bus_error *error, sd_bus_message **reply);
};

enum what { MAKE_SLICE, MAKE_SCOPE, SET_MEMORY_MIN };
struct call {
  enum what what;
  const char *unit, *slice, *description;
  pid_t pid;
  uint64_t bytes;
};

bool
systemd_runs (void)
{
  struct stat st;

  /* sd_booted(3)'s test. */
  return lstat ("/run/systemd/system", &st) == 0 && S_ISDIR (st.st_mode);
}

static bool
resolve (void *lib, struct sdbus *b, char *why, size_t len)
{
  static const char *const names[] = {
    "sd_bus_new", "sd_bus_set_address", "sd_bus_start",
    "sd_bus_message_new_method_call", "sd_bus_message_append",
    "sd_bus_call",
  };
  void **slots[] = {
    (void **) &b->bus_new, (void **) &b->set_address, (void **) &b->start,
    (void **) &b->new_method_call, (void **) &b->append, (void **) &b->call,
  };

  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    /* POSIX's way to take a function from dlsym. */
    if ((*slots[i] = dlsym (lib, names[i])) == NULL) {
      snprintf (why, len, "%s: no %s", LIBSYSTEMD, names[i]);
      return false;
    }
  return true;
}

/* The arguments, in sd-bus's append notation: an array is its count, then
 * its elements; a variant its signature, then its value.
 */
static int
append_args (const struct sdbus *b, sd_bus_message *m, const struct call *c)
{
  int r;

  switch (c->what) {
  case MAKE_SLICE:
    r = b->append (m, "ss", c->unit, "fail");
    if (r >= 0)
      r = b->append (m, "a(sv)", 2, "Description", "s", c->description,
                     "DefaultDependencies", "b", 0);
    break;
  case MAKE_SCOPE:
    r = b->append (m, "ss", c->unit, "fail");
    if (r >= 0)
      r = b->append (m, "a(sv)", 5, "Description", "s", c->description,
                     "Slice", "s", c->slice,
                     "PIDs", "au", 1, (uint32_t) c->pid,
                     "MemoryMin", "t", c->bytes,
                     "DefaultDependencies", "b", 0);
    break;
  default:
    r = b->append (m, "sb", c->unit, 1);
    if (r >= 0)
      r = b->append (m, "a(sv)", 1, "MemoryMin", "t", c->bytes);
    return r;
  }
  /* StartTransientUnit's auxiliary units: none. */
  return r < 0 ? r : b->append (m, "a(sa(sv))", 0);
}

/* In the child: the call, and systemd's answer in why. */
static bool
call_in_child (const struct call *c, char *why, size_t len)
{
  sd_bus_error error = { NULL, NULL, 0 };
  sd_bus_message *m = NULL;
  sd_bus *bus = NULL;
  struct sdbus b;
  void *lib;
  int r;

  lib = dlopen (LIBSYSTEMD, RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL) {
    snprintf (why, len, "%s", dlerror ());
    return false;
  }
  if (!resolve (lib, &b, why, len))
    return false;
  r = b.bus_new (&bus);
  if (r >= 0)
    r = b.set_address (bus, PRIVATE_SOCKET);
  if (r >= 0)
    r = b.start (bus);
  if (r < 0) {
    snprintf (why, len, "systemd's private socket: %s", strerror (-r));
    return false;
  }
  r = b.new_method_call (bus, &m, "org.freedesktop.systemd1",
                         "/org/freedesktop/systemd1",
                         "org.freedesktop.systemd1.Manager",
                         c->what == SET_MEMORY_MIN ? "SetUnitProperties"
                                                   : "StartTransientUnit");
  if (r >= 0)
    r = append_args (&b, m, c);
  if (r < 0) {
    snprintf (why, len, "cannot make the message: %s", strerror (-r));
    return false;
  }
  /* sd-bus's default timeout (25 s). */
  r = b.call (bus, m, 0, &error, NULL);
  if (r < 0) {
    snprintf (why, len, "%s", error.message ? error.message : strerror (-r));
    return false;
  }
  return true;
}

/* Forks the child, waits; false with what it said in why. */
static bool
call (const struct call *c, char *why, size_t len)
{
  int p[2], status;
  ssize_t n;
  pid_t pid;

  if (pipe2 (p, O_CLOEXEC) == -1) {
    snprintf (why, len, "pipe: %m");
    return false;
  }
  fflush (NULL);
  pid = fork ();
  if (pid == -1) {
    snprintf (why, len, "fork: %m");
    close (p[0]);
    close (p[1]);
    return false;
  }
  if (pid == 0) {
    char msg[256] = "";
    bool ok;

    close (p[0]);
    unprotect_child ();
    ok = call_in_child (c, msg, sizeof msg);
    if (!ok && write (p[1], msg, strlen (msg)) == -1)
      ok = false;
    _exit (ok ? 0 : 1);
  }
  close (p[1]);
  n = read (p[0], why, len - 1);
  why[n > 0 ? n : 0] = '\0';
  close (p[0]);
  while (waitpid (pid, &status, 0) == -1)
    if (errno != EINTR) {
      snprintf (why, len, "waitpid: %m");
      return false;
    }
  if (WIFEXITED (status) && WEXITSTATUS (status) == 0)
    return true;
  if (why[0] == '\0')
    snprintf (why, len, "the process that calls systemd ended with wait "
              "status %#x", status);
  return false;
}

bool
systemd_make_slice (const char *slice, const char *description, char *why,
                    size_t len)
{
  const struct call c = {
    .what = MAKE_SLICE, .unit = slice, .description = description,
  };

  return call (&c, why, len);
}

bool
systemd_make_scope (const char *scope, const char *slice,
                    const char *description, pid_t pid, uint64_t memory_min,
                    char *why, size_t len)
{
  const struct call c = {
    .what = MAKE_SCOPE, .unit = scope, .slice = slice,
    .description = description, .pid = pid, .bytes = memory_min,
  };

  return call (&c, why, len);
}

bool
systemd_set_memory_min (const char *unit, uint64_t bytes, char *why,
                        size_t len)
{
  const struct call c = { .what = SET_MEMORY_MIN, .unit = unit,
                          .bytes = bytes };

  return call (&c, why, len);
}
