/* SPDX-License-Identifier: BSD-3-Clause */
/* faultfs: a FUSE passthrough of one file that fails chosen requests.
 *
 *   faultfs BACKING MOUNTPOINT [FUSE OPTIONS, e.g. -f]
 *           [--direct-io-reply] [--async-dio] [--trace]
 *
 * The mount holds two files:
 *   image     BACKING's data: read, write, fsync/fdatasync, fallocate and
 *             lseek(SEEK_DATA/SEEK_HOLE) are passed through to it, unless a
 *             rule says otherwise.
 *   control   write rules to it (one per line, appended); read it for the
 *             counters and the faults that fired.
 *
 * Why FUSE and not an LD_PRELOAD shim: pdio does its I/O with io_uring,
 * which the kernel executes without calling libc, so a shim never sees it.
 * Every read, write, fsync and fallocate the kernel makes on a FUSE file
 * comes here, whatever the syscall or ring it came from.  pdio opens the
 * image with O_DIRECT; the kernel's FUSE then bypasses its page cache and
 * sends each transfer to us (with --direct-io-reply the open reply sets
 * FOPEN_DIRECT_IO too, so even buffered opens go straight through).
 *
 * FUSE's asynchronous direct I/O is switched off unless --async-dio is
 * given: with it, Linux (6.18) turns a short direct write into EIO and, for
 * io_uring, drops the fsync error of an RWF_DSYNC write from its completion
 * (it surfaces at the next fdatasync instead), so neither fault could be
 * injected faithfully.  inject.tap still runs its FUA and flush cases with
 * --async-dio: pdio must not rely on RWF_DSYNC's error on FUSE.  --trace logs every request and its fate to stderr.
 *
 * Rules:
 *   OP [off=X] [nth=N] [times=K] ACTION
 *   OP      read | write | fsync | fallocate
 *   off=X   only requests whose byte range contains X (not for fsync)
 *   nth=N   the Nth matching request is the first to fail (default 1)
 *   times=K that many matching requests fail in a row (default 1; 0 =
 *           every one from the Nth on)
 *   ACTION  eio | enospc          fail with that errno, touching nothing
 *           short=B               read/write only the first B bytes (B
 *                                 less than the request) and say so
 *   clear                         drops every rule
 *   reset                         drops every rule and the list of
 *                                 faults that fired
 * A malformed rule makes the write to control fail with EINVAL, so a test
 * cannot silently run with a rule that was never installed.
 *
 * Reading control gives, one per line:
 *   ops read=N write=N fsync=N fallocate=N
 *   rule I: RULE-TEXT seen=N fired=N
 *   fired OP off=X len=Y -> ACTION          (the last 256 faults since
 *                                            the last reset)
 * so a test can prove the fault it meant to inject did fire.
 */
#include <config.h>

#define FUSE_USE_VERSION 35
/* Debian installs the headers in /usr/include/fuse3; they include each
 * other with quotes, so naming the directory here is enough and the build
 * needs no pkg-config flags.
 */
#include <fuse3/fuse.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

enum op { OP_READ, OP_WRITE, OP_FSYNC, OP_FALLOCATE, NR_OPS };
static const char *const op_names[NR_OPS] =
  { "read", "write", "fsync", "fallocate" };

enum action { ACT_EIO, ACT_ENOSPC, ACT_SHORT };

#define MAX_RULES 64
#define MAX_FIRED 256

struct rule {
  enum op op;
  bool has_off;
  uint64_t off;
  uint64_t nth, times;
  enum action action;
  uint64_t short_len;
  uint64_t seen, fired;
  char text[128];
};

static struct {
  int fd;                       /* the backing file */
  const char *backing;
  bool direct_io_reply;
  bool async_dio;
  bool trace;                   /* log every request to stderr */
  pthread_mutex_t lock;         /* everything below */
  struct rule rules[MAX_RULES];
  unsigned nrules;
  uint64_t ops[NR_OPS];
  char fired[MAX_FIRED][96];
  unsigned nfired;              /* total; the last MAX_FIRED are kept */
} fs = { .fd = -1, .lock = PTHREAD_MUTEX_INITIALIZER };

/* What to do with one request: 0 pass it through, -errno fail it, or a
 * positive byte count to transfer instead of len (a short transfer).
 */
