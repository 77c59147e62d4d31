/* SPDX-License-Identifier: BSD-3-Clause */
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
#include <poll.h>
#include <sys/inotify.h>
#include <sys/pidfd.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <grp.h>

#include "engine.h"
#include "server.h"
#include "pdio.h"

#define CMD "pdio serve"

struct serve_opts {
  bool readonly, nbdkit;
  const char *socket, *port, *plugin, *image;
  const char *align, *backend;  /* as given, NULL: the default */
  unsigned long threads;        /* native server: 0 = one per CPU */
  const char *pidfile;          /* native server: daemon mode (attach) */
  bool exit_with_parent;        /* stop when the parent exits */
  const char *bind;             /* with --port: the address */
  const char *tls;              /* --tls as given, NULL: not given */
  const char *socket_mode, *socket_group;
  unsigned long max_connections, handshake_secs;
  struct pdio_tls_config tlsc;
  const char *authz[64];
  const char *handover;         /* native server: --handover-socket */
  const char *take_over;        /* native server: --take-over */
  bool oom_protect;             /* oom_score_adj -1000 */
  bool swap;                    /* memory locked and kept; implies
                                   oom_protect */
  const char *stats;            /* native server: --stats */
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
"  -s, --socket PATH      unix socket (default RUNDIR/serve-PID.sock), mode\n"
"                         0600 whatever the umask\n"
"      --socket-mode MODE the socket's mode instead (octal, e.g. 0660)\n"
"      --socket-group GROUP  the socket's group\n"
"  -p, --port PORT        TCP port instead of a unix socket (on loopback)\n"
"  -b, --bind ADDR        with --port: listen on ADDR instead of 127.0.0.1\n"
"                         (:: for every address); beyond loopback, TLS\n"
"                         credentials or --tls=off are required\n"
"      --max-connections N  clients at once (default %d); more are closed\n"
"      --handshake-timeout S  drop a client whose handshake (TLS\n"
"                         included) has not finished in S seconds\n"
"                         (default %d)\n"
"      --tls off|on|require  TLS (default: require with credentials, else\n"
"                         off); on also serves plain clients\n"
"      --tls-certificates DIR  x509: DIR/ca-cert.pem, server-cert.pem,\n"
"                         server-key.pem (certtool)\n"
"      --tls-psk FILE     pre-shared keys, psktool's format\n"
"      --tls-verify-peer  x509: require a client certificate signed by\n"
"                         ca-cert.pem\n"
"      --tls-authz NAME   let in only this client certificate DN or PSK\n"
"                         identity (repeat for more)\n"
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
"      --oom-protect      oom_score_adj -1000: the OOM killer never picks\n"
"                         the server (pdio attach's servers have it)\n"
"      --exit-with-parent  stop (as on SIGTERM) when the process that\n"
"                         started it exits\n"
"      --stats FILE       keep the counters pdio stats --file reads in\n"
"                         FILE (pdio attach: RUNDIR/NAME.stats)\n"
"      --swap             for swap on a device it serves: all of the\n"
"                         server's memory is locked (mlockall) and never\n"
"                         given back; implies --oom-protect\n"
"      --nbdkit           serve with nbdkit and pdio.so instead (its\n"
"                         filters)\n"
"      --plugin PLUGIN    with --nbdkit: the plugin (default $PDIO_PLUGIN\n"
"                         or pdio)\n", PDIO_SERVER_MAX_CONNECTIONS,
           PDIO_SERVER_HANDSHAKE_SECS);
}

