/* SPDX-License-Identifier: BSD-3-Clause */
/* The supervisor's watchdog (src/cli/watchdog.c, compiled in alone): this
 * test plays the server on the other end of a socketpair and drives the
 * watchdog's clock itself, so no check depends on how fast the machine
 * is.  It checks what goes over the wire (an NBD_CMD_READ of the block
 * size at offset 0, one at a time, one per WATCHDOG_PROBE_MS) and the
 * verdicts: a server that answers, however late within the bound, is
 * alive; one that owes an answer -- to a probe, or to a connection
 * attempt -- for WATCHDOG_HUNG_MS is hung; a server that breaks the
 * protocol or hangs up loses its connection, not its life.  Then the
 * stall rule (watchdog_stalled), fed with readings this test makes up in
 * place of /proc: a silent server with a thread in D state, or under
 * memory pressure system-wide or in its cgroup, gets WATCHDOG_EXTEND_MS
 * more at a time up to WATCHDOG_STALL_MAX_MS, and is replaced as soon as
 * the stall is over; one that is merely stopped is replaced at
 * WATCHDOG_HUNG_MS, as before.
 */
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "pdio.h"
#include "proto.h"
#include "unit.h"

#define BLOCK 512

/* The probe the watchdog sent, or false if none is waiting to be read. */
static bool
read_probe (int fd, uint64_t *cookie)
{
  uint8_t req[NBD_REQUEST_LEN];
  struct nbd_request probe;
  ssize_t r = recv (fd, req, sizeof req, MSG_DONTWAIT);

  if (r == -1 && errno == EAGAIN)
    return false;
  CHECK (r == (ssize_t) sizeof req, "a whole request (got %zd)", r);
  CHECK (nbd_parse_request (req, &probe), "the request magic");
  CHECK (probe.type == NBD_CMD_READ, "a read (type %u)", probe.type);
  CHECK (probe.offset == 0, "at offset 0");
  CHECK (probe.count == BLOCK, "of one block (%u)", probe.count);
  *cookie = probe.cookie;
  return true;
}

/* Answers a probe: a simple reply, then `data` bytes of the block. */
static void
answer (int fd, uint64_t cookie, uint32_t error, size_t data)
{
  uint8_t rep[NBD_SIMPLE_REPLY_LEN + BLOCK] = { 0 };

  nbd_simple_reply (rep, cookie, error);
  CHECK (write (fd, rep, NBD_SIMPLE_REPLY_LEN + data) ==
         (ssize_t) (NBD_SIMPLE_REPLY_LEN + data), "write the answer");
}

static void
pair (int sv[2])
{
  CHECK (socketpair (AF_UNIX, SOCK_STREAM, 0, sv) == 0, "socketpair: %m");
}

/* What /proc says, as a function of how long the probe has been owed. */
typedef void look_fn (long owed, struct stall_reading *r);

/* The supervisor's loop (supervise.c: watch, deadline_passed) against a
 * server that never answers, looking every 100 ms: how long after the
 * probe went out it is killed; *extended counts the times it was given
 * longer, and last_why is what the last extension said.
 */
static char last_why[256];

static long
kill_time (look_fn *look, int *extended)
{
  struct watchdog w;
  long t0 = 5000000, t;
  uint64_t cookie;
  int sv[2];

  watchdog_init (&w);
  pair (sv);
  watchdog_attach (&w, sv[0], BLOCK, t0);
  CHECK (watchdog_run (&w, t0, true) == WATCHDOG_OK &&
         read_probe (sv[1], &cookie), "probe");
  *extended = 0;
  last_why[0] = '\0';
  for (t = t0; t <= t0 + 2 * WATCHDOG_STALL_MAX_MS; t += 100) {
    struct stall_reading r;
    char why[256];

    if (watchdog_run (&w, t, true) != WATCHDOG_HUNG)
      continue;
    look (t - t0, &r);
    if (!watchdog_stalled (&w, t, &r, why, sizeof why))
      break;
    CHECK (why[0], "an extension says why");
    snprintf (last_why, sizeof last_why, "%s", why);
    (*extended)++;
  }
  watchdog_forget (&w);
  close (sv[1]);
  return t - t0;
}