static int64_t
decide (enum op op, uint64_t off, uint64_t len)
{
  int64_t verdict = 0;
  bool fired = false;
  unsigned i;

  pthread_mutex_lock (&fs.lock);
  fs.ops[op]++;
  /* Every matching rule counts the request, so each rule's nth is
   * independent of the others; the first one that fires decides.
   */
  for (i = 0; i < fs.nrules; i++) {
    struct rule *r = &fs.rules[i];

    if (r->op != op)
      continue;
    if (r->has_off && op != OP_FSYNC && !(off <= r->off && r->off < off + len))
      continue;
    r->seen++;
    if (fired || r->seen < r->nth ||
        (r->times && r->seen >= r->nth + r->times))
      continue;
    if (r->action == ACT_SHORT && r->short_len >= len)
      continue;                 /* cannot be short: let it pass */
    fired = true;
    r->fired++;
    switch (r->action) {
    case ACT_EIO: verdict = -EIO; break;
    case ACT_ENOSPC: verdict = -ENOSPC; break;
    case ACT_SHORT: verdict = r->short_len; break;
    }
    snprintf (fs.fired[fs.nfired % MAX_FIRED], sizeof fs.fired[0],
              "fired %s off=%" PRIu64 " len=%" PRIu64 " -> %s", op_names[op],
              off, len, r->action == ACT_EIO ? "EIO"
              : r->action == ACT_ENOSPC ? "ENOSPC" : "short");
    fs.nfired++;
  }
  pthread_mutex_unlock (&fs.lock);
  if (fs.trace)
    fprintf (stderr, "faultfs: %s off=%" PRIu64 " len=%" PRIu64 " -> %s%"
             PRId64 "\n", op_names[op], off, len,
             verdict > 0 ? "short " : verdict < 0 ? "errno " : "pass ",
             verdict > 0 ? verdict : -verdict);
  return verdict;
}

static bool
parse_u64 (const char *s, uint64_t *v)
{
  char *end;

  errno = 0;
  *v = strtoull (s, &end, 0);
  return errno == 0 && end != s && *end == '\0';
}

/* Parses one rule line; false if it is malformed. */
static bool
parse_rule (char *line, struct rule *r)
{
  char *save, *w;
  bool have_action = false;
  int i;

  memset (r, 0, sizeof *r);
  r->nth = 1;
  r->times = 1;
  snprintf (r->text, sizeof r->text, "%s", line);
  w = strtok_r (line, " \t", &save);
  if (w == NULL)
    return false;
  for (i = 0; i < NR_OPS; i++)
    if (strcmp (w, op_names[i]) == 0)
      break;
  if (i == NR_OPS)
    return false;
  r->op = i;
  while ((w = strtok_r (NULL, " \t", &save)) != NULL) {
    if (strncmp (w, "off=", 4) == 0) {
      if (!parse_u64 (w + 4, &r->off))
        return false;
      r->has_off = true;
    }
    else if (strncmp (w, "nth=", 4) == 0) {
      if (!parse_u64 (w + 4, &r->nth) || r->nth == 0)
        return false;
    }
    else if (strncmp (w, "times=", 6) == 0) {
      if (!parse_u64 (w + 6, &r->times))
        return false;
    }
    else if (strcmp (w, "eio") == 0) {
      r->action = ACT_EIO;
      have_action = true;
    }
    else if (strcmp (w, "enospc") == 0) {
      r->action = ACT_ENOSPC;
      have_action = true;
    }
    else if (strncmp (w, "short=", 6) == 0) {
      if (!parse_u64 (w + 6, &r->short_len) || r->short_len == 0 ||
          (r->op != OP_READ && r->op != OP_WRITE))
        return false;
      r->action = ACT_SHORT;
      have_action = true;
    }
    else
      return false;
  }
  return have_action;
}

/* Applies the text written to control: rules, or "clear". */
static int
control_write (const char *buf, size_t size)
{
  char *text = strndup (buf, size), *save, *line;
  int r = 0;

  if (text == NULL)
    return -ENOMEM;
  pthread_mutex_lock (&fs.lock);
  for (line = strtok_r (text, "\n", &save); line;
       line = strtok_r (NULL, "\n", &save)) {
    if (line[strspn (line, " \t")] == '\0')
      continue;
    if (strcmp (line, "clear") == 0 || strcmp (line, "reset") == 0) {
      fs.nrules = 0;
      if (strcmp (line, "reset") == 0)
        fs.nfired = 0;
      continue;
    }
    if (fs.nrules == MAX_RULES ||
        !parse_rule (line, &fs.rules[fs.nrules])) {
      fprintf (stderr, "faultfs: bad rule: %s\n", line);
      r = -EINVAL;
      break;
    }
    fprintf (stderr, "faultfs: rule %u: %s\n", fs.nrules,
             fs.rules[fs.nrules].text);
    fs.nrules++;
  }
  pthread_mutex_unlock (&fs.lock);
  free (text);
  return r;
}

struct text {
  char *s;
  size_t len, cap;
};

