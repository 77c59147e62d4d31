/* SPDX-License-Identifier: BSD-3-Clause */
/* pdio stats [--json | --prometheus | --watch S] [DEVICE|IMAGE | --file F]:
 * the counters the servers of an attachment keep in RUNDIR/NAME.stats
 * (server.h, "a device's counters"), read from the file alone: no server
 * is asked anything, and a dead or hung one does not stop the reading.
 * Beside them, the kernel's own view of the device (/sys/block/nbdN/stat
 * and inflight) and the image's bytes in the page cache (0 expected).
 * Percentiles are read from the histogram: the upper bound of the bucket
 * the rank falls in, so within a bucket's width (19 %) above the truth.
 */
#include <config.h>

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "server.h"
#include "pdio.h"

#define CMD "pdio stats"

static const char *const op_names[PDIO_DEVSTATS_OPS] = {
  "read", "write", "flush", "trim", "zero", "block_status", "other",
};
static const char *const err_names[PDIO_DEVSTATS_ERRS] = {
  "EPERM", "EIO", "ENOMEM", "EINVAL", "ENOSPC", "EOVERFLOW", "ENOTSUP",
  "ESHUTDOWN", "other",
};

/* /sys/block/nbdN/stat (Documentation/block/stat.rst) and inflight. */
struct kstat {
  bool ok;
  uint64_t rd_ios, rd_sectors, rd_ticks, wr_ios, wr_sectors, wr_ticks;
  uint64_t in_flight, io_ticks;
  uint64_t dc_ios, dc_sectors, fl_ios;
  uint64_t inflight_rd, inflight_wr;
};

/* One device as read now. */
struct snap {
  char device[PATH_MAX];        /* /dev/nbdN, or the --file */
  char image[PATH_MAX];
  struct pdio_devstats h;       /* the header's counters */
  struct pdio_devstats_op op[PDIO_DEVSTATS_OPS];
  struct kstat k;
  int64_t cached;               /* -1: unknown */
  uint64_t at_ns;               /* CLOCK_MONOTONIC */
  char why[PATH_MAX + 64];      /* not read: why ("" if read) */
};

static void
usage (FILE *fp)
{
  fprintf (fp,
"Usage: pdio stats [--json | --prometheus | --watch SECONDS]\n"
"                  [DEVICE|IMAGE | --file FILE]\n"
"Show each attached device's counters, kept by its servers across\n"
"restarts: per operation requests, bytes, errors by errno, requests in\n"
"flight, latency percentiles; restarts, hand-overs and pauses; beside\n"
"them the kernel's view of the device and the image's cached bytes.\n"
"\n"
"      --json             as JSON\n"
"      --prometheus       in Prometheus's text format, with histograms\n"
"      --watch SECONDS    rates per interval, like iostat -x, until\n"
"                         interrupted\n"
"      --file FILE        the counters pdio serve --stats FILE keeps\n");
}