/* SIGSTOP on a quiet system: state T, PSI at rest. */
static void
stopped (long owed, struct stall_reading *r)
{
  (void) owed;
  *r = (struct stall_reading) {
    .system = { .have = true, .avg10 = 0.0, .total_us = 123456 },
    .cgroup = { .have = true, .avg10 = 0.0, .total_us = 789 },
  };
}

static void
d_state (long owed, struct stall_reading *r)
{
  stopped (owed, r);
  r->d_tid = 4242;
}

/* Stopped, with the system's PSI at AVG10 and STALLED_US more stall. */
static void
system_stall (struct stall_reading *r, double avg10, long stalled_us)
{
  stopped (0, r);
  r->system.avg10 = avg10;
  r->system.total_us += stalled_us;
}

static void
system_pressure (long owed, struct stall_reading *r)
{
  system_stall (r, 35.0, owed * 350);   /* 35 % of the time */
}

static void
cgroup_pressure (long owed, struct stall_reading *r)
{
  stopped (owed, r);
  r->cgroup.avg10 = 62.5;
  r->cgroup.total_us += owed * 625;
}

/* 35 % for the first 25 s, then none: avg10 is made to drop to 0 at once
 * (a real one decays), so that what keeps the server from 20 s to 30 s is
 * the total's growth over that interval (1.75 s of 10 s).
 */
static void
pressure_ends (long owed, struct stall_reading *r)
{
  long stalled = owed < 25000 ? owed : 25000;

  system_stall (r, owed < 25000 ? 35.0 : 0.0, stalled * 350);
}

static double mild_avg10;

static void
mild (long owed, struct stall_reading *r)
{
  (void) owed;
  system_stall (r, mild_avg10, 0);
}

/* avg10 under the threshold, the total growing 20 % of the time: the
 * first look has only avg10 to go by.
 */
static void
growth_only (long owed, struct stall_reading *r)
{
  system_stall (r, 5.0, owed * 200);
}

/* A kernel without PSI: only the thread states tell. */
static void
no_psi_d_state (long owed, struct stall_reading *r)
{
  (void) owed;
  *r = (struct stall_reading) { .d_tid = 77 };
}

