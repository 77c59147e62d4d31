/* SPDX-License-Identifier: BSD-3-Clause */
/* pdio(1)'s waits (src/cli/wait.c, with spawn.c's pid_alive): each ends
 * when its event comes, well before its deadline, and each still fails at
 * its deadline when the event never comes.  The times printed are figures;
 * only "before the deadline" and "not before the deadline" are asserted.
 */
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/file.h>
#include <sys/inotify.h>
#include <sys/wait.h>
#include <unistd.h>

#include "pdio.h"
#include "unit.h"

#define DEADLINE_MS 3000
#define SHORT_MS 300

/* A child that sleeps ms, then runs fn, then exits. */
static pid_t
later (unsigned ms, void (*fn) (void *), void *arg)
{
  pid_t pid = fork ();

  CHECK (pid >= 0, "fork: %m");
  if (pid == 0) {
    msleep (ms);
    if (fn)
      fn (arg);
    _exit (0);
  }
  return pid;
}

static void
write_file (void *arg)
{
  int fd = open (arg, O_WRONLY | O_CREAT | O_TRUNC, 0644);

  if (fd < 0 || write (fd, "42\n", 3) != 3)
    _exit (1);
  close (fd);
}

static bool
has_content (void *arg)
{
  char buf[16];

  return read_line (arg, buf, sizeof buf) && buf[0];
}

static bool
flock_free (void *arg)
{
  return flock (*(int *) arg, LOCK_EX | LOCK_NB) == 0;
}

/* A process's exit, by its pidfd. */
static void
test_gone (void)
{
  pid_t pid = later (100, NULL, NULL);
  long t0 = now_ms (), dt;

  CHECK (wait_gone (pid, DEADLINE_MS), "a child exiting after 100 ms was "
         "not seen gone within %d ms", DEADLINE_MS);
  dt = now_ms () - t0;
  printf ("# wait_gone: exit after 100 ms seen after %ld ms\n", dt);
  CHECK (dt < DEADLINE_MS, "took %ld ms", dt);
  waitpid (pid, NULL, 0);

  pid = later (60000, NULL, NULL);
  t0 = now_ms ();
  CHECK (!wait_gone (pid, SHORT_MS), "a child that never exits was seen "
         "gone");
  dt = now_ms () - t0;
  printf ("# wait_gone: a process that never exits: false after %ld ms\n",
          dt);
  CHECK (dt >= SHORT_MS, "gave up after %ld ms, before its %d ms", dt,
         SHORT_MS);
  kill (pid, SIGKILL);
  waitpid (pid, NULL, 0);
  CHECK (wait_gone (pid, 0), "a reaped pid is not gone");
}

/* A file appearing, by inotify on its directory. */
static void
test_file (const char *dir)
{
  char path[PATH_MAX];
  pid_t pid;
  long t0, dt;
  int in;

  snprintf (path, sizeof path, "%s/pidfile", dir);
  unlink (path);
  in = inotify_on_dir (path, IN_CLOSE_WRITE | IN_MOVED_TO);
  CHECK (in >= 0, "inotify on %s: %m", dir);
  pid = later (100, write_file, path);
  t0 = now_ms ();
  CHECK (wait_until (in, has_content, path, deadline_in (DEADLINE_MS)),
         "a file written after 100 ms was not seen within %d ms",
         DEADLINE_MS);
  dt = now_ms () - t0;
  printf ("# wait_until (inotify): file written after 100 ms seen after "
          "%ld ms\n", dt);
  CHECK (dt < DEADLINE_MS, "took %ld ms", dt);
  waitpid (pid, NULL, 0);
  unlink (path);
  t0 = now_ms ();
  CHECK (!wait_until (in, has_content, path, deadline_in (SHORT_MS)),
         "a file never written was seen");
  dt = now_ms () - t0;
  printf ("# wait_until (inotify): a file never written: false after %ld "
          "ms\n", dt);
  CHECK (dt >= SHORT_MS, "gave up after %ld ms", dt);
  close (in);
}

/* An flock let go: the close event comes before the lock is released,
 * and the wait still sees the lock free.
 */
static void
test_flock (const char *dir)
{
  char path[PATH_MAX];
  int holder, fd, in;
  pid_t pid;
  long t0, dt;

  snprintf (path, sizeof path, "%s/lock", dir);
  holder = open (path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  CHECK (holder >= 0 && flock (holder, LOCK_EX) == 0, "flock: %m");
  fd = open (path, O_RDWR | O_CLOEXEC);
  in = inotify_on (path, IN_CLOSE_WRITE);
  CHECK (fd >= 0 && in >= 0, "%s: %m", path);
  /* The child holds the lock's file too; the parent lets go of it now,
   * the child when it exits.
   */
  pid = later (100, NULL, NULL);
  close (holder);
  t0 = now_ms ();
  CHECK (wait_until (in, flock_free, &fd, deadline_in (DEADLINE_MS)),
         "a lock let go after 100 ms was not seen free within %d ms",
         DEADLINE_MS);
  dt = now_ms () - t0;
  printf ("# wait_until (flock): lock let go after 100 ms taken after %ld "
          "ms\n", dt);
  waitpid (pid, NULL, 0);
  close (fd);
  close (in);
}

/* Nothing to watch: the fallback still ends at the condition. */
static bool
after_200 (void *arg)
{
  return now_ms () >= *(long *) arg;
}

static void
test_fallback (void)
{
  long at = now_ms () + 200;

  CHECK (wait_until (-1, after_200, &at, deadline_in (DEADLINE_MS)),
         "without a descriptor the condition was not seen");
  CHECK (!wait_until (-1, after_200, &(long) { now_ms () + 60000 },
                      deadline_in (SHORT_MS)), "a condition never true");
}

int
main (void)
{
  char dir[] = "/tmp/test_wait.XXXXXX";

  CHECK (mkdtemp (dir), "mkdtemp: %m");
  test_gone ();
  test_file (dir);
  test_flock (dir);
  test_fallback ();
  unlink (strcat (strcpy ((char[PATH_MAX]) { 0 }, dir), "/lock"));
  rmdir (dir);
  printf ("# all waits ended at their events and failed at their "
          "deadlines\n");
  return 0;
}
