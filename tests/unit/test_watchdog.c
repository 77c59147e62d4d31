/* The supervisor's watchdog (src/cli/watchdog.c, compiled in alone): this
 * test plays the server on the other end of a socketpair and drives the
 * watchdog's clock itself, so no check depends on how fast the machine
 * is.  It checks what goes over the wire (an NBD_CMD_READ of the block
 * size at offset 0, one at a time, one per WATCHDOG_PROBE_MS) and the
 * verdicts: a server that answers, however late within the bound, is
 * alive; one that owes an answer -- to a probe, or to a connection
 * attempt -- for WATCHDOG_HUNG_MS is hung; a server that breaks the
 * protocol or hangs up loses its connection, not its life.
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
  printf ("test_watchdog: ok\n");
  return 0;
}
