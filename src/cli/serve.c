/* pdio serve IMAGE: a server for attaching by hand or over TCP, in the
 * foreground.  By default pdio's own NBD server runs in this process
 * (serve_native.c).  --nbdkit runs nbdkit with pdio.so as a child: pdio
 * prints the URI and the nbd-client command with the right block size
 * once nbdkit answers, then runs until nbdkit exits or pdio gets SIGINT,
 * SIGTERM or SIGHUP (passed on to nbdkit as SIGTERM), and exits with
 * nbdkit's status.
 */
#include <config.h>

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "engine.h"
#include "pdio.h"

#define CMD "pdio serve"

struct serve_opts {
  bool readonly, nbdkit;
  const char *socket, *port, *plugin, *image;
  const char *align, *backend;  /* as given, NULL: the default */
  unsigned long threads;        /* native server: 0 = one per CPU */
  const char *pidfile;          /* native server: daemon mode (attach) */
  bool exit_with_parent;        /* native server: for the tests */
  const char *handover;         /* native server: --handover-socket */
  const char *take_over;        /* native server: --take-over */
};

static void
usage (FILE *fp)
{
  fprintf (fp,
"Usage: pdio serve [OPTIONS] [--socket PATH | --port PORT] IMAGE\n"
"Serve IMAGE over NBD in the foreground with pdio's own server (or nbdkit\n"
"and pdio.so); print the NBD URI and the nbd-client command that attaches\n"
"it.  Ctrl-C or SIGTERM stops it after answering the requests in flight.\n"
"\n"
"  -r, --read-only        serve read-only (the image gets a shared lock)\n"
"  -s, --socket PATH      unix socket (default RUNDIR/serve-PID.sock)\n"
"  -p, --port PORT        TCP port instead of a unix socket (all addresses)\n"
"      --align N          raise the direct-I/O alignment (power of two)\n"
"      --backend B        io_uring or psync (default io_uring, psync if\n"
"                         io_uring is refused)\n"
"      --threads N        worker threads (default one per CPU; not with\n"
"                         --nbdkit)\n"
"      --handover-socket PATH  listen on PATH (a unix socket, mode 0600) for\n"
"                         a successor to hand the live connections to\n"
"      --take-over PATH   take over from the server listening on PATH: its\n"
"                         listening sockets and its live connections, which\n"
"                         never see a close; then listen there in turn.\n"
"                         --socket or --port names what it listened on\n"
"      --nbdkit           serve with nbdkit and pdio.so instead (TLS,\n"
"                         filters)\n"
"      --plugin PLUGIN    with --nbdkit: the plugin (default $PDIO_PLUGIN\n"
"                         or pdio)\n");
}

static int
parse (int argc, char **argv, struct serve_opts *o)
{
  static const struct option longopts[] = {
    { "read-only", no_argument, NULL, 'r' },
    { "socket", required_argument, NULL, 's' },
    { "port", required_argument, NULL, 'p' },
    { "plugin", required_argument, NULL, 'P' },
    { "align", required_argument, NULL, 'A' },
    { "backend", required_argument, NULL, 'B' },
    { "threads", required_argument, NULL, 'T' },
    { "nbdkit", no_argument, NULL, 'N' },
    { "pidfile", required_argument, NULL, 'F' },  /* for attach */
    { "exit-with-parent", no_argument, NULL, 'E' },  /* for the tests */
    { "handover-socket", required_argument, NULL, 'H' },
    { "take-over", required_argument, NULL, 'O' },
    { "help", no_argument, NULL, 'h' },
    { NULL, 0, NULL, 0 },
  };
  unsigned long port, v;
  int c;

  *o = (struct serve_opts) { .readonly = false };
  while ((c = getopt_long (argc, argv, "+rs:p:h", longopts, NULL)) != -1)
    switch (c) {
    case 'r': o->readonly = true; break;
    case 's': o->socket = optarg; break;
    case 'p':
      if (!parse_uint (optarg, 1, 65535, &port)) {
        errorf (CMD ": --port %s: must be a number from 1 to 65535", optarg);
        return EXIT_USAGE;
      }
      o->port = optarg;
      break;
    case 'P': o->plugin = optarg; break;
    case 'A':
      if (!parse_uint (optarg, 512, 1 << 20, &v) || !is_power_of_two (v)) {
        errorf (CMD ": --align %s: must be a power of two from 512 to "
                "1048576", optarg);
        return EXIT_USAGE;
      }
      o->align = optarg;
      break;
    case 'B':
      if (strcmp (optarg, "io_uring") && strcmp (optarg, "psync")) {
        errorf (CMD ": --backend %s: must be io_uring or psync", optarg);
        return EXIT_USAGE;
      }
      o->backend = optarg;
      break;
    case 'T':
      if (!parse_uint (optarg, 1, 1024, &o->threads)) {
        errorf (CMD ": --threads %s: must be a number from 1 to 1024", optarg);
        return EXIT_USAGE;
      }
      break;
    case 'N': o->nbdkit = true; break;
    case 'F': o->pidfile = optarg; break;
    case 'E': o->exit_with_parent = true; break;
    case 'H': o->handover = optarg; break;
    case 'O': o->take_over = optarg; break;
    case 'h': usage (stdout); exit (EXIT_OK);
    default: usage (stderr); return EXIT_USAGE;
    }
  if (o->socket && o->port) {
    errorf (CMD ": --socket and --port: choose one");
    return EXIT_USAGE;
  }
  if (o->nbdkit && (o->threads || o->pidfile || o->handover ||
                    o->take_over)) {
    errorf (CMD ": --threads, --pidfile, --handover-socket and --take-over "
            "are for pdio's own server, not --nbdkit (nbdkit cannot hand its "
            "connections over)");
    return EXIT_USAGE;
  }
  if (o->take_over && o->handover && strcmp (o->take_over, o->handover)) {
    errorf (CMD ": --take-over %s: the server listens for its own successor "
            "where it took over, not on --handover-socket %s", o->take_over,
            o->handover);
    return EXIT_USAGE;
  }
  if (o->take_over && o->socket == NULL && o->port == NULL) {
    errorf (CMD ": --take-over: give the --socket or --port the old server "
            "listens on");
    return EXIT_USAGE;
  }
  if (optind != argc - 1) {
    errorf (CMD ": %s", optind == argc ? "no IMAGE given"
                                       : "only one IMAGE, please");
    usage (stderr);
    return EXIT_USAGE;
  }
  o->image = argv[optind];
  return EXIT_OK;
}

