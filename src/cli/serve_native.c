/* SPDX-License-Identifier: BSD-3-Clause */
/* pdio serve with pdio's own NBD server (src/server/), the default: the
 * image is opened here, in this process, and served until SIGINT, SIGTERM
 * or SIGHUP, after which the requests in flight are finished and answered
 * and pdio exits 0.
 *
 * With --handover-socket it also listens there for a successor (pdio
 * restart): when one says hello, the server finishes what it started,
 * lets go of the image's lock and sends its listening sockets and live
 * connections (handover.h, from pdio_server_run), then exits 0 once the
 * successor has them, leaving the socket paths and pid
 * file to it.  With --take-over it is that successor: it opens the image
 * without its lock and starts its workers first, then takes the sockets
 * and the lock over (pdio_server_run), so that the connections wait only
 * for the hand-over itself.
 *
 * With --pidfile (what pdio attach uses) it becomes a daemon the way
 * nbdkit -P does: the first process opens the image and listens, so that
 * its exit status says whether serving works; the daemon it forks writes
 * the pid file once its workers run, and only then does the first
 * process exit 0.
 *
 * Whoever runs it, a server is in the I/O path of the devices attached to
 * it: PR_SET_IO_FLUSHER is set before any thread starts (protect.c).
 * --oom-protect (which pdio attach's servers inherit from the supervisor
 * instead) and --swap (mlockall, and no idle memory given back) are
 * asked for.
 */
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <libgen.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "engine.h"
#include "pdio.h"
#include "server.h"

#define CMD "pdio serve"

/* Each worker keeps one pool chunk (2 MiB) resident, registered and
 * locked: the server is on the kernel's writeback path, and the first
 * write after an idle period must not wait for memory the kernel may
 * need that write to free.  One chunk holds the largest command
 * (NBD_CMD_BUF_MAX); an attached device has one worker per connection.
 */
#define SERVE_RESERVE_CHUNKS 1

static void
log_error (const char *fmt, va_list args)
{
  /* ": error: " as nbdkit prints it: the tests and users grep for it. */
  fprintf (stderr, CMD ": error: ");
  vfprintf (stderr, fmt, args);
  fprintf (stderr, "\n");
}

static void
log_warning (const char *fmt, va_list args)
{
  fprintf (stderr, CMD ": warning: ");
  vfprintf (stderr, fmt, args);
  fprintf (stderr, "\n");
}

static void
log_debug (const char *fmt, va_list args)
{
  fprintf (stderr, CMD ": debug: ");
  vfprintf (stderr, fmt, args);
  fprintf (stderr, "\n");
}

struct announce {
  const struct native_serve *o;
  struct pdio_info info;
  int ready_fd;                 /* daemon: tell the first process */
  struct handover *taken;       /* --take-over: what was taken over */
};

static void
ready (void *opaque)
{
  struct announce *a = opaque;
  const struct native_serve *o = a->o;

  if (a->taken)
    fprintf (stderr, CMD ": took over %zu connections from pid %d\n",
             a->taken->n, (int) a->taken->peer);
  if (o->pidfile) {
    FILE *fp = fopen (o->pidfile, "we");

    if (fp) {
      fprintf (fp, "%d\n", (int) getpid ());
      fclose (fp);
    }
    if (a->ready_fd >= 0) {
      if (write (a->ready_fd, "1", 1) != 1)
        warnf (CMD ": could not tell the starting process it is ready");
      close (a->ready_fd);
      a->ready_fd = -1;
    }
  }
  printf ("serving %s: %" PRIu64 " bytes, %s, block sizes %" PRIu32 "/%"
          PRIu32 "/%" PRIu32 ", %s\n", o->image, a->info.size,
          a->info.readonly ? "read-only" : "read-write", a->info.block_min,
          a->info.block_preferred, a->info.block_max,
          a->info.backend == PDIO_BACKEND_PSYNC ? "psync" : "io_uring");
  print_uri_and_attach (o->socket, o->bind, o->port, &o->tls,
                        a->info.block_preferred, a->info.readonly);
}