static void __attribute__ ((format (printf, 2, 3)))
text_add (struct text *t, const char *fmt, ...)
{
  va_list args;
  int n;

  for (;;) {
    va_start (args, fmt);
    n = vsnprintf (t->s ? t->s + t->len : NULL, t->s ? t->cap - t->len : 0,
                   fmt, args);
    va_end (args);
    if (n < 0)
      return;
    if (t->s && t->len + n < t->cap) {
      t->len += n;
      return;
    }
    t->cap = (t->cap + n + 1) * 2;
    t->s = realloc (t->s, t->cap);
    if (t->s == NULL)
      abort ();
  }
}

/* A snapshot of the counters, taken when control is opened. */
static char *
control_status (void)
{
  struct text t = { 0 };
  unsigned i, first;

  pthread_mutex_lock (&fs.lock);
  text_add (&t, "ops read=%" PRIu64 " write=%" PRIu64 " fsync=%" PRIu64
            " fallocate=%" PRIu64 "\n", fs.ops[OP_READ], fs.ops[OP_WRITE],
            fs.ops[OP_FSYNC], fs.ops[OP_FALLOCATE]);
  for (i = 0; i < fs.nrules; i++)
    text_add (&t, "rule %u: %s seen=%" PRIu64 " fired=%" PRIu64 "\n", i,
              fs.rules[i].text, fs.rules[i].seen, fs.rules[i].fired);
  first = fs.nfired > MAX_FIRED ? fs.nfired - MAX_FIRED : 0;
  for (i = first; i < fs.nfired; i++)
    text_add (&t, "%s\n", fs.fired[i % MAX_FIRED]);
  pthread_mutex_unlock (&fs.lock);
  return t.s;
}

/* ---- the file system ---------------------------------------------------- */

enum node { N_NONE, N_ROOT, N_IMAGE, N_CONTROL };

static enum node
node_of (const char *path)
{
  if (strcmp (path, "/") == 0)
    return N_ROOT;
  if (strcmp (path, "/image") == 0)
    return N_IMAGE;
  if (strcmp (path, "/control") == 0)
    return N_CONTROL;
  return N_NONE;
}

static void *
ff_init (struct fuse_conn_info *conn, struct fuse_config *cfg)
{
  if (!fs.async_dio)
    conn->want &= ~FUSE_CAP_ASYNC_DIO;
  /* The backing file's size and allocation can change (fallocate): never
   * let the kernel answer from stale attributes.
   */
  cfg->attr_timeout = 0;
  cfg->entry_timeout = 0;
  cfg->negative_timeout = 0;
  return NULL;
}

static int
ff_getattr (const char *path, struct stat *st, struct fuse_file_info *fi)
{
  (void) fi;
  memset (st, 0, sizeof *st);
  switch (node_of (path)) {
  case N_ROOT:
    st->st_mode = S_IFDIR | 0755;
    st->st_nlink = 2;
    return 0;
  case N_IMAGE:
    if (fstat (fs.fd, st) == -1)
      return -errno;
    st->st_mode = S_IFREG | 0644;
    st->st_nlink = 1;
    return 0;
  case N_CONTROL:
    st->st_mode = S_IFREG | 0600;
    st->st_nlink = 1;
    return 0;
  default:
    return -ENOENT;
  }
}

static int
ff_readdir (const char *path, void *buf, fuse_fill_dir_t fill, off_t off,
            struct fuse_file_info *fi, enum fuse_readdir_flags flags)
{
  (void) off; (void) fi; (void) flags;
  if (node_of (path) != N_ROOT)
    return -ENOTDIR;
  fill (buf, ".", NULL, 0, 0);
  fill (buf, "..", NULL, 0, 0);
  fill (buf, "image", NULL, 0, 0);
  fill (buf, "control", NULL, 0, 0);
  return 0;
}

static int
ff_open (const char *path, struct fuse_file_info *fi)
{
  switch (node_of (path)) {
  case N_IMAGE:
    fi->direct_io = fs.direct_io_reply;
    fi->keep_cache = 0;
    return 0;
  case N_CONTROL:
    /* Every read comes here, never from a cache; a snapshot per open. */
    fi->direct_io = 1;
    fi->fh = (uintptr_t) control_status ();
    return 0;
  default:
    return -ENOENT;
  }
}

static int
ff_release (const char *path, struct fuse_file_info *fi)
{
  if (node_of (path) == N_CONTROL)
    free ((char *) (uintptr_t) fi->fh);
  return 0;
}

static int
ff_truncate (const char *path, off_t size, struct fuse_file_info *fi)
{
  (void) fi;
  switch (node_of (path)) {
  case N_CONTROL:
    return 0;                   /* "echo rule > control" opens O_TRUNC */
  case N_IMAGE:
    return ftruncate (fs.fd, size) == -1 ? -errno : 0;
  default:
    return -EACCES;
  }
}