/* The --tls options make sense together. */
static bool
check_tls (struct serve_opts *o)
{
  struct pdio_tls_config *t = &o->tlsc;
  bool creds = t->certificates || t->psk_file;

  t->authz = o->authz;
  if (t->certificates && t->psk_file) {
    errorf (CMD ": --tls-certificates and --tls-psk: choose one");
    return false;
  }
  if (o->tls == NULL)
    t->mode = creds ? PDIO_TLS_REQUIRE : PDIO_TLS_OFF;
  else
    t->mode = strcmp (o->tls, "off") == 0 ? PDIO_TLS_OFF
              : strcmp (o->tls, "on") == 0 ? PDIO_TLS_ON : PDIO_TLS_REQUIRE;
  if (t->mode == PDIO_TLS_OFF && creds) {
    errorf (CMD ": --tls=off with %s: choose", t->certificates
            ? "--tls-certificates" : "--tls-psk");
    return false;
  }
  if (t->mode != PDIO_TLS_OFF && !creds) {
    errorf (CMD ": --tls=%s needs --tls-certificates DIR or --tls-psk FILE",
            o->tls);
    return false;
  }
  if (t->verify_peer && t->certificates == NULL) {
    errorf (CMD ": --tls-verify-peer checks client certificates: it goes "
            "with --tls-certificates");
    return false;
  }
  if (t->n_authz && !creds) {
    errorf (CMD ": --tls-authz names TLS clients: it goes with "
            "--tls-certificates or --tls-psk");
    return false;
  }
  /* A certificate's name means nothing unless the certificate is checked. */
  if (t->n_authz && t->certificates)
    t->verify_peer = true;
  if (t->mode != PDIO_TLS_OFF && o->port == NULL) {
    errorf (CMD ": TLS is for --port (a unix socket has its mode and "
            "group: --socket-mode, --socket-group)");
    return false;
  }
  return true;
}

/* With --nbdkit, whose socket pdio does not see: is addr a loopback
 * address?
 */
static bool
loopback_address (const char *addr)
{
  struct in_addr a4;
  struct in6_addr a6;

  if (inet_pton (AF_INET, addr, &a4) == 1)
    return (ntohl (a4.s_addr) >> 24) == 127;
  if (inet_pton (AF_INET6, addr, &a6) == 1)
    return IN6_IS_ADDR_LOOPBACK (&a6);
  return strcmp (addr, "localhost") == 0;
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
    { "exit-with-parent", no_argument, NULL, 'E' },
    { "bind", required_argument, NULL, 'b' },
    { "max-connections", required_argument, NULL, 'M' },
    { "handshake-timeout", required_argument, NULL, 'W' },
    { "socket-mode", required_argument, NULL, 'm' },
    { "socket-group", required_argument, NULL, 'g' },
    { "tls", required_argument, NULL, 't' },
    { "tls-certificates", required_argument, NULL, 'C' },
    { "tls-psk", required_argument, NULL, 'K' },
    { "tls-verify-peer", no_argument, NULL, 'V' },
    { "tls-authz", required_argument, NULL, 'Z' },
    { "handover-socket", required_argument, NULL, 'H' },
    { "take-over", required_argument, NULL, 'O' },
    { "oom-protect", no_argument, NULL, 'o' },
    { "swap", no_argument, NULL, 'w' },
    { "stats", required_argument, NULL, 'S' },
    { "help", no_argument, NULL, 'h' },
    { NULL, 0, NULL, 0 },
  };
  unsigned long port, v;
  int c;

  *o = (struct serve_opts) { .readonly = false };
  while ((c = getopt_long (argc, argv, "+rs:p:b:h", longopts, NULL)) != -1)
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
    case 'b': o->bind = optarg; break;
    case 'M':
      if (!parse_uint (optarg, 1, 65536, &o->max_connections)) {
        errorf (CMD ": --max-connections %s: must be a number from 1 to "
                "65536", optarg);
        return EXIT_USAGE;
      }
      break;
    case 'W':
      if (!parse_uint (optarg, 1, 3600, &o->handshake_secs)) {
        errorf (CMD ": --handshake-timeout %s: must be a number of seconds "
                "from 1 to 3600", optarg);
        return EXIT_USAGE;
      }
      break;
    case 'm': {
      char *end;
      unsigned long m = strtoul (optarg, &end, 8);

      if (*optarg == '\0' || *end || m > 0777 || (m & 0600) != 0600) {
        errorf (CMD ": --socket-mode %s: must be an octal mode from 0600 to "
                "0777 that lets the owner read and write", optarg);
        return EXIT_USAGE;
      }
      o->socket_mode = optarg;
      break;
    }
    case 'g': o->socket_group = optarg; break;
    case 't':
      if (strcmp (optarg, "off") && strcmp (optarg, "on") &&
          strcmp (optarg, "require")) {
        errorf (CMD ": --tls %s: must be off, on or require", optarg);
        return EXIT_USAGE;
      }
      o->tls = optarg;
      break;
    case 'C': o->tlsc.certificates = optarg; break;
    case 'K': o->tlsc.psk_file = optarg; break;
    case 'V': o->tlsc.verify_peer = true; break;
    case 'Z':
      if (o->tlsc.n_authz == sizeof o->authz / sizeof o->authz[0]) {
        errorf (CMD ": --tls-authz: at most %zu names",
                sizeof o->authz / sizeof o->authz[0]);
        return EXIT_USAGE;
      }
      o->authz[o->tlsc.n_authz++] = optarg;
      break;
    case 'H': o->handover = optarg; break;
    case 'O': o->take_over = optarg; break;
    case 'o': o->oom_protect = true; break;
    case 'w': o->swap = o->oom_protect = true; break;
    case 'S': o->stats = optarg; break;
    case 'h': usage (stdout); exit (EXIT_OK);
    default: usage (stderr); return EXIT_USAGE;
    }
  if (o->socket && o->port) {
    errorf (CMD ": --socket and --port: choose one");
    return EXIT_USAGE;
  }
  if (o->nbdkit && (o->threads || o->pidfile || o->max_connections ||
                    o->handshake_secs || o->socket_mode || o->socket_group ||
                    o->tls || o->tlsc.certificates || o->tlsc.psk_file ||
                    o->tlsc.verify_peer || o->tlsc.n_authz)) {
    errorf (CMD ": --threads, --pidfile, --max-connections, "
            "--handshake-timeout, --socket-mode, --socket-group and the --tls "
            "options are for pdio's own server, not --nbdkit");
    return EXIT_USAGE;
  }
  if (o->nbdkit && (o->threads || o->pidfile || o->handover ||
                    o->take_over)) {
    errorf (CMD ": --threads, --pidfile, --handover-socket and --take-over "
            "are for pdio's own server, not --nbdkit (nbdkit cannot hand its "
            "connections over)");
    return EXIT_USAGE;
  }
  if (o->nbdkit && o->stats) {
    errorf (CMD ": --stats is for pdio's own server, not --nbdkit (nbdkit "
            "has its stats filter)");
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
  if (o->bind && o->port == NULL) {
    errorf (CMD ": --bind %s: goes with --port", o->bind);
    return EXIT_USAGE;
  }
  if (o->port && (o->socket_mode || o->socket_group)) {
    errorf (CMD ": --socket-mode and --socket-group: for a unix socket, not "
            "--port");
    return EXIT_USAGE;
  }
  if (!check_tls (o))
    return EXIT_USAGE;
  o->image = one_operand (CMD, argc, argv, "IMAGE", usage);
  return o->image ? EXIT_OK : EXIT_USAGE;
}

