#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""Raw-socket NBD clients for tests/server/tls.tap: what libnbd will not do
on purpose against a server with TLS.

  tlsclient.py required PORT
      Against --tls=require, in plain text: every option but STARTTLS and
      ABORT (LIST, INFO, GO, STRUCTURED_REPLY, the meta-context ones, an
      unknown one, STARTTLS with data is not one of them) must get
      NBD_REP_ERR_TLS_REQD and nothing else; then NBD_OPT_EXPORT_NAME must
      end the connection with no byte of the export sent, and a read
      request after GO's refusal must get no reply.  Exit 0, or 1 naming
      the first wrong answer.

  tlsclient.py x509 PORT CERTDIR
      STARTTLS, a TLS handshake with CERTDIR's ca-cert.pem (and
      client-cert.pem, client-key.pem if there), then in TLS: STARTTLS
      again must get NBD_REP_ERR_INVALID; GO; a read of 4096 bytes at 0
      printed in hex.  Exit 0; 3 if the server ended the TLS session
      before answering anything in it (refused); 1 otherwise.

  tlsclient.py hostile PORT CERTDIR N SEED
      N connections of the TLS kinds of abuse, picked by the seed: STARTTLS
      then a hang-up; STARTTLS then garbage instead of a TLS record; a
      ClientHello cut short; a handshake abandoned after the ClientHello; a
      TLS record cut short after the handshake; a downgrade attempt (INFO
      in plain text, refused with --tls=require, then STARTTLS and a
      normal session); plain-text options after STARTTLS's ACK.  Each costs only
      its own connection: the caller checks that the server keeps serving.
      Prints a count per kind; exit 0, or 1 on a wrong reply.

  tlsclient.py handover PORT CERTDIR FLAGDIR
      A plain and a TLS connection in transmission (--tls=on); creates
      FLAGDIR/ready, waits for FLAGDIR/go (the caller hands the server
      over meanwhile), then: the plain one must be served by the
      successor, the TLS one must have been closed.  Exit 0, or 1.

  tlsclient.py plain-hostile PORT N SEED
      rawclient.py hostile's plain-text abuses, over TCP, against a server
      with --tls=on (all but its STARTTLS one, which wants TLS off).