static uint64_t
mono_ns (void)
{
  struct timespec ts;

  clock_gettime (CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * UINT64_C (1000000000) + ts.tv_nsec;
}

static void
read_kstat (const char *device, struct kstat *k)
{
  const char *base = strrchr (device, '/');
  char path[PATH_MAX], line[512];
  uint64_t f[17] = { 0 };
  int n;

  *k = (struct kstat) { .ok = false };
  if (base == NULL || strncmp (base + 1, "nbd", 3) != 0)
    return;
  snprintf (path, sizeof path, "%s/block/%s/stat", sysfs (), base + 1);
  if (!read_line (path, line, sizeof line))
    return;
  n = sscanf (line, "%" SCNu64 " %" SCNu64 " %" SCNu64 " %" SCNu64 " %"
              SCNu64 " %" SCNu64 " %" SCNu64 " %" SCNu64 " %" SCNu64 " %"
              SCNu64 " %" SCNu64 " %" SCNu64 " %" SCNu64 " %" SCNu64 " %"
              SCNu64 " %" SCNu64 " %" SCNu64, &f[0], &f[1], &f[2], &f[3],
              &f[4], &f[5], &f[6], &f[7], &f[8], &f[9], &f[10], &f[11],
              &f[12], &f[13], &f[14], &f[15], &f[16]);
  if (n < 11)
    return;
  k->ok = true;
  k->rd_ios = f[0]; k->rd_sectors = f[2]; k->rd_ticks = f[3];
  k->wr_ios = f[4]; k->wr_sectors = f[6]; k->wr_ticks = f[7];
  k->in_flight = f[8]; k->io_ticks = f[9];
  k->dc_ios = f[11]; k->dc_sectors = f[13]; k->fl_ios = f[15];
  snprintf (path, sizeof path, "%s/block/%s/inflight", sysfs (), base + 1);
  if (read_line (path, line, sizeof line))
    sscanf (line, "%" SCNu64 " %" SCNu64, &k->inflight_rd, &k->inflight_wr);
}

/* Reads path into s; false with s->why set if it cannot be. */
static bool
take (const char *path, struct snap *s)
{
  struct pdio_devstats_map m;

  if (pdio_devstats_open_ro (path, &m, s->why, sizeof s->why) < 0)
    return false;
  pdio_devstats_sum (&m, s->op);
  s->h = (struct pdio_devstats) {
    .created = m.h->created,
    .server_starts = pdio_devstats_get (&m.h->server_starts),
    .restarts = pdio_devstats_get (&m.h->restarts),
    .handovers = pdio_devstats_get (&m.h->handovers),
    .reconnects = pdio_devstats_get (&m.h->reconnects),
    .longest_pause_ns = pdio_devstats_get (&m.h->longest_pause_ns),
    .last_pause_ns = pdio_devstats_get (&m.h->last_pause_ns),
    .n_slots = m.h->n_slots,
  };
  pdio_devstats_close (&m);
  s->why[0] = '\0';
  return true;
}

/* Every device asked for, read now, from the --file or the records;
 * with cached, the image's page cache too (mincore over all of it: not
 * for every interval of --watch, which does not show it).
 */
static struct snap *
snapshot (const char *file, const struct record *recs, size_t n,
          bool cached, size_t *out_n)
{
  struct snap *v = calloc (n ? n : 1, sizeof *v);

  *out_n = 0;
  if (v == NULL)
    return NULL;
  if (file) {
    snprintf (v[0].device, sizeof v[0].device, "%s", file);
    v[0].cached = -1;
    v[0].at_ns = mono_ns ();
    take (file, &v[0]);
    *out_n = 1;
    return v;
  }
  for (size_t i = 0; i < n; i++) {
    struct snap *s = &v[*out_n];
    char path[PATH_MAX];

    /* Remote exports and nbdkit's servers keep no counters. */
    if (recs[i].remote || recs[i].nbdkit || recs[i].orphan)
      continue;
    snprintf (s->device, sizeof s->device, "%s", recs[i].device);
    snprintf (s->image, sizeof s->image, "%s", recs[i].image);
    state_path (recs[i].name, "stats", path, sizeof path);
    s->at_ns = mono_ns ();
    take (path, s);
    read_kstat (s->device, &s->k);
    s->cached = cached ? image_cached_bytes (s->image) : -1;
    (*out_n)++;
  }
  return v;
}

static uint64_t
sum (const uint64_t *v, size_t n)
{
  uint64_t t = 0;

  for (size_t i = 0; i < n; i++)
    t += v[i];
  return t;
}

static uint64_t
total_errors (const struct pdio_devstats_op *op)
{
  return sum (op->errors, PDIO_DEVSTATS_ERRS);
}

static uint64_t
count_of (const struct pdio_devstats_op *op)
{
  return sum (op->buckets, PDIO_DEVSTATS_BUCKETS);
}

/* The latency below which q of the requests fall, in ns: a bucket's upper
 * bound; UINT64_MAX past the last finite one; 0 if none.
 */
static uint64_t
percentile (const struct pdio_devstats_op *op, double q)
{
  uint64_t n = count_of (op), rank, seen = 0;

  if (n == 0)
    return 0;
  rank = (uint64_t) (q * n + 0.999999);
  if (rank == 0)
    rank = 1;
  for (int b = 0; b < PDIO_DEVSTATS_FINITE; b++) {
    seen += op->buckets[b];
    if (seen >= rank)
      return pdio_devstats_le_ns (b);
  }
  return UINT64_MAX;
}

static const char *
human_ns (uint64_t ns, char *buf, size_t len)
{
  if (ns == 0)
    snprintf (buf, len, "-");
  else if (ns == UINT64_MAX)
    snprintf (buf, len, ">67s");
  else if (ns < 1000000)
    snprintf (buf, len, "%.1fus", ns / 1e3);
  else if (ns < UINT64_C (1000000000))
    snprintf (buf, len, "%.1fms", ns / 1e6);
  else
    snprintf (buf, len, "%.2fs", ns / 1e9);
  return buf;
}

/* --- text ------------------------------------------------------------------ */
static void
print_text (const struct snap *v, size_t n)
{
  for (size_t i = 0; i < n; i++) {
    const struct snap *s = &v[i];
    char a[24], b[24], c[24];

    if (i)
      putchar ('\n');
    printf ("%s %s\n", s->device, s->image[0] ? s->image : "");
    if (s->why[0]) {
      printf ("  no counters: %s\n", s->why);
      continue;
    }
    printf ("  servers %" PRIu64 ", restarts %" PRIu64 ", hand-overs %"
            PRIu64 ", reconnects %" PRIu64 ", longest pause %s, last %s\n",
            s->h.server_starts, s->h.restarts, s->h.handovers,
            s->h.reconnects, human_ns (s->h.longest_pause_ns, a, sizeof a),
            human_ns (s->h.last_pause_ns, b, sizeof b));
    printf ("  %-12s %10s %14s %7s %8s %5s %7s %9s %9s %9s\n", "OPERATION",
            "REQUESTS", "BYTES", "ERRORS", "INFLIGHT", "MAX", "DROPPED",
            "P50", "P99", "P99.9");
    for (int k = 0; k < PDIO_DEVSTATS_OPS; k++) {
      const struct pdio_devstats_op *op = &s->op[k];

      printf ("  %-12s %10" PRIu64 " %14" PRIu64 " %7" PRIu64 " %8" PRIu64
              " %5" PRIu64 " %7" PRIu64 " %9s %9s %9s\n", op_names[k],
              op->requests, op->bytes, total_errors (op),
              op->started - op->finished, op->max_in_flight, op->dropped,
              human_ns (percentile (op, 0.50), a, sizeof a),
              human_ns (percentile (op, 0.99), b, sizeof b),
              human_ns (percentile (op, 0.999), c, sizeof c));
    }
    for (int k = 0; k < PDIO_DEVSTATS_OPS; k++)
      for (int e = 0; e < PDIO_DEVSTATS_ERRS; e++)
        if (s->op[k].errors[e])
          printf ("  errors: %s %s %" PRIu64 "\n", op_names[k], err_names[e],
                  s->op[k].errors[e]);
    if (s->k.ok)
      printf ("  kernel: reads %" PRIu64 " (%" PRIu64 " bytes), writes %"
              PRIu64 " (%" PRIu64 " bytes), discards %" PRIu64 ", flushes %"
              PRIu64 ", in flight %" PRIu64 " (read %" PRIu64 ", write %"
              PRIu64 ")\n", s->k.rd_ios, s->k.rd_sectors * 512, s->k.wr_ios,
              s->k.wr_sectors * 512, s->k.dc_ios, s->k.fl_ios, s->k.in_flight,
              s->k.inflight_rd, s->k.inflight_wr);
    if (s->cached >= 0)
      printf ("  page cache: %" PRId64 " bytes of the image\n", s->cached);
  }
}

/* --- JSON ------------------------------------------------------------------ */
static void
print_json (const struct snap *v, size_t n)
{
  printf ("{\n  \"devices\": [");
  for (size_t i = 0; i < n; i++) {
    const struct snap *s = &v[i];

    printf ("%s\n    {\n      \"device\": ", i ? "," : "");
    json_string (stdout, s->device);
    printf (",\n      \"image\": ");
    json_string (stdout, s->image);
    if (s->why[0]) {
      printf (",\n      \"error\": ");
      json_string (stdout, s->why);
      printf ("\n    }");
      continue;
    }
    printf (",\n      \"server_starts\": %" PRIu64 ",\n      \"restarts\": %"
            PRIu64 ",\n      \"handovers\": %" PRIu64 ",\n"
            "      \"reconnects\": %" PRIu64 ",\n      \"longest_pause_ns\": %"
            PRIu64 ",\n      \"last_pause_ns\": %" PRIu64 ",\n"
            "      \"operations\": {", s->h.server_starts, s->h.restarts,
            s->h.handovers, s->h.reconnects, s->h.longest_pause_ns,
            s->h.last_pause_ns);
    for (int k = 0; k < PDIO_DEVSTATS_OPS; k++) {
      const struct pdio_devstats_op *op = &s->op[k];
      const double qs[3] = { 0.50, 0.99, 0.999 };
      const char *qn[3] = { "p50_ns", "p99_ns", "p999_ns" };
      bool first = true;

      printf ("%s\n        \"%s\": {\"requests\": %" PRIu64 ", \"bytes\": %"
              PRIu64 ", \"in_flight\": %" PRIu64 ", \"max_in_flight\": %"
              PRIu64 ", \"dropped\": %" PRIu64 ", \"latency_sum_ns\": %"
              PRIu64 ", \"errors\": {", k ? "," : "", op_names[k],
              op->requests, op->bytes, op->started - op->finished,
              op->max_in_flight, op->dropped, op->latency_sum_ns);
      for (int e = 0; e < PDIO_DEVSTATS_ERRS; e++)
        printf ("%s\"%s\": %" PRIu64, e ? ", " : "", err_names[e],
                op->errors[e]);
      printf ("}");
      for (int q = 0; q < 3; q++) {
        uint64_t p = percentile (op, qs[q]);

        if (p == 0 || p == UINT64_MAX)
          printf (", \"%s\": null", qn[q]);
        else
          printf (", \"%s\": %" PRIu64, qn[q], p);
      }
      /* The buckets that counted something: [upper bound or null, n]. */
      printf (", \"histogram\": [");
      for (int b = 0; b < PDIO_DEVSTATS_BUCKETS; b++) {
        if (op->buckets[b] == 0)
          continue;
        if (b < PDIO_DEVSTATS_FINITE)
          printf ("%s[%" PRIu64 ", %" PRIu64 "]", first ? "" : ", ",
                  pdio_devstats_le_ns (b), op->buckets[b]);
        else
          printf ("%s[null, %" PRIu64 "]", first ? "" : ", ", op->buckets[b]);
        first = false;
      }
      printf ("]}");
    }
    printf ("\n      },\n      \"kernel\": ");
    if (s->k.ok)
      printf ("{\"read_ios\": %" PRIu64 ", \"read_bytes\": %" PRIu64
              ", \"read_ticks_ms\": %" PRIu64 ", \"write_ios\": %" PRIu64
              ", \"write_bytes\": %" PRIu64 ", \"write_ticks_ms\": %" PRIu64
              ", \"discard_ios\": %" PRIu64 ", \"flush_ios\": %" PRIu64
              ", \"in_flight\": %" PRIu64 ", \"in_flight_read\": %" PRIu64
              ", \"in_flight_write\": %" PRIu64 "}", s->k.rd_ios,
              s->k.rd_sectors * 512, s->k.rd_ticks, s->k.wr_ios,
              s->k.wr_sectors * 512, s->k.wr_ticks, s->k.dc_ios, s->k.fl_ios,
              s->k.in_flight, s->k.inflight_rd, s->k.inflight_wr);
    else
      printf ("null");
    if (s->cached >= 0)
      printf (",\n      \"cached\": %" PRId64 "\n    }", s->cached);
    else
      printf (",\n      \"cached\": null\n    }");
  }
  printf ("%s]\n}\n", n ? "\n  " : "");
}

/* --- Prometheus's text format ---------------------------------------------- */
/* A label value: backslash, double quote and newline escaped. */
static void
prom_value (const char *s)
{
  for (; *s; s++)
    if (*s == '\\' || *s == '"')
      printf ("\\%c", *s);
    else if (*s == '\n')
      printf ("\\n");
    else
      putchar (*s);
}

/* The labels of a sample, its brace left open for more. */
static void
prom_labels (const struct snap *s, const char *op)
{
  printf ("{device=\"");
  prom_value (s->device);
  printf ("\",image=\"");
  prom_value (s->image);
  if (op)
    printf ("\",operation=\"%s", op);
  printf ("\"");
}

static void
prom_head (const char *name, const char *type, const char *help)
{
  printf ("# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* One sample per operation of each device; field: an offset in an op. */
static void
prom_per_op (const struct snap *v, size_t n, const char *name,
             const char *type, const char *help, size_t field, bool gauge_in)
{
  prom_head (name, type, help);
  for (size_t i = 0; i < n; i++) {
    if (v[i].why[0])
      continue;
    for (int k = 0; k < PDIO_DEVSTATS_OPS; k++) {
      const struct pdio_devstats_op *op = &v[i].op[k];
      uint64_t x = gauge_in ? op->started - op->finished
                            : *(const uint64_t *) ((const char *) op + field);

      printf ("%s", name);
      prom_labels (&v[i], op_names[k]);
      printf ("} %" PRIu64 "\n", x);
    }
  }
}

static void
prom_per_dev (const struct snap *v, size_t n, const char *name,
              const char *type, const char *help, size_t field, double scale)
{
  prom_head (name, type, help);
  for (size_t i = 0; i < n; i++) {
    uint64_t x;

    if (v[i].why[0])
      continue;
    x = *(const uint64_t *) ((const char *) &v[i].h + field);
    printf ("%s", name);
    prom_labels (&v[i], NULL);
    if (scale == 1)
      printf ("} %" PRIu64 "\n", x);
    else
      printf ("} %.9g\n", x * scale);
  }
}

/* The device's counters of its servers, one metric each. */
static const struct {
  const char *name, *type, *help;
  size_t field;
  double scale;
} per_dev[] = {
  { "pdio_server_starts_total", "counter",
    "Servers that served the device (and mapped its counters).",
    offsetof (struct pdio_devstats, server_starts), 1 },
  { "pdio_restarts_total", "counter",
    "Servers the supervisor replaced after a death or hang.",
    offsetof (struct pdio_devstats, restarts), 1 },
  { "pdio_handovers_total", "counter",
    "Live hand-overs to a new server (pdio restart).",
    offsetof (struct pdio_devstats, handovers), 1 },
  { "pdio_reconnects_total", "counter",
    "Fresh connections given to a server that lived.",
    offsetof (struct pdio_devstats, reconnects), 1 },
  { "pdio_longest_pause_seconds", "gauge",
    "The longest the device waited for a new server.",
    offsetof (struct pdio_devstats, longest_pause_ns), 1e-9 },
};

static void
print_prometheus (const struct snap *v, size_t n)
{
  prom_per_op (v, n, "pdio_requests_total", "counter",
               "Requests answered (their reply sent), by operation.",
               offsetof (struct pdio_devstats_op, requests), false);
  prom_per_op (v, n, "pdio_bytes_total", "counter",
               "Bytes of the requests that succeeded (their length).",
               offsetof (struct pdio_devstats_op, bytes), false);
  prom_head ("pdio_errors_total", "counter",
             "Requests answered with an error, by the errno NBD carries.");
  for (size_t i = 0; i < n; i++)
    for (int k = 0; !v[i].why[0] && k < PDIO_DEVSTATS_OPS; k++)
      for (int e = 0; e < PDIO_DEVSTATS_ERRS; e++) {
        printf ("pdio_errors_total");
        prom_labels (&v[i], op_names[k]);
        printf (",errno=\"%s\"} %" PRIu64 "\n", err_names[e],
                v[i].op[k].errors[e]);
      }
  prom_per_op (v, n, "pdio_dropped_total", "counter",
               "Requests that ended without a reply (connection or server "
               "gone).", offsetof (struct pdio_devstats_op, dropped), false);
  prom_per_op (v, n, "pdio_in_flight", "gauge",
               "Requests between their header and their reply now.", 0, true);
  prom_per_op (v, n, "pdio_max_in_flight", "gauge",
               "The most requests one worker thread held at once.",
               offsetof (struct pdio_devstats_op, max_in_flight), false);
  prom_head ("pdio_request_duration_seconds", "histogram",
             "From the request's header received to its reply sent.");
  for (size_t i = 0; i < n; i++)
    for (int k = 0; !v[i].why[0] && k < PDIO_DEVSTATS_OPS; k++) {
      const struct pdio_devstats_op *op = &v[i].op[k];
      uint64_t cum = 0;

      for (int b = 0; b < PDIO_DEVSTATS_FINITE; b++) {
        cum += op->buckets[b];
        printf ("pdio_request_duration_seconds_bucket");
        prom_labels (&v[i], op_names[k]);
        printf (",le=\"%.9g\"} %" PRIu64 "\n",
                pdio_devstats_le_ns (b) / 1e9, cum);
      }
      cum += op->buckets[PDIO_DEVSTATS_FINITE];
      printf ("pdio_request_duration_seconds_bucket");
      prom_labels (&v[i], op_names[k]);
      printf (",le=\"+Inf\"} %" PRIu64 "\n", cum);
      printf ("pdio_request_duration_seconds_sum");
      prom_labels (&v[i], op_names[k]);
      printf ("} %.9g\n", op->latency_sum_ns / 1e9);
      printf ("pdio_request_duration_seconds_count");
      prom_labels (&v[i], op_names[k]);
      printf ("} %" PRIu64 "\n", cum);
    }
  for (size_t j = 0; j < sizeof per_dev / sizeof *per_dev; j++)
    prom_per_dev (v, n, per_dev[j].name, per_dev[j].type, per_dev[j].help,
                  per_dev[j].field, per_dev[j].scale);
  prom_head ("pdio_image_cached_bytes", "gauge",
             "The image's bytes in the host page cache (0 expected).");
  for (size_t i = 0; i < n; i++)
    if (v[i].cached >= 0) {
      printf ("pdio_image_cached_bytes");
      prom_labels (&v[i], NULL);
      printf ("} %" PRId64 "\n", v[i].cached);
    }
}

/* --- --watch ---------------------------------------------------------------- */
static double
per_s (uint64_t d, double secs)
{
  return secs > 0 ? d / secs : 0;
}

/* Mean latency in ms of the requests of op answered between a and b. */
static double
await_ms (const struct pdio_devstats_op *a, const struct pdio_devstats_op *b)
{
  uint64_t n = b->requests - a->requests;

  return n ? (b->latency_sum_ns - a->latency_sum_ns) / 1e6 / n : 0;
}

static void
print_rates (const struct snap *a, const struct snap *b, size_t n)
{
  char stamp[16];
  time_t t = time (NULL);

  strftime (stamp, sizeof stamp, "%T", localtime (&t));
  printf ("%-10s %9s %10s %8s %9s %10s %8s %8s %8s %8s %10s %8s %8s %8s\n",
          stamp, "r/s", "rkB/s", "r_await", "w/s", "wkB/s", "w_await",
          "f/s", "f_await", "d/s", "dkB/s", "z/s", "err/s", "inflight");
  for (size_t i = 0; i < n; i++) {
    const struct pdio_devstats_op *x = a[i].op, *y = b[i].op;
    double secs = (b[i].at_ns - a[i].at_ns) / 1e9;
    uint64_t errs = 0, fl = 0;

    if (b[i].why[0] || a[i].why[0]) {
      printf ("%-10s %s\n", b[i].device, b[i].why[0] ? b[i].why : a[i].why);
      continue;
    }
    for (int k = 0; k < PDIO_DEVSTATS_OPS; k++) {
      errs += total_errors (&y[k]) - total_errors (&x[k]);
      fl += y[k].started - y[k].finished;
    }
    printf ("%-10s %9.1f %10.1f %8.3f %9.1f %10.1f %8.3f %8.1f %8.3f %8.1f "
            "%10.1f %8.1f %8.1f %8" PRIu64 "\n", b[i].device,
            per_s (y[PDIO_OPK_READ].requests - x[PDIO_OPK_READ].requests,
                   secs),
            per_s (y[PDIO_OPK_READ].bytes - x[PDIO_OPK_READ].bytes, secs)
              / 1024,
            await_ms (&x[PDIO_OPK_READ], &y[PDIO_OPK_READ]),
            per_s (y[PDIO_OPK_WRITE].requests - x[PDIO_OPK_WRITE].requests,
                   secs),
            per_s (y[PDIO_OPK_WRITE].bytes - x[PDIO_OPK_WRITE].bytes, secs)
              / 1024,
            await_ms (&x[PDIO_OPK_WRITE], &y[PDIO_OPK_WRITE]),
            per_s (y[PDIO_OPK_FLUSH].requests - x[PDIO_OPK_FLUSH].requests,
                   secs),
            await_ms (&x[PDIO_OPK_FLUSH], &y[PDIO_OPK_FLUSH]),
            per_s (y[PDIO_OPK_TRIM].requests - x[PDIO_OPK_TRIM].requests,
                   secs),
            per_s (y[PDIO_OPK_TRIM].bytes - x[PDIO_OPK_TRIM].bytes, secs)
              / 1024,
            per_s (y[PDIO_OPK_ZERO].requests - x[PDIO_OPK_ZERO].requests,
                   secs),
            per_s (errs, secs), fl);
  }
  fflush (stdout);
}

static int
watch (const char *file, const struct record *recs, size_t nrec,
       unsigned secs)
{
  struct snap *a, *b;
  struct timespec next;
  size_t na, nb;

  a = snapshot (file, recs, nrec, false, &na);
  if (a == NULL) {
    errorf (CMD ": %m");
    return EXIT_FAILED;
  }
  /* On a fixed schedule, so that reading does not stretch the intervals
   * (each rate is over the time its two readings were apart anyway).
   */
  clock_gettime (CLOCK_MONOTONIC, &next);
  for (;;) {
    next.tv_sec += secs;
    while (clock_nanosleep (CLOCK_MONOTONIC, TIMER_ABSTIME, &next, NULL) ==
           EINTR)
      ;
    b = snapshot (file, recs, nrec, false, &nb);
    if (b == NULL) {
      errorf (CMD ": %m");
      free (a);
      return EXIT_FAILED;
    }
    /* The same records, read again: the same devices in the same order. */
    print_rates (a, b, nb < na ? nb : na);
    free (a);
    a = b;
    na = nb;
  }
}

int
cmd_stats (int argc, char **argv)
{
  static const struct option longopts[] = {
    { "json", no_argument, NULL, 'J' },
    { "prometheus", no_argument, NULL, 'P' },
    { "watch", required_argument, NULL, 'w' },
    { "file", required_argument, NULL, 'f' },
    { "help", no_argument, NULL, 'h' },
    { NULL, 0, NULL, 0 },
  };
  bool json = false, prom = false;
  unsigned long secs = 0;
  const char *file = NULL;
  struct record *recs = NULL, one;
  struct snap *v;
  size_t n = 0, nv;
  char *end;
  int c, rc = EXIT_OK;

  while ((c = getopt_long (argc, argv, "+h", longopts, NULL)) != -1)
    switch (c) {
    case 'J': json = true; break;
    case 'P': prom = true; break;
    case 'w':
      errno = 0;
      secs = strtoul (optarg, &end, 10);
      if (errno || *end || end == optarg || secs < 1 || secs > 86400) {
        errorf (CMD ": --watch %s: must be a number of seconds from 1 to "
                "86400", optarg);
        return EXIT_USAGE;
      }
      break;
    case 'f': file = optarg; break;
    case 'h': usage (stdout); return EXIT_OK;
    default: usage (stderr); return EXIT_USAGE;
    }
  if (json + prom + (secs > 0) > 1) {
    errorf (CMD ": --json, --prometheus and --watch: choose one");
    return EXIT_USAGE;
  }
  if (file && optind != argc) {
    errorf (CMD ": --file %s and %s: choose one", file, argv[optind]);
    return EXIT_USAGE;
  }
  if (optind + 1 < argc) {
    errorf (CMD ": unexpected argument: %s", argv[optind + 1]);
    return EXIT_USAGE;
  }
  if (file == NULL && optind < argc) {
    if (!need_root (CMD))
      return EXIT_NOT_ROOT;
    if (!record_find (CMD, argv[optind], &one))
      return EXIT_FAILED;
    recs = &one;
    n = 1;
  }
  else if (file == NULL) {
    /* The records live in a root-only directory: an empty list would
     * tell another user that nothing is attached.
     */
    if (access (rundir (), R_OK | X_OK) == -1 && errno != ENOENT) {
      int err = errno;

      errorf (CMD ": cannot read %s, where the counters are: %s (run pdio "
              "stats as root)", rundir (), strerror (err));
      return err == EACCES ? EXIT_NOT_ROOT : EXIT_FAILED;
    }
    recs = attachments_load (&n);
  }
  if (secs) {
    rc = watch (file, recs, n, secs);
    if (recs != &one)
      free (recs);
    return rc;
  }
  v = snapshot (file, recs, n, true, &nv);
  if (v == NULL) {
    errorf (CMD ": %m");
    rc = EXIT_FAILED;
  }
  else if (json)
    print_json (v, nv);
  else if (prom)
    print_prometheus (v, nv);
  else
    print_text (v, nv);
  /* One device asked for, and no counters: that is a failure. */
  if (v && (file || recs == &one) && nv == 1 && v[0].why[0]) {
    errorf (CMD ": %s", v[0].why);
    rc = EXIT_FAILED;
  }
  if (v && (file || recs == &one) && nv == 0) {
    errorf (CMD ": %s keeps no counters (served by nbdkit, or remote)",
            one.device);
    rc = EXIT_FAILED;
  }
  free (v);
  if (recs != &one)
    free (recs);
  return rc;
}