static void
stall_rule (void)
{
  const long max = WATCHDOG_STALL_MAX_MS;
  const int steps = (WATCHDOG_STALL_MAX_MS - WATCHDOG_HUNG_MS) /
                    WATCHDOG_EXTEND_MS;
  long at;
  int n;

  at = kill_time (stopped, &n);
  CHECK (at == WATCHDOG_HUNG_MS && n == 0,
         "stopped, no pressure: killed at %ld ms after %d extensions", at, n);
  at = kill_time (d_state, &n);
  CHECK (at == max && n == steps,
         "D state: killed at %ld ms after %d extensions", at, n);
  CHECK (strcmp (last_why, "thread 4242 in D state") == 0, "why: %s",
         last_why);
  at = kill_time (system_pressure, &n);
  CHECK (at == max && n == steps,
         "system pressure: killed at %ld ms after %d extensions", at, n);
  CHECK (strncmp (last_why, "system memory some ", 19) == 0, "why: %s",
         last_why);
  at = kill_time (cgroup_pressure, &n);
  CHECK (at == max && n == steps,
         "cgroup pressure: killed at %ld ms after %d extensions", at, n);
  CHECK (strcmp (last_why, "cgroup memory some avg10=62.50") == 0,
         "why: %s", last_why);
  at = kill_time (pressure_ends, &n);
  CHECK (at == 4 * WATCHDOG_EXTEND_MS && n == 3,
         "pressure over at 25 s: killed at %ld ms after %d extensions", at, n);
  CHECK (strcmp (last_why, "system memory some 1.8 s of the last 10.0 s") == 0,
         "why: %s", last_why);
  mild_avg10 = WATCHDOG_PRESSURE_PCT - 0.01;
  at = kill_time (mild, &n);
  CHECK (at == WATCHDOG_HUNG_MS && n == 0,
         "avg10 just under the threshold: killed at %ld ms", at);
  mild_avg10 = WATCHDOG_PRESSURE_PCT;
  at = kill_time (mild, &n);
  CHECK (at == max, "avg10 at the threshold: killed at %ld ms", at);
  at = kill_time (growth_only, &n);
  CHECK (at == WATCHDOG_HUNG_MS && n == 0,
         "the first look goes by avg10 alone: killed at %ld ms", at);
  at = kill_time (no_psi_d_state, &n);
  CHECK (at == max, "no PSI, D state: killed at %ld ms", at);

  /* Stalled, then it answers: the next probe it owes starts from the
   * first deadline again, and a plain stop is judged at WATCHDOG_HUNG_MS.
   */
  {
    struct watchdog w;
    struct stall_reading r;
    long t = 9000000;
    uint64_t cookie;
    char why[256];
    int sv[2];

    watchdog_init (&w);
    pair (sv);
    watchdog_attach (&w, sv[0], BLOCK, t);
    CHECK (watchdog_run (&w, t, true) == WATCHDOG_OK &&
           read_probe (sv[1], &cookie), "probe");
    d_state (WATCHDOG_HUNG_MS, &r);
    CHECK (watchdog_run (&w, t + WATCHDOG_HUNG_MS, true) == WATCHDOG_HUNG,
           "deadline");
    CHECK (watchdog_stalled (&w, t + WATCHDOG_HUNG_MS, &r, why, sizeof why),
           "stalled");
    CHECK (watchdog_run (&w, t + WATCHDOG_HUNG_MS, true) == WATCHDOG_OK,
           "given longer");
    CHECK (watchdog_wait_ms (&w, t + WATCHDOG_HUNG_MS) <= WATCHDOG_PROBE_MS,
           "still looked at");
    answer (sv[1], cookie, 0, BLOCK);
    t += WATCHDOG_HUNG_MS + 5000;
    CHECK (watchdog_run (&w, t, true) == WATCHDOG_OK &&
           watchdog_owed_ms (&w, t) == 0, "answered at last");
    t += WATCHDOG_PROBE_MS;
    CHECK (watchdog_run (&w, t, true) == WATCHDOG_OK &&
           read_probe (sv[1], &cookie), "the next probe");
    CHECK (watchdog_run (&w, t + WATCHDOG_HUNG_MS - 1, true) == WATCHDOG_OK,
           "not yet");
    CHECK (watchdog_run (&w, t + WATCHDOG_HUNG_MS, true) == WATCHDOG_HUNG,
           "the first deadline again");
    stopped (0, &r);
    CHECK (!watchdog_stalled (&w, t + WATCHDOG_HUNG_MS, &r, why,
                              sizeof why), "stopped: hung");
    watchdog_forget (&w);
    close (sv[1]);
  }
}

