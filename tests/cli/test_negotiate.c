/* SPDX-License-Identifier: BSD-3-Clause */
/* pdio(1)'s client side of the NBD handshake (src/cli/negotiate.c,
 * compiled in alone), over a unix socket to a server this test runs in a
 * thread: pdio's own handshake state machine (src/server/handshake.c), or
 * a script of bytes for the servers that break the protocol.  Checks what
 * the client sends (fixed newstyle, NO_ZEROES only when offered, GO or
 * INFO for the default export asking for the block sizes, ABORT after
 * INFO), what it takes from the replies (size, flags, block sizes), that
 * a GO leaves the socket in the transmission phase, and that each broken
 * answer fails with a message naming what was wrong.  The guest's pdio
 * attach runs the same code against real servers.
 */
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "handshake.h"
#include "pdio.h"
#include "proto.h"
#include "unit.h"

static char sock_path[108];

static const struct nbd_export export = {
  .size = (UINT64_C (1) << 30) + 4096, .readonly = false,
  .block_min = 512, .block_preferred = 4096, .block_max = 32u << 20,
  .description = "a test image",
};

/* --- the server ------------------------------------------------------------ */
/* A server's replies, built with the codec into one buffer. */
struct script {
  uint8_t b[4096];
  size_t n;
};

struct server {
  int lfd;
  unsigned conns;               /* connections to take, one after another */
  /* pdio's handshake, or a script: */
  bool pdio;
  bool read_request;            /* pdio: read a request after GO */
  const uint8_t *pre, *post;    /* sent before and after the client's bytes */
  size_t pre_len, post_len;
  const struct script *posts[4];        /* post for connection i, if set */
  size_t expect;                /* the client's bytes to wait for */
  /* What happened: */
  uint8_t got[256];
  size_t got_len;
  enum nbd_hs_action end;       /* pdio: how the handshake ended */
  const char *why;
  bool got_request;             /* a request came after GO */
  struct nbd_request request;
  int fds[4];
};

static bool
send_all (int fd, const void *buf, size_t n)
{
  for (const uint8_t *p = buf; n; ) {
    ssize_t r = send (fd, p, n, MSG_NOSIGNAL);

    if (r <= 0)
      return false;
    p += r;
    n -= r;
  }
  return true;
}

/* Receives up to n bytes; what came before EOF. */
static size_t
recv_upto (int fd, void *buf, size_t n)
{
  size_t got = 0;

  while (got < n) {
    ssize_t r = recv (fd, (uint8_t *) buf + got, n - got, 0);

    if (r <= 0)
      break;
    got += r;
  }
  return got;
}

static void
run_pdio (struct server *s, int fd)
{
  static struct nbd_handshake h;        /* 10 KiB: not on the stack */
  uint8_t req[NBD_REQUEST_LEN];

  nbd_hs_init (&h, &export, PDIO_TLS_OFF);
  for (;;) {
    void *buf;
    size_t len;
    ssize_t r;

    switch ((s->end = nbd_hs_next (&h, &buf, &len))) {
    case NBD_HS_SEND:
      CHECK (send_all (fd, buf, len), "server: send: %m");
      nbd_hs_sent (&h);
      break;
    case NBD_HS_RECV:
      r = recv (fd, buf, len, 0);
      if (r <= 0) {
        s->why = "the client hung up";
        return;
      }
      if (s->got_len + r <= sizeof s->got) {
        memcpy (s->got + s->got_len, buf, r);
        s->got_len += r;
      }
      nbd_hs_received (&h, r);
      break;
    case NBD_HS_DONE:
      /* The client's socket is in transmission: a request must parse. */
      if (s->read_request && recv_upto (fd, req, sizeof req) == sizeof req)
        s->got_request = nbd_parse_request (req, &s->request);
      return;
    case NBD_HS_CLOSE:
      s->why = h.why;
      return;
    case NBD_HS_STARTTLS:
      CHECK (0, "the client asked for TLS");
    }
  }
}

