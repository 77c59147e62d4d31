/* SPDX-License-Identifier: BSD-3-Clause */
/* pdio(1), the command line tool: dispatches to the commands and prints
 * the overall help.  See pdio.h for the pieces.
 */
#include <config.h>

#include <stdio.h>
#include <string.h>

#include "pdio.h"

static void
usage (FILE *fp)
{
  fprintf (fp,
"Usage: pdio COMMAND [OPTIONS] [ARGS]\n"
"A userspace loop device: images served with O_DIRECT by pdio's own NBD\n"
"server (or, with --nbdkit, by nbdkit and pdio.so), attached to the\n"
"kernel's nbd driver over netlink; a supervisor restarts a server that\n"
"dies.\n"
"\n"
"Commands:\n"
"  attach [-r] [-C N] [-b B] [-t S] [-d /dev/nbdN] IMAGE\n"
"                       attach IMAGE to a free /dev/nbdN and print it\n"
"  detach [--force] DEVICE|IMAGE | --all\n"
"                       detach, stop its server, remove its socket\n"
"  list [--json]        show what is attached\n"
"  restart DEVICE|IMAGE replace the device's server, the device stays up\n"
"  resize [--size SIZE [--force]] DEVICE|IMAGE\n"
"                       the device takes the image's (new) size\n"
"  serve [-r] [--socket PATH | --port PORT] IMAGE\n"
"                       serve IMAGE in the foreground, print how to attach\n"
"  stats [--json | --prometheus | --watch S] [DEVICE|IMAGE | --file FILE]\n"
"                       each device's counters and latency percentiles\n"
"\n"
"pdio COMMAND --help shows a command's options; man pdio has it all.\n"
"\n"
"Exit status: 0 done; 1 failed (the reason is printed); 2 usage error;\n"
"3 the kernel has no nbd driver (modprobe nbd); 4 not run as root.\n"
"\n"
"Environment: PDIO_PLUGIN (the plugin for --nbdkit, default \"pdio\"),\n"
"PDIO_NBDKIT (nbdkit, default from PATH), PDIO_RUNDIR (default\n"
"/run/pdio).\n"
"\n"
"mount -t pdio IMAGE DIR runs this program as /sbin/mount.pdio.\n");
}

int
main (int argc, char **argv)
{
  static const struct {
    const char *name;
    int (*fn) (int argc, char **argv);
  } cmds[] = {
    { "attach", cmd_attach },
    { "detach", cmd_detach },
    { "list", cmd_list },
    { "serve", cmd_serve },
    { "restart", cmd_restart },
    { "resize", cmd_resize },
    { "stats", cmd_stats },
  };

  /* mount(8) runs /sbin/mount.pdio, and umount(8) /sbin/umount.pdio,
   * links to pdio.
   */
  {
    const char *base = strrchr (argv[0], '/');

    if (strcmp (base ? base + 1 : argv[0], "mount.pdio") == 0)
      return cmd_mount (argc, argv);
    if (strcmp (base ? base + 1 : argv[0], "umount.pdio") == 0)
      return cmd_umount (argc, argv);
  }
  if (argc < 2) {
    usage (stderr);
    return EXIT_USAGE;
  }
  if (strcmp (argv[1], "--help") == 0 || strcmp (argv[1], "-h") == 0 ||
      strcmp (argv[1], "help") == 0) {
    usage (stdout);
    return EXIT_OK;
  }
  if (strcmp (argv[1], "--version") == 0) {
    printf ("pdio %s\n", PACKAGE_VERSION);
    return EXIT_OK;
  }
  for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
    if (strcmp (argv[1], cmds[i].name) == 0)
      /* The command parses argv[1..]: its name is its argv[0]. */
      return cmds[i].fn (argc - 1, argv + 1);
  fprintf (stderr, "pdio: unknown command '%s'\n", argv[1]);
  usage (stderr);
  return EXIT_USAGE;
}
