/* SPDX-License-Identifier: BSD-3-Clause */
/* The command line of an attachment's server, built here and nowhere
 * else: pdio's own (pdio serve --pidfile, a daemon) or nbdkit with the
 * plugin (a daemon with -P, or in the foreground for pdio serve
 * --nbdkit); and the options it is started with, from a record.
 */
#include <config.h>

#include <stdio.h>

#include "pdio.h"

#define STR_(x) #x
#define STR(x) STR_ (x)

/* pdio's own server as a daemon (attach): pdio serve --pidfile. */
static void
native_argv (const struct server_opts *o, struct server_cmd *c)
{
  const char **argv = c->argv;
  int i = 0;

  argv[i++] = o->pdio;
  argv[i++] = "serve";
  argv[i++] = "--pidfile";
  argv[i++] = o->pidfile;
  argv[i++] = "--socket";
  argv[i++] = o->socket;
  if (o->handover[0]) {
    /* The successor listens for its own successor where it took over. */
    argv[i++] = o->take_over ? "--take-over" : "--handover-socket";
    argv[i++] = o->handover;
  }
  if (o->readonly)
    argv[i++] = "--read-only";
  if (o->threads) {
    snprintf (c->threads_arg, sizeof c->threads_arg, "%u", o->threads);
    argv[i++] = "--threads";
    argv[i++] = c->threads_arg;
  }
  if (o->swap)
    argv[i++] = "--swap";
  if (o->stats[0]) {
    argv[i++] = "--stats";
    argv[i++] = o->stats;
  }
  argv[i++] = "--";
  argv[i++] = o->image;
  argv[i] = NULL;
}

void
server_argv (const struct server_opts *o, struct server_cmd *c)
{
  const char **argv = c->argv;
  int i = 0;

  if (o->native) {
    native_argv (o, c);
    return;
  }
  argv[i++] = o->nbdkit;
  if (o->pidfile) {
    /* A daemon: nbdkit opens the image (and so fails on a locked one)
     * before it forks, and its first process exits with the verdict.
     * nbdkit -f would also die with its parent (PR_SET_PDEATHSIG).
     */
    argv[i++] = "-P";
    argv[i++] = o->pidfile;
    argv[i++] = "--log=stderr";
  }
  else {
    argv[i++] = "-f";
    argv[i++] = "--exit-with-parent";
  }
  if (o->socket) {
    argv[i++] = "-U";
    argv[i++] = o->socket;
  }
  else {
    argv[i++] = "-p";
    argv[i++] = o->port;
    if (o->bind) {
      argv[i++] = "-i";
      argv[i++] = o->bind;
    }
  }
  argv[i++] = "-t";
  argv[i++] = STR (NBDKIT_THREADS);
  if (o->readonly)
    argv[i++] = "-r";
  /* nbdkit's own: mlockall. */
  if (o->swap)
    argv[i++] = "--swap";
  argv[i++] = o->plugin;
  snprintf (c->file_arg, sizeof c->file_arg, "file=%s", o->image);
  argv[i++] = c->file_arg;
  /* nbdkit -r only refuses writes; readonly=true also makes the engine
   * open the image read-only, with a shared lock.
   */
  if (o->readonly)
    argv[i++] = "readonly=true";
  if (o->align) {
    snprintf (c->align_arg, sizeof c->align_arg, "align=%s", o->align);
    argv[i++] = c->align_arg;
  }
  if (o->backend) {
    snprintf (c->backend_arg, sizeof c->backend_arg, "backend=%s", o->backend);
    argv[i++] = c->backend_arg;
  }
  argv[i] = NULL;
}

struct server_opts
record_server_opts (const struct record *r, const char *pdio,
                    const char *nbdkit, const char *pidfile)
{
  struct server_opts o = {
    .nbdkit = nbdkit, .plugin = r->plugin, .image = r->image,
    .socket = r->socket, .pidfile = pidfile, .readonly = r->readonly,
    .native = !r->nbdkit, .pdio = pdio, .threads = r->threads,
    .swap = r->swap,
  };

  /* nbdkit cannot hand its connections over: restarts replace it. */
  if (o.native) {
    state_path (r->name, "handover", o.handover, sizeof o.handover);
    state_path (r->name, "stats", o.stats, sizeof o.stats);
  }
  return o;
}
