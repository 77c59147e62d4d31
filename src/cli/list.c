/* SPDX-License-Identifier: BSD-3-Clause */
/* pdio list [--json]: what pdio attached, checked against the kernel and
 * the process table, in columns like losetup --list or JSON like
 * losetup --json; the JSON adds what each device costs in memory (its
 * server's and supervisor's RSS and PSS, null where they cannot be
 * read).  STATUS is "ok" ("ok, unsupervised" once the supervisor is
 * gone), or says what is stale: "server gone" (its server exited and no
 * supervisor replaces it) or "disconnected" (the device is no longer
 * connected); "pdio detach" cleans up either.  While the supervisor
 * brings a server back it is "restarting"; if it gave up, "failed: WHY".
 * Once a server was restarted, the text adds the last reason, the JSON
 * has it in "reason" with "restarts" and the supervisor's pid.  A device
 * pdio connected but has no record of (an attach killed half way:
 * attachments.c) is listed too: "no record: attach was interrupted; pdio
 * detach /dev/nbdN".  A live device whose processes lack their
 * protections under memory pressure (protect.c) says so after "ok": "no
 * IO_FLUSHER" (a thread of the server or the supervisor without it),
 * "OOM-killable (oom_score_adj N)"; the JSON has them as "io_flusher",
 * "oom_score_adj" and, where they live, "cgroup".
 */
#include <config.h>

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "pdio.h"

#define CMD "pdio list"

struct row {
  const struct record *r;
  char status[400];             /* a reason, and some */
  int64_t cached;               /* bytes, -1 unknown */
  /* Of the live processes, from /proc: every thread of the server and
   * of the supervisor has PR_SET_IO_FLUSHER's flags (1), one lacks them
   * (0), no live server (-1); the server's oom_score_adj and cgroup.
   */
  int io_flusher;
  bool have_oom, have_cgroup;
  int oom;
  char cgroup[PATH_MAX];
};

static void
usage (FILE *fp)
{
  fprintf (fp,
"Usage: pdio list [--json] [--noheadings]\n"
"Show the devices pdio attached: device, image, read-only, connections,\n"
"block size, direct-I/O alignment, server pid, how often the server was\n"
"restarted, the image's bytes in the page cache (expected: 0), its size\n"
"as served (pdio resize changes it) and whether the attachment is alive;\n"
"also a device pdio connected but has no record of (its attach was killed).\n"
"\n"
"  -J, --json             as JSON, with the front end (pdio or nbdkit), the\n"
"                         backend identifier, the device's by-pdio name,\n"
"                         the supervisor's pid, and the\n"
"                         memory of the server and of the supervisor (RSS\n"
"                         and PSS in bytes, from /proc/PID/smaps_rollup);\n"
"                         whether all their threads have PR_SET_IO_FLUSHER,\n"
"                         the server's oom_score_adj and cgroup\n"
"  -n, --noheadings       no header line\n");
}

/* A remote device's: its link ("connected", "reconnecting since 12:03:04
 * (8 s): why", "failed: why") and its outages, or "disconnected".
 */
static void
remote_status_of (const struct record *r, char *buf, size_t len)
{
  bool supervised = pid_is_supervisor (r->supervisor_pid);
  char since[32] = "?";
  time_t t = r->link_since;
  struct tm tm;
  int n;

  if (!device_is_ours (r)) {
    snprintf (buf, len, "disconnected");
    return;
  }
  if (localtime_r (&t, &tm))
    strftime (since, sizeof since, "%F %T", &tm);
  if (strcmp (r->link, "reconnecting") == 0)
    n = snprintf (buf, len, "reconnecting since %s (%lld s)%s%s", since,
                  (long long) (time (NULL) - t), r->link_why[0] ? ": " : "",
                  r->link_why);
  else if (strcmp (r->link, "failed") == 0)
    n = snprintf (buf, len, "failed: %s (since %s)", r->link_why, since);
  else if (r->tls[0])
    n = snprintf (buf, len, "connected, TLS by %s",
                  strcmp (r->tls, "ktls") == 0 ? "kTLS" : "a relay");
  else
    n = snprintf (buf, len, "connected");
  if (n > 0 && (size_t) n < len && r->outages) {
    n += snprintf (buf + n, len - n, ", %u outage%s", r->outages,
                   r->outages == 1 ? "" : "s");
    if (n > 0 && (size_t) n < len && r->last_outage_ms)
      n += snprintf (buf + n, len - n, " (last over after %ld ms)",
                     r->last_outage_ms);
  }
  if (n > 0 && (size_t) n < len && !supervised)
    snprintf (buf + n, len - n, ", unsupervised");
}

