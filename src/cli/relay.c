/* SPDX-License-Identifier: BSD-3-Clause */
/* The relay of an nbds:// device where kTLS cannot be had (no tls module,
 * a cipher the kernel does not offer): the kernel's nbd driver gets one
 * end of a socketpair, and the supervisor moves bytes between the other
 * end and the TLS session, in one thread of its own running one poll
 * loop for both directions -- not a thread, or a process, per direction
 * or per byte, as nbd-client's proxy has.
 *
 * Each direction has one buffer, filled from one side and drained into
 * the other; a full buffer stops reading from its source, so a stalled
 * peer stalls its sender instead of growing memory: what the relay holds
 * is bounded by its two buffers and GnuTLS's records.  GnuTLS may hold
 * decrypted bytes the socket no longer shows (a record read whole), so
 * receiving is tried each round whatever poll said.
 *
 * When either side ends or fails, the relay shuts down both: the kernel
 * then sees its socket end, which it reports as a dead link, and the
 * supervisor reconnects (link.c) as for a plain one.
 */
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "pdio.h"

/* Per direction: a kernel request of up to 32 MiB passes in pieces; this
 * is enough to keep a fast link busy between two polls.
 */
#define RELAY_BUF (256 * 1024)
/* At most a TLS record's worth of plaintext per send. */
#define RECORD_PLAIN 16384

struct relay {
  struct tls_client *t;
  int local;                    /* our end of the socketpair */
  int stop[2];
  pthread_t thread;
  bool running;
};

struct dir {
  uint8_t *buf;
  size_t len, off;
};

static void
nonblocking (int fd)
{
  fcntl (fd, F_SETFL, fcntl (fd, F_GETFL) | O_NONBLOCK);
}

/* Moves what can be moved without waiting: up is the kernel's requests
 * to the server, down its replies.  1 if anything moved, 0 if not, else
 * -errno of the end (-ECONNRESET for an orderly end of either side).
 */
static int
step (struct tls_client *t, int local, struct dir *up, struct dir *down,
      bool *send_blocked)
{
  int moved = 0;
  ssize_t r;

  if (up->off == up->len) {
    r = read (local, up->buf, RELAY_BUF);
    if (r == 0)
      return -ECONNRESET;
    if (r > 0) {
      up->len = r;
      up->off = 0;
      moved = 1;
      /* The end of a large chunk is a write's data, seldom a header. */
      if (test_break ("relay-flip") && r > 4096)
        up->buf[r - 1] ^= 1;
    }
    else if (errno != EAGAIN && errno != EINTR)
      return -errno;
  }
  if (up->off < up->len) {
    size_t n = up->len - up->off;

    /* After -EAGAIN GnuTLS must be given the same bytes again: it is. */
    r = tls_client_send_some (t, up->buf + up->off,
                              n < RECORD_PLAIN ? n : RECORD_PLAIN);
    *send_blocked = r == -EAGAIN;
    if (r > 0) {
      up->off += r;
      moved = 1;
    }
    else if (r != -EAGAIN)
      return r;
  }
  if (down->off == down->len) {
    r = tls_client_recv_some (t, down->buf, RELAY_BUF);
    if (r == 0)
      return -ECONNRESET;
    if (r > 0) {
      down->len = r;
      down->off = 0;
      moved = 1;
    }
    else if (r != -EAGAIN)
      return r;
  }
  if (down->off < down->len) {
    r = send (local, down->buf + down->off, down->len - down->off,
              MSG_NOSIGNAL);
    if (r > 0) {
      down->off += r;
      moved = 1;
    }
    else if (r == -1 && errno != EAGAIN && errno != EINTR)
      return -errno;
  }
  return moved;
}