/* Daemon mode: fork; the first process waits for "ready" (or for the
 * daemon's end) and exits with the verdict.  Returns in the daemon, with
 * *ready_fd to write to.
 */
static bool
daemonize (int *ready_fd)
{
  int p[2];
  pid_t pid;
  char c;

  if (pipe2 (p, O_CLOEXEC) == -1) {
    errorf (CMD ": pipe: %m");
    exit (EXIT_FAILED);
  }
  fflush (NULL);
  pid = fork ();
  if (pid == -1) {
    errorf (CMD ": fork: %m");
    exit (EXIT_FAILED);
  }
  if (pid > 0) {
    close (p[1]);
    if (read (p[0], &c, 1) == 1)
      _exit (EXIT_OK);
    waitpid (pid, NULL, 0);
    _exit (EXIT_FAILED);
  }
  close (p[0]);
  *ready_fd = p[1];
  return true;
}

/* pdio_server_run sent the connections over: true once the successor
 * says it serves them.
 */
static bool
hand_over (struct handover *ho, const struct pdio_log *log)
{
  size_t n = ho->n;
  bool ok = handover_wait_ack (ho, log);

  if (ok)
    fprintf (stderr, CMD ": handed %zu connections over to pid %d\n", n,
             (int) ho->peer);
  else
    errorf (CMD ": the hand-over to pid %d failed: its %zu connections are "
            "closed", (int) ho->peer, n);
  handover_free (ho);
  return ok;
}

void
serve_protect (bool oom_protect)
{
  char why[192];

  no_huge_pages ();
  if (!set_io_flusher (why, sizeof why))
    warnf (CMD ": warning: %s: serving without it; attached on this "
           "machine, its device could stall under memory pressure", why);
  if (oom_protect && !set_oom_protected (why, sizeof why))
    warnf (CMD ": warning: --oom-protect: %s: going on", why);
}