static void
status_of (const struct record *r, char *buf, size_t len)
{
  bool supervised = pid_is_supervisor (r->supervisor_pid);

  if (r->remote)
    remote_status_of (r, buf, len);
  else if (r->orphan)
    snprintf (buf, len, "no record: attach was interrupted; pdio detach %s",
              r->device);
  else if (r->gave_up)
    snprintf (buf, len, "failed: %s", r->reason);
  else if (!pid_alive (r->server_pid) || !pid_is_server (r->server_pid))
    snprintf (buf, len, "%s", supervised ? "restarting" : "server gone");
  else if (!device_is_ours (r))
    snprintf (buf, len, "disconnected");
  else
    snprintf (buf, len, "%s", supervised ? "ok" : "ok, unsupervised");
}

/* What /proc says of the protections of r's live processes. */
static void
protection_of (const struct record *r, struct row *row)
{
  pid_t server = pid_is_server (r->server_pid) ? r->server_pid : 0;
  pid_t supervisor = pid_is_supervisor (r->supervisor_pid)
                     ? r->supervisor_pid : 0;
  size_t n;

  row->io_flusher = -1;
  if (server == 0)
    return;
  row->io_flusher = proc_io_flusher (server);
  if (row->io_flusher == 1 && supervisor)
    row->io_flusher = proc_io_flusher (supervisor) == 1;
  row->have_oom = proc_oom_score_adj (server, &row->oom);
  row->have_cgroup = proc_cgroup (server, row->cgroup, sizeof row->cgroup);
  /* Said only where all is well otherwise. */
  if (strncmp (row->status, "ok", 2) != 0)
    return;
  n = strlen (row->status);
  if (row->io_flusher == 0)
    n += snprintf (row->status + n, sizeof row->status - n,
                   ", no IO_FLUSHER");
  if (row->have_oom && row->oom > -1000 && n < sizeof row->status)
    snprintf (row->status + n, sizeof row->status - n,
              ", OOM-killable (oom_score_adj %d)", row->oom);
}

static void
print_table (const struct row *rows, size_t n, bool headings)
{
  int w = 5;                    /* "IMAGE" */

  for (size_t i = 0; i < n; i++)
    if ((int) strlen (rows[i].r->image) > w)
      w = strlen (rows[i].r->image);
  if (headings)
    printf ("%-10s %-*s RO CONNS BLOCK-SIZE DIO-ALIGN     PID RESTARTS CACHED "
            "%14s STATUS\n",
            "NAME", w, "IMAGE", "SIZE");
  for (size_t i = 0; i < n; i++) {
    const struct record *r = rows[i].r;
    char cached[24];

    if (rows[i].cached < 0)
      snprintf (cached, sizeof cached, "-");
    else
      snprintf (cached, sizeof cached, "%" PRId64, rows[i].cached);
    printf ("%-10s %-*s %2d %5u %10" PRIu32 " %9" PRIu32 " %7d %8u %6s %14"
            PRIu64 " %s",
            r->device, w, r->image, r->readonly, r->connections,
            r->block_size, r->dio_align, (int) r->server_pid, r->restarts,
            cached, r->size, rows[i].status);
    if (r->restarts && !r->gave_up)
      printf (" (last restart: %s)", r->reason);
    putchar ('\n');
  }
}

/* A process's RSS and PSS in bytes, or null if it cannot be read. */
static void
json_memory (const char *what, pid_t pid)
{
  uint64_t rss, pss;

  if (pid > 0 && proc_memory (pid, &rss, &pss))
    printf ("         \"%s-rss\": %" PRIu64 ",\n"
            "         \"%s-pss\": %" PRIu64 ",\n", what, rss, what, pss);
  else
    printf ("         \"%s-rss\": null,\n         \"%s-pss\": null,\n",
            what, what);
}