static void
print_how_to_attach (const struct serve_opts *o, const char *image,
                     const struct server_info *info)
{
  printf ("serving %s: %" PRIu64 " bytes, %s, direct-I/O alignment (NBD "
          "preferred block size) %" PRIu32 "\n", image, info->size,
          info->readonly ? "read-only" : "read-write", info->dio_align);
  print_uri_and_attach (o->socket, o->port, info->dio_align, info->readonly);
}

/* Runs until nbdkit exits; termination signals are passed on to it. */
static int
wait_nbdkit (pid_t pid, const struct serve_opts *o, const char *image,
             const sigset_t *sigs)
{
  struct server_info info;
  bool announced = false;
  char why[256];
  int status;

  for (;;) {
    struct timespec tick = { .tv_nsec = 50000000 };
    int sig = sigtimedwait (sigs, NULL, &tick);
    pid_t w = waitpid (pid, &status, WNOHANG);

    if (w == pid)
      break;
    if (sig == SIGINT || sig == SIGTERM || sig == SIGHUP)
      kill (pid, SIGTERM);
    else if (!announced &&
             server_query (o->socket, o->port, 0, &info, why, sizeof why)) {
      print_how_to_attach (o, image, &info);
      announced = true;
    }
  }
  if (WIFEXITED (status))
    return WEXITSTATUS (status) == 0 ? EXIT_OK : EXIT_FAILED;
  errorf (CMD ": nbdkit was killed by signal %d", WTERMSIG (status));
  return EXIT_FAILED;
}

int
cmd_serve (int argc, char **argv)
{
  char image[PATH_MAX], nbdkit[PATH_MAX], sock[PATH_MAX];
  struct serve_opts o;
  struct server_cmd cmd;
  struct stat st;
  sigset_t sigs;
  pid_t pid;
  int r;

  r = parse (argc, argv, &o);
  if (r != EXIT_OK)
    return r;
  if (realpath (o.image, image) == NULL || stat (image, &st) == -1) {
    errorf (CMD ": %s: %m", o.image);
    return EXIT_FAILED;
  }
  if (S_ISDIR (st.st_mode)) {
    errorf (CMD ": %s: %s", o.image, strerror (EISDIR));
    return EXIT_FAILED;
  }
  if (!o.nbdkit && o.socket == NULL && o.port == NULL) {
    if (mkdir (rundir (), 0755) == -1 && errno != EEXIST) {
      errorf (CMD ": %s: %m (choose a socket with --socket)", rundir ());
      return EXIT_FAILED;
    }
    snprintf (sock, sizeof sock, "%s/serve-%d.sock", rundir (), (int) getpid ());
    o.socket = sock;
  }
  if (!o.nbdkit)
    return serve_native (&(struct native_serve) {
        .image = image, .socket = o.socket, .port = o.port,
        .readonly = o.readonly, .align = o.align ? atoi (o.align) : 0,
        .backend = o.backend == NULL ? PDIO_BACKEND_DEFAULT
                   : strcmp (o.backend, "psync") == 0 ? PDIO_BACKEND_PSYNC
                   : PDIO_BACKEND_URING,
        .threads = o.threads, .pidfile = o.pidfile,
        .exit_with_parent = o.exit_with_parent,
        .handover = o.take_over ? o.take_over : o.handover,
        .take_over = o.take_over,
      });
  if (!find_program ("PDIO_NBDKIT", "nbdkit", nbdkit, sizeof nbdkit)) {
    errorf (CMD ": nbdkit not found (%s): install it (apt-get install "
            "nbdkit)", nbdkit);
    return EXIT_FAILED;
  }
  if (o.socket == NULL && o.port == NULL) {
    if (mkdir (rundir (), 0755) == -1 && errno != EEXIST) {
      errorf (CMD ": %s: %m (choose a socket with --socket)", rundir ());
      return EXIT_FAILED;
    }
    snprintf (sock, sizeof sock, "%s/serve-%d.sock", rundir (), (int) getpid ());
    o.socket = sock;
  }

  sigemptyset (&sigs);
  sigaddset (&sigs, SIGINT);
  sigaddset (&sigs, SIGTERM);
  sigaddset (&sigs, SIGHUP);
  sigaddset (&sigs, SIGCHLD);
  sigprocmask (SIG_BLOCK, &sigs, NULL);

  server_argv (&(struct server_opts) {
      .nbdkit = nbdkit, .plugin = plugin_name (o.plugin), .image = image,
      .socket = o.socket, .port = o.port, .readonly = o.readonly,
      .align = o.align, .backend = o.backend,
    }, &cmd);
  pid = run_child ((char **) cmd.argv);
  if (pid == -1)
    return EXIT_FAILED;
  r = wait_nbdkit (pid, &o, image, &sigs);
  if (o.socket)
    unlink (o.socket);
  return r;
}