int
serve_native (const struct native_serve *o)
{
  const struct pdio_log log = {
    .error = log_error, .warning = log_warning,
    .debug = getenv ("PDIO_SERVER_DEBUG") ? log_debug : NULL,
  };
  const struct pdio_config cfg = {
    .file = o->image, .readonly = o->readonly, .backend = o->backend,
    .align = o->align, .log = log,
    .bounce_canary = test_bounce_canary (),
    /* The old server holds it until it hands over. */
    .lock_later = o->take_over != NULL,
  };
  struct announce a = { .o = o, .ready_fd = -1 };
  char description[PATH_MAX + 16], base[PATH_MAX];
  struct handover taken, handed;
  struct pdio_image *img;
  struct pdio_tls *tls = NULL;
  struct pdio_tls_config tls_cfg;
  sigset_t sigs;
  int fd = -1, hfd = -1, r;

  /* A server is in the I/O path of whoever attaches it: the flag is set
   * before any thread starts, so that every thread has it.
   */
  serve_protect (o->oom_protect);
  /* Blocked before any thread starts, so every thread inherits it and
   * the signals queue for the server's signalfd.
   */
  sigemptyset (&sigs);
  sigaddset (&sigs, SIGINT);
  sigaddset (&sigs, SIGTERM);
  sigaddset (&sigs, SIGHUP);
  sigprocmask (SIG_BLOCK, &sigs, NULL);
  signal (SIGPIPE, SIG_IGN);
  /* Like nbdkit --exit-with-parent: the SIGTERM is an orderly stop. */
  if (o->exit_with_parent)
    prctl (PR_SET_PDEATHSIG, SIGTERM);

  handover_init (&taken);
  handover_init (&handed);
  /* Bad credentials are found before anything is opened or listened on. */
  tls_cfg = o->tls;
  tls_cfg.no_ktls = test_break ("ktls-off");
  if (o->tls.mode != PDIO_TLS_OFF && pdio_tls_new (&tls_cfg, &log, &tls) < 0)
    return EXIT_FAILED;
  if (pdio_open (&cfg, &img) < 0) {
    pdio_tls_free (tls);
    return EXIT_FAILED;         /* the engine said why */
  }
  pdio_get_info (img, &a.info);
  if (o->take_over)
    a.taken = &taken;           /* the sockets come with the connections */
  else {
    fd = o->socket ? pdio_server_listen_unix (o->socket, o->socket_mode,
                                              o->socket_gid, &log)
                   : pdio_server_listen_tcp (o->bind, o->port, &log);
    if (fd >= 0 && o->port && !pdio_server_is_loopback (fd) &&
        o->tls.mode == PDIO_TLS_ON)
      warnf (CMD ": warning: --tls=on on %s port %s: clients that do not ask "
             "for TLS are served too, in plain text (--tls=require refuses "
             "them)", o->bind, o->port);
    if (fd >= 0 && o->port && !pdio_server_is_loopback (fd) &&
        o->tls.mode == PDIO_TLS_OFF) {
      if (o->plain_beyond_loopback)
        warnf (CMD ": warning: serving %s in plain text, without "
               "authentication, on %s port %s: whoever reaches it can read "
               "and overwrite the whole image", o->image, o->bind, o->port);
      else {
        errorf (CMD ": --bind %s is beyond loopback: serve with TLS "
                "(--tls-certificates DIR or --tls-psk FILE), or add "
                "--tls=off to serve the image to whoever reaches it, in "
                "plain text", o->bind);
        close (fd);
        fd = -1;
      }
    }
    if (fd >= 0 && o->handover &&
        (hfd = handover_listen (o->handover, &log)) < 0) {
      close (fd);
      fd = -1;
    }
    if (fd < 0) {
      pdio_close (img);
      pdio_tls_free (tls);
      return EXIT_FAILED;
    }
  }
  if (o->pidfile)
    daemonize (&a.ready_fd);
  /* After the fork (locks are not inherited), before the workers: their
   * stacks and pools are locked as they are made.
   */
  if (o->swap) {
    char why[192];

    if (!lock_memory (why, sizeof why)) {
      errorf (CMD ": error: --swap: %s", why);
      pdio_close (img);
      pdio_tls_free (tls);
      if (fd >= 0)
        close (fd);
      return EXIT_FAILED;
    }
  }

  snprintf (base, sizeof base, "%s", o->image);
  snprintf (description, sizeof description, "pdio: %s", basename (base));
  r = pdio_server_run (&(struct pdio_server_config) {
      .img = img, .threads = o->threads, .description = description,
      .reserve_chunks = test_break ("no-reserve") ? 0 : SERVE_RESERVE_CHUNKS,
      .log = log, .max_connections = o->max_connections,
      .handshake_secs = o->handshake_secs, .tls = tls,
      .handover_fd = hfd, .take_over = o->take_over,
      .listen_path = o->socket, .taken = &taken,
      .keep_memory = o->swap, .stats_path = o->stats,
    }, fd, &sigs, ready, &a, &handed);
  handover_free (&taken);
  /* The paths stay for the successor, even one whose hand-over failed
   * (the supervisor binds them again); after a failed take-over they may
   * still be the old server's.
   */
  if (r == 0 || (r < 0 && r != -EPIPE && !o->take_over)) {
    if (o->socket)
      unlink (o->socket);
    if (o->handover)
      unlink (o->handover);
    if (o->pidfile)
      unlink (o->pidfile);
  }
  /* A take-over that failed served nothing: its error stays the last
   * line, which the supervisor quotes.
   */
  if (r >= 0 || !o->take_over) {
    struct pdio_stats st;
    char buf[512];

    pdio_get_stats (img, &st);
    pdio_format_stats (&st, buf, sizeof buf);
    fprintf (stderr, CMD ": stats: %s\n", buf);
  }
  pdio_close (img);
  pdio_tls_free (tls);
  if (r == PDIO_SERVER_HANDED_OVER)
    return hand_over (&handed, &log) ? EXIT_OK : EXIT_FAILED;
  if (r == -EPIPE) {
    errorf (CMD ": the hand-over to pid %d failed: its %zu connections are "
            "closed", (int) handed.peer, handed.n);
    handover_free (&handed);
  }
  return r == 0 ? EXIT_OK : EXIT_FAILED;
}