static void
print_json (const struct row *rows, size_t n)
{
  printf ("{\n   \"nbddevices\": [");
  for (size_t i = 0; i < n; i++) {
    const struct record *r = rows[i].r;
    pid_t supervisor = pid_is_supervisor (r->supervisor_pid)
                       ? r->supervisor_pid : 0;
    pid_t server = pid_is_server (r->server_pid) ? r->server_pid : 0;

    printf ("%s\n      {\n         \"name\": ", i ? "," : "");
    json_string (stdout, r->device);
    printf (",\n         \"back-file\": ");
    json_string (stdout, r->image);
    printf (",\n         \"ro\": %s,\n         \"connections\": %u,\n"
            "         \"block-size\": %" PRIu32 ",\n"
            "         \"dio-align\": %" PRIu32 ",\n"
            "         \"size\": %" PRIu64 ",\n         \"pid\": %d,\n",
            r->readonly ? "true" : "false", r->connections, r->block_size,
            r->dio_align, r->size, (int) r->server_pid);
    if (rows[i].cached < 0)
      printf ("         \"cached\": null,\n");
    else
      printf ("         \"cached\": %" PRId64 ",\n", rows[i].cached);
    printf ("         \"front-end\": \"%s\",\n",
            r->nbdkit ? "nbdkit" : "pdio");
    json_memory ("server", server);
    json_memory ("supervisor", supervisor);
    printf ("         \"supervisor\": %d,\n         \"restarts\": %u,\n"
            "         \"reason\": ", (int) supervisor, r->restarts);
    if (r->reason[0])
      json_string (stdout, r->reason);
    else
      printf ("null");
    printf (",\n         \"timeout\": %u,\n         \"dead-timeout\": %u,\n"
            "         \"autoclear\": %s,\n", r->timeout, r->dead_timeout,
            r->autoclear ? "true" : "false");
    printf ("         \"backend\": ");
    if (r->backend[0])
      json_string (stdout, r->backend);
    else
      printf ("null");
    {
      char alias[ALIAS_MAX + 1], link[ALIAS_MAX + 32];

      backend_alias (r->backend, alias);
      printf (",\n         \"by-pdio\": ");
      if (alias[0]) {
        snprintf (link, sizeof link, "/dev/disk/by-pdio/%s", alias);
        json_string (stdout, link);
      }
      else
        printf ("null");
    }
    printf (",\n         \"io_flusher\": %s,\n         \"oom_score_adj\": ",
            rows[i].io_flusher < 0 ? "null"
            : rows[i].io_flusher ? "true" : "false");
    if (rows[i].have_oom)
      printf ("%d", rows[i].oom);
    else
      printf ("null");
    printf (",\n         \"cgroup\": ");
    if (rows[i].have_cgroup)
      json_string (stdout, rows[i].cgroup);
    else
      printf ("null");
    printf (",\n         \"socket\": ");
    json_string (stdout, r->socket);
    printf (",\n         \"remote\": %s", r->remote ? "true" : "false");
    if (r->remote) {
      printf (",\n         \"shared\": %s,\n         \"link\": ",
              r->shared ? "true" : "false");
      json_string (stdout, r->link);
      printf (",\n         \"link-since\": %lld,\n         \"link-why\": ",
              r->link_since);
      if (r->link_why[0])
        json_string (stdout, r->link_why);
      else
        printf ("null");
      printf (",\n         \"outages\": %u,\n"
              "         \"last-outage-ms\": %ld", r->outages,
              r->last_outage_ms);
      printf (",\n         \"tls\": ");
      if (r->tls[0])
        json_string (stdout, r->tls);
      else
        printf ("null");
    }
    printf (",\n         \"status\": ");
    json_string (stdout, rows[i].status);
    printf ("\n      }");
  }
  printf ("%s]\n}\n", n ? "\n   " : "");
}

int
cmd_list (int argc, char **argv)
{
  static const struct option longopts[] = {
    { "json", no_argument, NULL, 'J' },
    { "noheadings", no_argument, NULL, 'n' },
    { "help", no_argument, NULL, 'h' },
    { NULL, 0, NULL, 0 },
  };
  bool json = false, headings = true;
  struct record *recs;
  struct row *rows;
  size_t n;
  int c;

  while ((c = getopt_long (argc, argv, "+Jnh", longopts, NULL)) != -1)
    switch (c) {
    case 'J': json = true; break;
    case 'n': headings = false; break;
    case 'h': usage (stdout); return EXIT_OK;
    default: usage (stderr); return EXIT_USAGE;
    }
  if (optind != argc) {
    errorf (CMD ": unexpected argument: %s", argv[optind]);
    return EXIT_USAGE;
  }
  /* The records live in a root-only directory: an empty table would
   * tell another user that nothing is attached. */
  if (access (rundir (), R_OK | X_OK) == -1 && errno != ENOENT) {
    int err = errno;

    errorf (CMD ": cannot read %s, where attachments are recorded: %s "
            "(run pdio list as root)", rundir (), strerror (err));
    return err == EACCES ? EXIT_NOT_ROOT : EXIT_FAILED;
  }
  recs = attachments_load (&n);
  rows = calloc (n ? n : 1, sizeof *rows);
  if (rows == NULL) {
    errorf (CMD ": %m");
    free (recs);
    return EXIT_FAILED;
  }
  for (size_t i = 0; i < n; i++) {
    rows[i].r = &recs[i];
    status_of (&recs[i], rows[i].status, sizeof rows[i].status);
    protection_of (&recs[i], &rows[i]);
    rows[i].cached = recs[i].remote ? -1
                                    : image_cached_bytes (recs[i].image);
  }
  if (json)
    print_json (rows, n);
  else
    print_table (rows, n, headings);
  free (rows);
  free (recs);
  return EXIT_OK;
}