int
main (void)
{
  struct watchdog w;
  uint64_t cookie, prev;
  long t = 1000000;             /* the test's clock, ms */
  int sv[2];

  /* A server that answers every probe, even late: never hung, and one
   * probe at a time, each WATCHDOG_PROBE_MS after the last answer.
   */
  watchdog_init (&w);
  pair (sv);
  watchdog_attach (&w, sv[0], BLOCK, t);
  CHECK (watchdog_run (&w, t, true) == WATCHDOG_OK, "fresh connection");
  CHECK (read_probe (sv[1], &cookie), "a probe at once");
  prev = cookie;
  for (int i = 0; i < 20; i++) {
    /* Slow (up to just under the bound), answered in two pieces. */
    long slow = i % 2 ? WATCHDOG_HUNG_MS - 1 : 10;

    t += slow / 2;
    CHECK (watchdog_run (&w, t, true) == WATCHDOG_OK, "probe %d owed %ld ms", i,
           slow / 2);
    CHECK (!read_probe (sv[1], &cookie), "no second probe while one is owed");
    answer (sv[1], prev, 0, BLOCK / 2);
    CHECK (watchdog_run (&w, t, true) == WATCHDOG_OK, "half an answer");
    t += slow - slow / 2;
    CHECK (watchdog_owed_ms (&w, t) == slow, "owed %ld ms, not %ld",
           watchdog_owed_ms (&w, t), slow);
    CHECK (write (sv[1], (char[BLOCK]) { 0 }, BLOCK / 2) == BLOCK / 2,
           "the rest");
    CHECK (watchdog_run (&w, t, true) == WATCHDOG_OK, "probe %d answered", i);
    CHECK (watchdog_owed_ms (&w, t) == 0, "nothing owed once answered");
    CHECK (!read_probe (sv[1], &cookie), "the next probe waits");
    CHECK (watchdog_wait_ms (&w, t) == WATCHDOG_PROBE_MS,
           "sleep until the next probe (%ld)", watchdog_wait_ms (&w, t));
    t += WATCHDOG_PROBE_MS - 1;
    CHECK (watchdog_run (&w, t, true) == WATCHDOG_OK && !read_probe (sv[1], &cookie),
           "not before WATCHDOG_PROBE_MS");
    t += 1;
    CHECK (watchdog_run (&w, t, true) == WATCHDOG_OK, "probe due");
    CHECK (read_probe (sv[1], &cookie), "probe %d sent on time", i + 1);
    CHECK (cookie != prev, "each probe its own cookie");
    prev = cookie;
  }

  /* An idle device (no request in flight) is not probed: no probe goes
   * out, however long, and the caller is not woken more than once per
   * WATCHDOG_PROBE_MS for it; once busy again, the next look probes.
   * A probe already out is still judged.
   */
  answer (sv[1], prev, 0, BLOCK);
  CHECK (watchdog_run (&w, t, false) == WATCHDOG_OK, "answered, idle");
  for (int i = 0; i < 3 * WATCHDOG_HUNG_MS / 500; i++) {
    t += 500;
    CHECK (watchdog_run (&w, t, false) == WATCHDOG_OK, "idle is never hung");
    CHECK (!read_probe (sv[1], &cookie), "no probe while idle (%d)", i);
    CHECK (watchdog_wait_ms (&w, t) > 0, "no busy loop while idle");
  }
  t += WATCHDOG_PROBE_MS;
  CHECK (watchdog_run (&w, t, true) == WATCHDOG_OK, "busy again");
  CHECK (read_probe (sv[1], &cookie), "probed once busy");
  CHECK (watchdog_run (&w, t + WATCHDOG_HUNG_MS, false) == WATCHDOG_HUNG,
         "a probe sent while busy is judged even once idle");
  answer (sv[1], cookie, 0, BLOCK);
  CHECK (watchdog_run (&w, t + WATCHDOG_HUNG_MS, false) == WATCHDOG_OK,
         "answered after all");
  t += WATCHDOG_HUNG_MS + WATCHDOG_PROBE_MS;
  CHECK (watchdog_run (&w, t, true) == WATCHDOG_OK && read_probe (sv[1], &prev),
         "probe");

  /* An error answer is an answer: alive. */
  answer (sv[1], prev, 5 /* NBD_EIO */, 0);
  t += 100;
  CHECK (watchdog_run (&w, t, true) == WATCHDOG_OK && watchdog_owed_ms (&w, t) == 0,
         "an error reply counts as an answer");

  /* A server that stops answering: hung exactly at WATCHDOG_HUNG_MS. */
  t += WATCHDOG_PROBE_MS;
  CHECK (watchdog_run (&w, t, true) == WATCHDOG_OK && read_probe (sv[1], &cookie),
         "probe");
  for (long d = 0; d < WATCHDOG_HUNG_MS; d += 250)
    CHECK (watchdog_run (&w, t + d, true) == WATCHDOG_OK, "owed %ld ms: not yet",
           d);
  CHECK (watchdog_wait_ms (&w, t + WATCHDOG_HUNG_MS - 300) == 300,
         "wakes up for the verdict");
  CHECK (watchdog_run (&w, t + WATCHDOG_HUNG_MS, true) == WATCHDOG_HUNG,
         "owed WATCHDOG_HUNG_MS: hung");
  /* ... and an answer after that is no longer awaited: forget clears. */
  watchdog_forget (&w);
  close (sv[1]);
  CHECK (w.fd == -1 && watchdog_owed_ms (&w, t) == 0, "forgotten");

  /* A reply for another cookie, or with a bad magic: the connection is
   * dropped, the server is not judged hung for it.
   */
  pair (sv);
  watchdog_attach (&w, sv[0], BLOCK, t);
  CHECK (watchdog_run (&w, t, true) == WATCHDOG_OK && read_probe (sv[1], &cookie),
         "probe");
  answer (sv[1], cookie + 1, 0, BLOCK);
  CHECK (watchdog_run (&w, t + 1, true) == WATCHDOG_OK, "wrong cookie");
  CHECK (w.fd == -1, "wrong cookie drops the connection");
  close (sv[1]);

  /* A server that hangs up (dies): connection dropped, nothing owed. */
  pair (sv);
  watchdog_attach (&w, sv[0], BLOCK, t);
  CHECK (watchdog_run (&w, t, true) == WATCHDOG_OK && read_probe (sv[1], &cookie),
         "probe");
  close (sv[1]);
  CHECK (watchdog_run (&w, t + 1, true) == WATCHDOG_OK && w.fd == -1,
         "EOF drops the connection");

  /* A server that cannot be reached (its handshake timed out): owed since
   * the attempt; reached again in time, it owes nothing.
   */
  watchdog_forget (&w);
  watchdog_unreachable (&w, t);
  CHECK (watchdog_run (&w, t + WATCHDOG_HUNG_MS - 1, true) == WATCHDOG_OK,
         "unreachable, not yet hung");
  watchdog_unreachable (&w, t + 5000);
  CHECK (watchdog_owed_ms (&w, t + WATCHDOG_HUNG_MS) == WATCHDOG_HUNG_MS,
         "owed since the first failed attempt, not the last");
  CHECK (watchdog_run (&w, t + WATCHDOG_HUNG_MS, true) == WATCHDOG_HUNG,
         "unreachable for WATCHDOG_HUNG_MS: hung");
  watchdog_forget (&w);
  watchdog_unreachable (&w, t);
  pair (sv);
  watchdog_attach (&w, sv[0], BLOCK, t + 3000);
  CHECK (watchdog_owed_ms (&w, t + 3000) == 0, "reached: owes nothing");
  CHECK (watchdog_run (&w, t + WATCHDOG_HUNG_MS, true) == WATCHDOG_OK, "alive");

  /* Closing with a probe outstanding waits for its answer (nbdkit 1.32.5
   * aborts on a hang-up with a reply queued), then says NBD_CMD_DISC.
   */
  CHECK (read_probe (sv[1], &cookie), "probe");
  answer (sv[1], cookie, 0, BLOCK);
  watchdog_close (&w);
  {
    uint8_t req[NBD_REQUEST_LEN];
    struct nbd_request disc;

    CHECK (recv (sv[1], req, sizeof req, MSG_DONTWAIT) == sizeof req,
           "a disconnect request");
    CHECK (nbd_parse_request (req, &disc), "the request magic");
    CHECK (disc.type == NBD_CMD_DISC, "NBD_CMD_DISC (%u)", disc.type);
  }
  close (sv[1]);
  stall_rule ();
  printf ("test_watchdog: ok\n");
  return 0;
}