static int
ff_read (const char *path, char *buf, size_t size, off_t off,
         struct fuse_file_info *fi)
{
  int64_t v;
  size_t done = 0;

  if (node_of (path) == N_CONTROL) {
    const char *s = (const char *) (uintptr_t) fi->fh;
    size_t len = s ? strlen (s) : 0;

    if ((size_t) off >= len)
      return 0;
    if (size > len - off)
      size = len - off;
    memcpy (buf, s + off, size);
    return size;
  }
  if (node_of (path) != N_IMAGE)
    return -ENOENT;
  v = decide (OP_READ, off, size);
  if (v < 0)
    return v;
  if (v > 0)
    size = v;
  while (done < size) {
    ssize_t r = pread (fs.fd, buf + done, size - done, off + done);
    if (r == -1 && errno == EINTR)
      continue;
    if (r == -1)
      return done ? (int) done : -errno;
    if (r == 0)
      break;
    done += r;
  }
  return done;
}

static int
ff_write (const char *path, const char *buf, size_t size, off_t off,
          struct fuse_file_info *fi)
{
  int64_t v;
  size_t done = 0;
  int r;

  (void) fi;
  if (node_of (path) == N_CONTROL) {
    r = control_write (buf, size);
    return r < 0 ? r : (int) size;
  }
  if (node_of (path) != N_IMAGE)
    return -ENOENT;
  v = decide (OP_WRITE, off, size);
  if (v < 0)
    return v;
  if (v > 0)
    size = v;
  while (done < size) {
    ssize_t w = pwrite (fs.fd, buf + done, size - done, off + done);
    if (w == -1 && errno == EINTR)
      continue;
    if (w == -1)
      return done ? (int) done : -errno;
    done += w;
  }
  return done;
}

static int
ff_fsync (const char *path, int datasync, struct fuse_file_info *fi)
{
  int64_t v;

  (void) fi;
  if (node_of (path) != N_IMAGE)
    return 0;
  v = decide (OP_FSYNC, 0, 0);
  if (v < 0)
    return v;
  if ((datasync ? fdatasync (fs.fd) : fsync (fs.fd)) == -1)
    return -errno;
  return 0;
}

static int
ff_fallocate (const char *path, int mode, off_t off, off_t len,
              struct fuse_file_info *fi)
{
  int64_t v;

  (void) fi;
  if (node_of (path) != N_IMAGE)
    return -EOPNOTSUPP;
  v = decide (OP_FALLOCATE, off, len);
  if (v < 0)
    return v;
  return fallocate (fs.fd, mode, off, len) == -1 ? -errno : 0;
}

static off_t
ff_lseek (const char *path, off_t off, int whence, struct fuse_file_info *fi)
{
  off_t r;

  (void) fi;
  if (node_of (path) != N_IMAGE)
    return -EINVAL;
  /* The fd's position is never used for I/O here (pread/pwrite only). */
  r = lseek (fs.fd, off, whence);
  return r == -1 ? -errno : r;
}

static int
ff_statfs (const char *path, struct statvfs *sv)
{
  (void) path;
  return fstatvfs (fs.fd, sv) == -1 ? -errno : 0;
}

static const struct fuse_operations ops = {
  .init = ff_init,
  .getattr = ff_getattr,
  .readdir = ff_readdir,
  .open = ff_open,
  .release = ff_release,
  .truncate = ff_truncate,
  .read = ff_read,
  .write = ff_write,
  .fsync = ff_fsync,
  .fallocate = ff_fallocate,
  .lseek = ff_lseek,
  .statfs = ff_statfs,
};

int
main (int argc, char *argv[])
{
  char **fargv;
  int i, fargc = 0;

  if (argc < 3) {
    fprintf (stderr, "usage: faultfs BACKING MOUNTPOINT [FUSE OPTIONS] "
             "[--direct-io-reply]\n");
    return 2;
  }
  fs.backing = argv[1];
  fs.fd = open (fs.backing, O_RDWR | O_CLOEXEC);
  if (fs.fd == -1) {
    perror (fs.backing);
    return 1;
  }
  fargv = calloc (argc + 1, sizeof *fargv);
  if (fargv == NULL)
    return 1;
  fargv[fargc++] = argv[0];
  for (i = 2; i < argc; i++) {
    if (strcmp (argv[i], "--direct-io-reply") == 0)
      fs.direct_io_reply = true;
    else if (strcmp (argv[i], "--async-dio") == 0)
      fs.async_dio = true;
    else if (strcmp (argv[i], "--trace") == 0)
      fs.trace = true;
    else
      fargv[fargc++] = argv[i];
  }
  return fuse_main (fargc, fargv, &ops, NULL);
}
