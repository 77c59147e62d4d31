/* SPDX-License-Identifier: BSD-3-Clause */
/* One attachment per image.  The image is known by its identity, not its
 * path: a hard link, a bind mount or a second path to the same file is
 * the same image, and so is every node of one block device.  Its claim
 * is a write lock on RUNDIR/NAME.claim, taken with fcntl (F_SETLK) rather
 * than flock because F_GETLK names the process that holds it: attach's
 * child, which stays as the device's supervisor and holds it as long as
 * it lives, or a detach tearing the attachment down.  A lock goes with
 * its process, so no claim outlives its holder, and the loser of a race
 * learns who won and, once it is known, on which device.
 *
 * The file says what its holder is doing ("attaching", "attached
 * /dev/nbdN", "detaching /dev/nbdN").  Its holder removes it when the
 * attachment ends; whoever locks a file that has just been removed under
 * it finds out (the path no longer leads to what it locked) and tries
 * again on the new one.
 */
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "pdio.h"

void
identity_name (bool blk, dev_t dev, unsigned long long ino, char *name,
               size_t len)
{
  if (blk)
    snprintf (name, len, "blk-%u-%u", major (dev), minor (dev));
  else
    snprintf (name, len, "img-%llx-%llu", (unsigned long long) dev, ino);
}

bool
image_name (const char *image, char *name, size_t len)
{
  struct stat st;

  if (stat (image, &st) == -1)
    return false;
  if (S_ISBLK (st.st_mode))
    identity_name (true, st.st_rdev, 0, name, len);
  else
    identity_name (false, st.st_dev, st.st_ino, name, len);
  return true;
}

static void
claim_path (const char *name, char *buf, size_t len)
{
  state_path (name, "claim", buf, len);
}

/* Who holds the lock on fd's file, and what the file says they do. */
static void
read_holder (int fd, struct claim_holder *h)
{
  struct flock fl = { .l_type = F_WRLCK, .l_whence = SEEK_SET };
  char buf[64] = "";
  ssize_t n;

  memset (h, 0, sizeof *h);
  if (fcntl (fd, F_GETLK, &fl) == 0 && fl.l_type != F_UNLCK)
    h->pid = fl.l_pid;
  n = pread (fd, buf, sizeof buf - 1, 0);
  buf[n > 0 ? n : 0] = '\0';
  /* Half written ("" or a word alone) reads as still attaching. */
  if (sscanf (buf, "%15s %31s", h->doing, h->device) < 1)
    snprintf (h->doing, sizeof h->doing, "attaching");
}

/* fd is still the file at path: its holder did not remove it before we
 * locked it.
 */
static bool
still_there (int fd, const char *path)
{
  struct stat a, b;

  return fstat (fd, &a) == 0 && stat (path, &b) == 0 &&
    a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

struct waiting {
  int fd;
  struct claim_holder *h;
  bool locked;
};

/* fd locked, or its holder done attaching.  A holder gone between the two
 * calls (no pid) is tried again at once.
 */
static bool
settled (void *arg)
{
  struct waiting *w = arg;

  for (;;) {
    struct flock fl = { .l_type = F_WRLCK, .l_whence = SEEK_SET };

    if (fcntl (w->fd, F_SETLK, &fl) == 0)
      return w->locked = true;
    read_holder (w->fd, w->h);
    if (w->h->pid != 0)
      return strcmp (w->h->doing, "attached") == 0;
  }
}

/* Waits until end for the holder of the claim open at fd to let go (it
 * closes the file or exits: a close event, its locks already released)
 * or to note that it is attached (a write): true once fd holds the lock.
 */
static bool
outwait (int fd, const char *path, long end, struct claim_holder *h)
{
  struct waiting w = { .fd = fd, .h = h };
  int in = inotify_on (path, IN_MODIFY | IN_CLOSE_WRITE | IN_ATTRIB);

  wait_until (in, settled, &w, end);
  if (in >= 0)
    close (in);
  return w.locked;
}

int
claim_take (const char *name, const char *doing, unsigned wait_ms,
            struct claim_holder *h)
{
  char path[PATH_MAX];
  long end = deadline_in (wait_ms);

  claim_path (name, path, sizeof path);
  if (!make_rundir ("pdio")) {
    memset (h, 0, sizeof *h);
    return -1;
  }
  for (;;) {
    struct flock fl = { .l_type = F_WRLCK, .l_whence = SEEK_SET };
    int fd = open (path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);

    if (fd == -1) {
      errorf ("pdio: %s: %m", path);
      memset (h, 0, sizeof *h);
      return -1;
    }
    if (!test_break ("attach-no-lock") && fcntl (fd, F_SETLK, &fl) == -1) {
      if (errno != EAGAIN && errno != EACCES) {
        errorf ("pdio: %s: cannot lock it: %m", path);
        close (fd);
        memset (h, 0, sizeof *h);
        return -1;
      }
      if (!outwait (fd, path, end, h)) {
        close (fd);
        return -1;
      }
    }
    if (still_there (fd, path)) {
      claim_note (fd, doing, NULL);
      return fd;
    }
    close (fd);
  }
}

bool
claim_held (const char *name, struct claim_holder *h)
{
  char path[PATH_MAX];
  int fd;

  memset (h, 0, sizeof *h);
  claim_path (name, path, sizeof path);
  fd = open (path, O_RDONLY | O_CLOEXEC);
  if (fd == -1)
    return false;
  read_holder (fd, h);
  close (fd);
  return h->pid != 0;
}

void
claim_note (int fd, const char *doing, const char *device)
{
  char buf[64];
  int n = snprintf (buf, sizeof buf, "%s %s\n", doing, device ? device : "");

  /* Readers take a short or empty file for "attaching". */
  if (ftruncate (fd, 0) == -1 || pwrite (fd, buf, n, 0) != n)
    warnf ("pdio: warning: cannot note the image's claim: %m");
}

void
claim_drop (int fd, const char *name)
{
  char path[PATH_MAX];

  if (fd < 0)
    return;
  claim_path (name, path, sizeof path);
  unlink (path);
  close (fd);
}