int
relay_run (struct tls_client *t, int local, int stop_fd)
{
  int tcp = tls_client_fd (t), r;
  struct dir up = { .buf = malloc (RELAY_BUF) };
  struct dir down = { .buf = malloc (RELAY_BUF) };
  bool send_blocked = false;

  if (up.buf == NULL || down.buf == NULL) {
    r = -ENOMEM;
    goto out;
  }
  nonblocking (tcp);
  nonblocking (local);
  for (;;) {
    struct pollfd p[3];

    while ((r = step (t, local, &up, &down, &send_blocked)) > 0)
      ;
    if (r < 0)
      break;
    if (tls_client_pending (t) && down.off == down.len)
      continue;
    p[0] = (struct pollfd) { .fd = local,
      .events = (up.off == up.len ? POLLIN : 0) |
                (down.off < down.len ? POLLOUT : 0) };
    p[1] = (struct pollfd) { .fd = tcp,
      .events = (down.off == down.len ? POLLIN : 0) |
                (send_blocked ? POLLOUT : 0) };
    p[2] = (struct pollfd) { .fd = stop_fd, .events = POLLIN };
    if (poll (p, 3, -1) == -1 && errno != EINTR) {
      r = -errno;
      break;
    }
    if (p[2].revents) {
      r = 0;
      break;
    }
    /* An error or hang-up on either socket: the next step reads it. */
  }
 out:
  shutdown (local, SHUT_RDWR);
  shutdown (tcp, SHUT_RDWR);
  free (up.buf);
  free (down.buf);
  return r == -ECONNRESET ? 0 : r;
}

static void *
relay_thread (void *arg)
{
  struct relay *rl = arg;
  int r = relay_run (rl->t, rl->local, rl->stop[0]);
  char stamp[32];
  time_t now = time (NULL);

  strftime (stamp, sizeof stamp, "%F %T", localtime (&now));
  fprintf (stderr, "%s pdio-supervise[%d]: TLS relay ended%s%s\n", stamp,
           (int) getpid (), r ? ": " : "", r ? strerror (-r) : "");
  return NULL;
}

struct relay *
relay_start (struct tls_client *t, int *kernel_fd, char *why, size_t len)
{
  struct relay *rl = calloc (1, sizeof *rl);
  sigset_t all, old;
  int sp[2], r;

  if (rl == NULL) {
    snprintf (why, len, "calloc: %m");
    return NULL;
  }
  if (socketpair (AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp) == -1) {
    snprintf (why, len, "socketpair: %m");
    free (rl);
    return NULL;
  }
  if (pipe2 (rl->stop, O_CLOEXEC) == -1) {
    snprintf (why, len, "pipe: %m");
    close (sp[0]);
    close (sp[1]);
    free (rl);
    return NULL;
  }
  rl->t = t;
  rl->local = sp[1];
  /* The supervisor takes its signals from a signalfd in its main thread:
   * the relay's thread must not be where one lands.
   */
  sigfillset (&all);
  pthread_sigmask (SIG_SETMASK, &all, &old);
  r = pthread_create (&rl->thread, NULL, relay_thread, rl);
  pthread_sigmask (SIG_SETMASK, &old, NULL);
  if (r != 0) {
    snprintf (why, len, "cannot start the TLS relay's thread: %s",
              strerror (r));
    close (sp[0]);
    close (sp[1]);
    close (rl->stop[0]);
    close (rl->stop[1]);
    free (rl);
    return NULL;
  }
  pthread_setname_np (rl->thread, "pdio-relay");
  rl->running = true;
  *kernel_fd = sp[0];
  return rl;
}

void
relay_stop (struct relay *rl)
{
  if (rl == NULL)
    return;
  if (rl->running) {
    if (write (rl->stop[1], "x", 1) != 1)
      shutdown (rl->local, SHUT_RDWR);
    pthread_join (rl->thread, NULL);
  }
  close (tls_client_fd (rl->t));
  tls_client_free (rl->t);
  close (rl->local);
  close (rl->stop[0]);
  close (rl->stop[1]);
  free (rl);
}