"""
import os
import random
import socket
import ssl
import struct
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "lib"))
from nbdwire import (  # noqa: E402
    CMD_READ, OPT_ABORT, OPT_EXPORT_NAME, OPT_GO, OPT_INFO, OPT_LIST,
    OPT_LIST_META_CONTEXT, OPT_SET_META_CONTEXT, OPT_STARTTLS,
    OPT_STRUCTURED_REPLY, REP_ACK, REP_ERR_INVALID, REP_ERR_TLS_REQD,
    REP_INFO, REP_MAGIC, Closed, go, hello, info_request, meta_request,
    option_reply, recv_exact, request, send, send_option, simple_reply)


def connect(port, timeout=30):
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    return s


def starttls(s):
    send_option(s, OPT_STARTTLS)
    opt, typ, _ = option_reply(s)
    if opt != OPT_STARTTLS or typ != REP_ACK:
        raise SystemExit("STARTTLS: reply type 0x%x, want ACK" % typ)


def tls_context(certdir):
    ctx = ssl.create_default_context(cafile=os.path.join(certdir, "ca-cert.pem"))
    cert = os.path.join(certdir, "client-cert.pem")
    if os.path.exists(cert):
        ctx.load_cert_chain(cert, os.path.join(certdir, "client-key.pem"))
    return ctx


# --- required ------------------------------------------------------------------
PLAIN_OPTIONS = [
    ("LIST", OPT_LIST, b""),
    ("INFO", OPT_INFO, info_request(b"", (0, 1, 2, 3))),
    ("GO", OPT_GO, info_request(b"", (0, 1, 2, 3))),
    ("STRUCTURED_REPLY", OPT_STRUCTURED_REPLY, b""),
    ("LIST_META_CONTEXT", OPT_LIST_META_CONTEXT, meta_request([b"base:"])),
    ("SET_META_CONTEXT", OPT_SET_META_CONTEXT,
     meta_request([b"base:allocation"])),
    ("an unknown option", 99, b"x" * 10),
    ("option 0", 0, b""),
]


def answer(s):
    """What the server sends before it hangs up (b"" for nothing)."""
    try:
        return s.recv(65536)
    except (ConnectionResetError, socket.timeout):
        return b""


def required(port):
    s = connect(port)
    hello(s)
    for name, code, data in PLAIN_OPTIONS:
        send_option(s, code, data)
        opt, typ, payload = option_reply(s)
        if opt != code or typ != REP_ERR_TLS_REQD:
            raise SystemExit("%s before STARTTLS: reply type 0x%x to option "
                             "%d, want NBD_REP_ERR_TLS_REQD" % (name, typ, opt))
        if b"pdio" in payload or b"img" in payload:
            raise SystemExit("%s: the refusal tells of the export: %r"
                             % (name, payload))
        print("%-20s NBD_REP_ERR_TLS_REQD" % name)
    # After GO's refusal there is no transmission phase: a read request
    # is an option header with a bad magic to the server.
    send(s, request(CMD_READ, 0, 4096))
    data = answer(s)
    if data:
        raise SystemExit("a read request before TLS got %d bytes back"
                         % len(data))
    print("READ                 no reply, hung up")
    s.close()
    s = connect(port)
    hello(s)
    send_option(s, OPT_EXPORT_NAME, b"")
    data = answer(s)
    if data:
        raise SystemExit("EXPORT_NAME before TLS got %d bytes: %r"
                         % (len(data), data[:32]))
    print("EXPORT_NAME          hung up, no byte sent")
    s.close()
    s = connect(port)
    hello(s)
    send_option(s, OPT_ABORT)
    opt, typ, _ = option_reply(s)
    if opt != OPT_ABORT or typ != REP_ACK:
        raise SystemExit("ABORT before TLS: reply type 0x%x, want ACK" % typ)
    print("ABORT                ACK")
    s.close()


def x509(port, certdir):
    s = connect(port)
    hello(s)
    starttls(s)
    # Refused by the server (its handshake fails, or, in TLS 1.3, its
    # check of the client's certificate after the client's side is done):
    # the session ends before any answer comes through it.  Exit 3 then,
    # so that a test expecting a refusal knows it was one.
    try:
        t = tls_context(certdir).wrap_socket(s, server_hostname="localhost")
        print("TLS:", t.version(), t.cipher()[0])
        send_option(t, OPT_STARTTLS)
        opt, typ, _ = option_reply(t)
    except (Closed, ssl.SSLError, OSError) as e:
        print("refused in TLS: %s" % e)
        sys.exit(3)
    if typ != REP_ERR_INVALID:
        raise SystemExit("STARTTLS in TLS: reply type 0x%x, want "
                         "NBD_REP_ERR_INVALID" % typ)
    size, _ = go(t)
    send(t, request(CMD_READ, 0, 4096, cookie=5))
    err, cookie = simple_reply(t)
    if err or cookie != 5:
        raise SystemExit("read over TLS: error %d, cookie %d" % (err, cookie))
    print("size", size)
    print(recv_exact(t, 4096).hex())
    t.close()


# --- hostile -------------------------------------------------------------------
def starttls_hang_up(port, certdir, rnd):
    s = connect(port)
    hello(s)
    starttls(s)
    return s


def garbage_record(port, certdir, rnd):
    s = connect(port)
    hello(s)
    starttls(s)
    send(s, rnd.randbytes(rnd.randrange(1, 20000)))
    return s


def client_hello(certdir):
    """The first bytes a TLS client sends, from a memory BIO."""
    ctx = tls_context(certdir)
    inc, out = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = ctx.wrap_bio(inc, out, server_hostname="localhost")
    try:
        obj.do_handshake()
    except ssl.SSLWantReadError:
        pass
    return out.read()


def hello_cut_short(port, certdir, rnd):
    s = connect(port)
    hello(s)
    starttls(s)
    ch = client_hello(certdir)
    send(s, ch[:rnd.randrange(1, len(ch))])
    return s


def hello_then_vanish(port, certdir, rnd):
    s = connect(port)
    hello(s)
    starttls(s)
    send(s, client_hello(certdir))
    if rnd.random() < 0.5:
        try:
            s.recv(rnd.randrange(1, 4096))   # part of the server's flight
        except (OSError, socket.timeout):
            pass
    return s


def record_cut_short(port, certdir, rnd):
    s = connect(port)
    hello(s)
    starttls(s)
    t = tls_context(certdir).wrap_socket(s, server_hostname="localhost")
    # A record header promising more than follows, on the raw socket
    # under the session.
    n = rnd.randrange(100, 16000)
    s2 = socket.socket(fileno=os.dup(t.fileno()))
    send(s2, struct.pack(">BHH", 23, 0x0303, n) + rnd.randbytes(rnd.randrange(0, n)))
    s2.close()
    return t


def downgrade(port, certdir, rnd):
    s = connect(port)
    hello(s)
    # INFO in plain text first: with --tls=require refused, with --tls=on
    # answered; either way STARTTLS then starts a clean TLS session.
    send_option(s, OPT_INFO, info_request(b"", (3,)))
    while True:
        opt, typ, _ = option_reply(s)
        if typ in (REP_ERR_TLS_REQD, REP_ACK):
            break
        if typ != REP_INFO:
            raise SystemExit("downgrade: INFO in plain text got reply type 0x%x"
                             % typ)
    starttls(s)
    t = tls_context(certdir).wrap_socket(s, server_hostname="localhost")
    go(t)
    send(t, request(CMD_READ, 0, 512, cookie=9))
    err, cookie = simple_reply(t)
    if err or cookie != 9:
        raise SystemExit("downgrade: read over TLS failed: error %d" % err)
    recv_exact(t, 512)
    return t


def plain_after_ack(port, certdir, rnd):
    s = connect(port)
    hello(s)
    starttls(s)
    # The server now expects a ClientHello: NBD options are garbage to it.
    send_option(s, OPT_GO, info_request(b"", (3,)))
    try:
        data = s.recv(4096)
    except (OSError, socket.timeout):
        data = b""
    if data[:8] == struct.pack(">Q", REP_MAGIC):
        raise SystemExit("a plain-text option after STARTTLS was answered")
    return s


ABUSES = [starttls_hang_up, garbage_record, hello_cut_short,
          hello_then_vanish, record_cut_short, downgrade, plain_after_ack]


def hostile(port, certdir, n, seed):
    rnd = random.Random(seed)
    counts = {}
    for i in range(n):
        abuse = ABUSES[i % len(ABUSES)] if i < len(ABUSES) else rnd.choice(ABUSES)
        s = None
        try:
            s = abuse(port, certdir, rnd)
        except Closed:
            pass                # the server hung up: allowed for all of these
        except ssl.SSLError:
            pass
        finally:
            if s is not None:
                try:
                    if rnd.random() < 0.5:
                        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                     struct.pack("ii", 1, 0))
                    s.close()
                except OSError:
                    pass
        counts[abuse.__name__] = counts.get(abuse.__name__, 0) + 1
    for k in sorted(counts):
        print("%-24s %d" % (k, counts[k]))
    print("%d hostile TLS connections" % n)


def handover(port, certdir, flagdir):
    """A TLS and a plain client in transmission across a hand-over: the
    plain one must go on with the successor, the TLS one must have been
    closed cleanly (answered, then the session ended), not left hanging
    or fed garbage."""
    p = connect(port)
    hello(p)
    go(p)
    s = connect(port)
    hello(s)
    starttls(s)
    t = tls_context(certdir).wrap_socket(s, server_hostname="localhost")
    go(t)
    for c, cookie in ((p, 1), (t, 2)):
        send(c, request(CMD_READ, 0, 512, cookie=cookie))
        err, got = simple_reply(c)
        if err or got != cookie:
            raise SystemExit("read before the hand-over failed")
        recv_exact(c, 512)
    open(os.path.join(flagdir, "ready"), "w").close()
    while not os.path.exists(os.path.join(flagdir, "go")):
        time.sleep(0.1)
    send(p, request(CMD_READ, 4096, 512, cookie=3))
    err, got = simple_reply(p)
    if err or got != 3:
        raise SystemExit("plain client after the hand-over: error %d, "
                         "cookie %d" % (err, got))
    recv_exact(p, 512)
    print("plain connection: served by the successor")
    try:
        send(t, request(CMD_READ, 4096, 512, cookie=4))
        data = t.recv(16)
    except (Closed, ssl.SSLError, OSError):
        data = b""
    if data:
        raise SystemExit("TLS connection after the hand-over got %r" % data)
    print("TLS connection: closed by the old server")


def plain_hostile(port, n, seed):
    """rawclient.py's abuses, over TCP to a server with --tls=on (all but
    its STARTTLS one, which expects TLS to be off)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import rawclient
    rawclient.connect = lambda _path, timeout=20: connect(port, timeout)
    rawclient.ABUSES = [a for a in rawclient.ABUSES if a.__name__ != "starttls"]
    rawclient.hostile(None, n, seed)


def main():
    if sys.argv[1] == "required":
        required(int(sys.argv[2]))
    elif sys.argv[1] == "x509":
        x509(int(sys.argv[2]), sys.argv[3])
    elif sys.argv[1] == "handover":
        handover(int(sys.argv[2]), sys.argv[3], sys.argv[4])
    elif sys.argv[1] == "plain-hostile":
        plain_hostile(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
    elif sys.argv[1] == "hostile":
        hostile(int(sys.argv[2]), sys.argv[3], int(sys.argv[4]),
                int(sys.argv[5]))
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main()