static void
print_how_to_attach (const struct serve_opts *o, const char *image,
                     const struct server_info *info)
{
  printf ("serving %s: %" PRIu64 " bytes, %s, direct-I/O alignment (NBD "
          "preferred block size) %" PRIu32 "\n", image, info->size,
          info->readonly ? "read-only" : "read-write", info->dio_align);
  print_uri_and_attach (o->socket, o->bind, o->port, NULL, info->dio_align,
                        info->readonly);
}

/* Until nbdkit answers, it is asked again every ANNOUNCE_RETRY_MS: on a
 * TCP port nothing announces a listener, and a unix socket exists from
 * bind, a moment before listen.  A unix socket is first waited for.
 */
#define ANNOUNCE_RETRY_MS 50

/* Runs until nbdkit exits (its pidfd); termination signals are passed on
 * to it.  It is announced once it answers.
 */
static int
wait_nbdkit (pid_t pid, const struct serve_opts *o, const char *image,
             const sigset_t *sigs)
{
  struct server_info info;
  bool announced = false, asking = true;
  char why[256], buf[4096];
  int status, sfd, pfd, in;

  sfd = signalfd (-1, sigs, SFD_NONBLOCK | SFD_CLOEXEC);
  pfd = pidfd_open (pid, 0);
  in = o->socket ? inotify_on_dir (o->socket, IN_CREATE | IN_MOVED_TO) : -1;
  if (sfd == -1 || pfd == -1) {
    errorf (CMD ": cannot watch nbdkit, pid %d: %m", (int) pid);
    kill (pid, SIGTERM);
  }
  for (;;) {
    struct pollfd p[3] = {
      { .fd = sfd, .events = POLLIN }, { .fd = pfd, .events = POLLIN },
      { .fd = in, .events = POLLIN },
    };
    struct signalfd_siginfo si;

    if (!announced && asking) {
      if (server_query (o->socket, o->port, 0, &info, why, sizeof why)) {
        print_how_to_attach (o, image, &info);
        announced = true;
      }
      else if (in >= 0 && access (o->socket, F_OK) == -1)
        asking = false;         /* until the socket is made */
    }
    if (waitpid (pid, &status, sfd == -1 || pfd == -1 ? 0 : WNOHANG) == pid)
      break;
    if (poll (p, 3, announced || !asking ? -1 : ANNOUNCE_RETRY_MS) == -1 &&
        errno != EINTR) {
      errorf (CMD ": poll: %m");
      kill (pid, SIGTERM);
      waitpid (pid, &status, 0);
      break;
    }
    while (sfd >= 0 && read (sfd, &si, sizeof si) == sizeof si)
      if (si.ssi_signo != SIGCHLD)
        kill (pid, SIGTERM);
    if (p[2].revents & POLLIN) {
      while (read (in, buf, sizeof buf) > 0)
        ;
      asking = true;
    }
  }
  if (sfd >= 0)
    close (sfd);
  if (pfd >= 0)
    close (pfd);
  if (in >= 0)
    close (in);
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
  gid_t gid = (gid_t) -1;
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
    if (!make_rundir (CMD))
      return EXIT_FAILED;
    snprintf (sock, sizeof sock, "%s/serve-%d.sock", rundir (), (int) getpid ());
    o.socket = sock;
  }
  if (o.socket_group) {
    struct group *g = getgrnam (o.socket_group);
    unsigned long n;

    if (g)
      gid = g->gr_gid;
    else if (parse_uint (o.socket_group, 0, UINT32_MAX - 1, &n))
      gid = n;
    else {
      errorf (CMD ": --socket-group %s: no such group", o.socket_group);
      return EXIT_USAGE;
    }
  }
  if (o.nbdkit && o.port && o.bind && !loopback_address (o.bind) &&
      !(o.tls && strcmp (o.tls, "off") == 0)) {
    errorf (CMD ": --bind %s: nbdkit would serve the image in plain text "
            "beyond loopback: add --tls=off to mean it", o.bind);
    return EXIT_USAGE;
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
        .bind = o.bind,
        .plain_beyond_loopback = o.tls && strcmp (o.tls, "off") == 0,
        .socket_mode = o.socket_mode ? strtoul (o.socket_mode, NULL, 8) : 0,
        .socket_gid = gid, .max_connections = o.max_connections,
        .handshake_secs = o.handshake_secs, .tls = o.tlsc,
        .handover = o.take_over ? o.take_over : o.handover,
        .take_over = o.take_over, .oom_protect = o.oom_protect,
        .swap = o.swap, .stats = o.stats,
      });
  if (!find_program ("PDIO_NBDKIT", "nbdkit", nbdkit, sizeof nbdkit)) {
    errorf (CMD ": nbdkit not found (%s): install it (apt-get install "
            "nbdkit)", nbdkit);
    return EXIT_FAILED;
  }
  if (o.socket == NULL && o.port == NULL) {
    if (!make_rundir (CMD))
      return EXIT_FAILED;
    snprintf (sock, sizeof sock, "%s/serve-%d.sock", rundir (), (int) getpid ());
    o.socket = sock;
  }

  sigemptyset (&sigs);
  sigaddset (&sigs, SIGINT);
  sigaddset (&sigs, SIGTERM);
  sigaddset (&sigs, SIGHUP);
  sigaddset (&sigs, SIGCHLD);
  sigprocmask (SIG_BLOCK, &sigs, NULL);
  /* The SIGTERM is passed on to nbdkit, an orderly stop. */
  if (o.exit_with_parent)
    prctl (PR_SET_PDEATHSIG, SIGTERM);

  /* nbdkit inherits both; it locks its memory itself (its --swap). */
  serve_protect (o.oom_protect);
  server_argv (&(struct server_opts) {
      .nbdkit = nbdkit, .plugin = plugin_name (o.plugin), .image = image,
      .socket = o.socket, .port = o.port, .readonly = o.readonly,
      .align = o.align, .backend = o.backend,
      .bind = o.port ? (o.bind ? o.bind : "127.0.0.1") : NULL,
      .swap = o.swap,
    }, &cmd);
  pid = run_child ((char **) cmd.argv);
  if (pid == -1)
    return EXIT_FAILED;
  r = wait_nbdkit (pid, &o, image, &sigs);
  if (o.socket)
    unlink (o.socket);
  return r;
}