static void *
server_main (void *arg)
{
  struct server *s = arg;

  for (unsigned i = 0; i < s->conns; i++) {
    int fd = accept (s->lfd, NULL, NULL);

    CHECK (fd >= 0, "accept: %m");
    s->fds[i] = fd;
    if (s->pdio) {
      run_pdio (s, fd);
      continue;
    }
    /* A script: what a broken server says, whatever the client does. */
    send_all (fd, s->pre, s->pre_len);
    s->got_len = recv_upto (fd, s->got, s->expect);
    if (s->posts[i])
      send_all (fd, s->posts[i]->b, s->posts[i]->n);
    else
      send_all (fd, s->post, s->post_len);
    /* Then it hangs up: a client still reading sees the end at once. */
    shutdown (fd, SHUT_WR);
  }
  return NULL;
}

static pthread_t
start (struct server *s)
{
  struct sockaddr_un sa = { .sun_family = AF_UNIX };
  pthread_t t;

  unlink (sock_path);
  s->lfd = socket (AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  CHECK (s->lfd >= 0, "socket: %m");
  strcpy (sa.sun_path, sock_path);
  CHECK (bind (s->lfd, (struct sockaddr *) &sa, sizeof sa) == 0 &&
         listen (s->lfd, 4) == 0, "bind %s: %m", sock_path);
  if (s->conns == 0)
    s->conns = 1;
  CHECK (pthread_create (&t, NULL, server_main, s) == 0, "pthread_create");
  return t;
}

static void
finish (struct server *s, pthread_t t)
{
  CHECK (pthread_join (t, NULL) == 0, "pthread_join");
  for (unsigned i = 0; i < s->conns; i++)
    close (s->fds[i]);
  close (s->lfd);
}

/* --- what the client sent ------------------------------------------------------ */
/* The client's flags, then option opt with GO/INFO's data for the default
 * export asking for NBD_INFO_BLOCK_SIZE alone.
 */
static void
check_client_bytes (const struct server *s, uint32_t cflags, uint32_t opt)
{
  struct nbd_info_request r;
  uint32_t option, length;
  const uint8_t *p = s->got;

  CHECK (s->got_len >= NBD_CLIENT_FLAGS_LEN + NBD_OPTION_HEADER_LEN,
         "the client sent %zu bytes", s->got_len);
  CHECK (nbd_parse_client_flags (p) == cflags, "client flags %#x, want %#x",
         nbd_parse_client_flags (p), cflags);
  p += NBD_CLIENT_FLAGS_LEN;
  CHECK (nbd_parse_option_header (p, &option, &length), "an option");
  CHECK (option == opt, "option %u, want %u", option, opt);
  p += NBD_OPTION_HEADER_LEN;
  CHECK (length == NBD_INFO_REQUEST_LEN (0, 1) &&
         s->got_len >= (size_t) (p - s->got) + length &&
         nbd_parse_info_request (p, length, &r), "GO/INFO's data");
  CHECK (r.name_len == 0, "the default export (name of %u bytes)",
         r.name_len);
  CHECK (r.n_infos == 1 && nbd_info_request_item (&r, 0) ==
         NBD_INFO_BLOCK_SIZE, "asking for the block sizes");
}

static void
check_offer (const struct nbd_offer *o)
{
  CHECK (o->size == export.size, "size %llu", (unsigned long long) o->size);
  CHECK (o->eflags == nbd_export_flags (&export, false),
         "flags %#x (no structured replies were asked for)", o->eflags);
  CHECK (o->block_min == 512 && o->block_preferred == 4096 &&
         o->block_max == 32u << 20, "block sizes %u %u %u", o->block_min,
         o->block_preferred, o->block_max);
}

/* --- against pdio's server ------------------------------------------------------ */
static void
test_go (void)
{
  struct server s = { .pdio = true, .read_request = true };
  pthread_t t = start (&s);
  struct nbd_offer o;
  char why[512] = "";
  uint8_t req[NBD_REQUEST_LEN];
  const struct nbd_request r = {
    .type = NBD_CMD_READ, .cookie = 77, .offset = 4096, .count = 512,
  };
  int fd = nbd_handshake (sock_path, &o, why, sizeof why);

  CHECK (fd >= 0, "GO against pdio's handshake: %s", why);
  check_offer (&o);
  nbd_request_bytes (req, &r);
  CHECK (send_all (fd, req, sizeof req), "a request on the socket");
  finish (&s, t);
  close (fd);
  CHECK (s.end == NBD_HS_DONE, "the server went to transmission");
  check_client_bytes (&s, NBD_FLAG_C_FIXED_NEWSTYLE | NBD_FLAG_C_NO_ZEROES,
                      NBD_OPT_GO);
  CHECK (s.got_request && s.request.cookie == 77 && s.request.count == 512,
         "the socket is in transmission, in step");
}

static void
test_query (void)
{
  struct server s = { .pdio = true };
  pthread_t t = start (&s);
  struct nbd_offer o;
  char why[512] = "";
  bool ok = nbd_query (sock_path, NULL, &o, why, sizeof why);

  finish (&s, t);
  CHECK (ok, "INFO against pdio's handshake: %s", why);
  check_offer (&o);
  check_client_bytes (&s, NBD_FLAG_C_FIXED_NEWSTYLE | NBD_FLAG_C_NO_ZEROES,
                      NBD_OPT_INFO);
  CHECK (s.end == NBD_HS_CLOSE && strcmp (s.why,
                                          "the client sent NBD_OPT_ABORT") == 0,
         "INFO ends with ABORT, not transmission (%s)", s.why);
}

static void
test_handshake_n (void)
{
  struct server s = { .pdio = true, .conns = 3 };
  pthread_t t = start (&s);
  struct nbd_offer o;
  char why[512] = "";
  int fds[3];
  bool ok = nbd_handshake_n (sock_path, 3, fds, &o, why, sizeof why);

  for (int i = 0; ok && i < 3; i++)
    close (fds[i]);
  finish (&s, t);
  CHECK (ok, "three connections: %s", why);
  check_offer (&o);
}

/* --- against scripted servers ------------------------------------------------- */
static void
hello (struct script *sc, uint16_t gflags)
{
  sc->n += nbd_greeting (sc->b + sc->n, gflags);
}

static uint8_t *
rep (struct script *sc, uint32_t option, uint32_t type, size_t len)
{
  uint8_t *p = sc->b + sc->n + NBD_OPTION_REPLY_LEN;

  CHECK (sc->n + NBD_OPTION_REPLY_LEN + len <= sizeof sc->b, "script room");
  sc->n += nbd_option_reply (sc->b + sc->n, option, type, len) + len;
  return p;
}

static void
rep_export (struct script *sc, uint64_t size)
{
  nbd_info_export (rep (sc, NBD_OPT_GO, NBD_REP_INFO, NBD_INFO_EXPORT_LEN),
                   size, 0x14d);
}

static void
rep_block_size (struct script *sc)
{
  nbd_info_block_size (rep (sc, NBD_OPT_GO, NBD_REP_INFO,
                            NBD_INFO_BLOCK_SIZE_LEN), 512, 4096, 32u << 20);
}

/* The client's bytes a GO handshake sends before it reads a reply. */
#define CLIENT_GO_LEN \
  (NBD_CLIENT_FLAGS_LEN + NBD_OPTION_HEADER_LEN + NBD_INFO_REQUEST_LEN (0, 1))

/* Runs nbd_handshake against greeting pre and replies post; returns the
 * fd (closed) or -1 with why.
 */
static int
scripted (struct server *s, const struct script *pre,
          const struct script *post, struct nbd_offer *o, char *why,
          size_t len)
{
  pthread_t t;
  int fd;

  s->pre = pre->b;
  s->pre_len = pre->n;
  s->post = post ? post->b : NULL;
  s->post_len = post ? post->n : 0;
  /* A server that sends nothing waits for nothing. */
  s->expect = pre->n ? CLIENT_GO_LEN : 0;
  t = start (s);
  why[0] = '\0';
  fd = nbd_handshake (sock_path, o, why, len);
  if (fd >= 0)
    close (fd);
  finish (s, t);
  return fd;
}

/* The handshake must fail, saying want. */
static void
refused (const char *what, const struct script *pre,
         const struct script *post, const char *want)
{
  struct server s = { 0 };
  struct nbd_offer o;
  char why[512];

  CHECK (scripted (&s, pre, post, &o, why, sizeof why) == -1,
         "%s: the handshake succeeded", what);
  CHECK (strstr (why, want) != NULL, "%s: \"%s\", want \"%s\"", what, why,
         want);
  CHECK (strstr (why, sock_path) != NULL, "%s: the message names the "
         "server: %s", what, why);
  printf ("  %s: %s\n", what, why);
}

/* Replies to GO that break the protocol, after a good greeting. */
static void
error_reply (struct script *sc)
{
  memcpy (rep (sc, NBD_OPT_GO, NBD_REP_ERR_POLICY, 7), "go away", 7);
}

static void
no_export (struct script *sc)
{
  rep_block_size (sc);
  rep (sc, NBD_OPT_GO, NBD_REP_ACK, 0);
}

static void
other_option (struct script *sc)
{
  rep (sc, NBD_OPT_INFO, NBD_REP_ACK, 0);
}

static void
too_long (struct script *sc)
{
  rep (sc, NBD_OPT_GO, NBD_REP_INFO, 2000);
}

static void
wrong_magic (struct script *sc)
{
  rep_export (sc, 1);
  sc->b[3] ^= 0xff;
}

static void
export_cut_short (struct script *sc)
{
  nbd_info_export (rep (sc, NBD_OPT_GO, NBD_REP_INFO,
                        NBD_INFO_EXPORT_LEN - 1), 1, 0);
}

static void
info_without_type (struct script *sc)
{
  rep (sc, NBD_OPT_GO, NBD_REP_INFO, 1);
}

static void
hang_up_in_reply (struct script *sc)
{
  rep_export (sc, 1);
  sc->n -= 3;                   /* then the server hangs up */
}

static const struct {
  const char *what;
  void (*replies) (struct script *);
  const char *want;             /* in the client's message */
} broken[] = {
  { "an error reply", error_reply,
    "the server refused NBD_OPT_GO (error 0x80000002): go away" },
  { "no NBD_INFO_EXPORT", no_export, "the server sent no NBD_INFO_EXPORT" },
  { "a reply to another option", other_option,
    "bad reply to NBD_OPT_GO (option 6, length 0)" },
  { "a reply too long to keep", too_long,
    "bad reply to NBD_OPT_GO (option 7, length 2000)" },
  { "a reply with a wrong magic", wrong_magic,
    "bad reply to NBD_OPT_GO: not an option reply" },
  { "an INFO_EXPORT cut short", export_cut_short,
    "a malformed NBD_REP_INFO (11 bytes)" },
  { "an INFO without its type", info_without_type,
    "a malformed NBD_REP_INFO (1 bytes)" },
  { "a hang-up in a reply", hang_up_in_reply,
    "reading the reply to NBD_OPT_GO" },
};

static void
test_scripted (void)
{
  struct script greet = { .n = 0 }, post;
  struct nbd_offer o;
  struct server s;
  char why[512];
  uint8_t *p;

  /* A server that does not offer NO_ZEROES: the client does not ask for
   * it; infos and replies it does not use are skipped.
   */
  hello (&greet, NBD_FLAG_FIXED_NEWSTYLE);
  post = (struct script) { .n = 0 };
  nbd_info_string (rep (&post, NBD_OPT_GO, NBD_REP_INFO,
                        NBD_INFO_STRING_LEN (4)), NBD_INFO_NAME, "name", 4);
  p = rep (&post, NBD_OPT_GO, NBD_REP_INFO, 3);
  p[0] = 0; p[1] = 99; p[2] = 0;        /* an info type pdio does not know */
  nbd_meta_context_reply (rep (&post, NBD_OPT_GO, NBD_REP_META_CONTEXT,
                               NBD_META_CONTEXT_REPLY_LEN (1)), 1, "x", 1);
  rep_export (&post, 12345 * 512);
  rep_block_size (&post);
  rep (&post, NBD_OPT_GO, NBD_REP_ACK, 0);
  s = (struct server) { 0 };
  CHECK (scripted (&s, &greet, &post, &o, why, sizeof why) >= 0,
         "a server without NO_ZEROES: %s", why);
  check_client_bytes (&s, NBD_FLAG_C_FIXED_NEWSTYLE, NBD_OPT_GO);
  CHECK (o.size == 12345 * 512 && o.eflags == 0x14d && o.block_min == 512,
         "the offer, past the replies it skips");

  /* Block sizes are optional: 0 when not advertised. */
  greet.n = 0;
  hello (&greet, NBD_FLAG_FIXED_NEWSTYLE | NBD_FLAG_NO_ZEROES);
  post.n = 0;
  rep_export (&post, 1 << 20);
  rep (&post, NBD_OPT_GO, NBD_REP_ACK, 0);
  s = (struct server) { 0 };
  CHECK (scripted (&s, &greet, &post, &o, why, sizeof why) >= 0,
         "no block sizes: %s", why);
  CHECK (o.size == 1 << 20 && o.block_min == 0 && o.block_max == 0,
         "no block sizes: 0");
  check_client_bytes (&s, NBD_FLAG_C_FIXED_NEWSTYLE | NBD_FLAG_C_NO_ZEROES,
                      NBD_OPT_GO);

  /* The broken ones. */
  {
    struct script bad = { .n = 0 };

    hello (&bad, 3);
    bad.b[0] = 'X';
    refused ("a wrong greeting magic", &bad, NULL,
             "not a fixed-newstyle NBD server");
    bad.n = 0;
    hello (&bad, NBD_FLAG_NO_ZEROES);
    refused ("an old-style server", &bad, NULL,
             "not a fixed-newstyle NBD server");
    bad.n = 0;
    refused ("a server that hangs up at once", &bad, NULL,
             "reading the server's greeting");
  }
  for (size_t k = 0; k < sizeof broken / sizeof broken[0]; k++) {
    post.n = 0;
    broken[k].replies (&post);
    refused (broken[k].what, &greet, &post, broken[k].want);
  }
}

/* Connections that disagree are refused, and none is left open. */
static void
test_disagree (void)
{
  struct script greet = { .n = 0 }, one = { .n = 0 }, two = { .n = 0 };
  struct server s = { .conns = 2 };
  struct nbd_offer o;
  pthread_t t;
  char why[512] = "";
  int fds[2] = { -2, -2 };
  bool ok;

  hello (&greet, 3);
  rep_export (&one, 1 << 20);
  rep (&one, NBD_OPT_GO, NBD_REP_ACK, 0);
  rep_export (&two, 2 << 20);
  rep (&two, NBD_OPT_GO, NBD_REP_ACK, 0);
  s.pre = greet.b;
  s.pre_len = greet.n;
  s.posts[0] = &one;
  s.posts[1] = &two;
  s.expect = CLIENT_GO_LEN;
  t = start (&s);
  ok = nbd_handshake_n (sock_path, 2, fds, &o, why, sizeof why);
  finish (&s, t);
  CHECK (!ok, "two connections of different sizes were taken");
  CHECK (strstr (why, "connections disagree on size or flags") != NULL,
         "why: %s", why);
  for (int i = 0; i < 2; i++)
    CHECK (fds[i] == -1 || (fcntl (fds[i], F_GETFD) == -1 && errno == EBADF),
           "connection %d left open", i);
  printf ("  disagreeing connections: %s\n", why);
}

int
main (void)
{
  char dir[] = "/tmp/test_negotiate.XXXXXX";

  CHECK (mkdtemp (dir) != NULL, "mkdtemp: %m");
  snprintf (sock_path, sizeof sock_path, "%s/nbd.sock", dir);
  test_go ();
  test_query ();
  test_handshake_n ();
  test_scripted ();
  test_disagree ();
  unlink (sock_path);
  rmdir (dir);
  printf ("test_negotiate: ok\n");
  return 0;
}
