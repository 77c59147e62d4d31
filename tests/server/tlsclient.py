#!/usr/bin/env python3
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

NBDMAGIC = 0x4e42444d41474943
IHAVEOPT = 0x49484156454F5054
REPMAGIC = 0x3e889045565a9
REQ_MAGIC = 0x25609513
SIMPLE_MAGIC = 0x67446698
OPT_EXPORT_NAME, OPT_ABORT, OPT_LIST, OPT_STARTTLS, OPT_INFO, OPT_GO = 1, 2, 3, 5, 6, 7
OPT_SR, OPT_LIST_META, OPT_SET_META = 8, 9, 10
REP_ACK, REP_INFO = 1, 3
REP_ERR_INVALID, REP_ERR_TLS_REQD = 0x80000003, 0x80000005
CMD_READ = 0


class Closed(Exception):
    pass


def recv_exact(s, n):
    buf = b""
    while len(buf) < n:
        try:
            chunk = s.recv(n - len(buf))
        except (ConnectionResetError, BrokenPipeError, socket.timeout,
                ssl.SSLError, OSError):
            raise Closed()
        if not chunk:
            raise Closed()
        buf += chunk
    return buf


def send(s, data):
    try:
        s.sendall(data)
    except (BrokenPipeError, ConnectionResetError, socket.timeout,
            ssl.SSLError, OSError):
        raise Closed()


def connect(port, timeout=30):
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    return s


def greeting(s):
    magic, opt, flags = struct.unpack(">QQH", recv_exact(s, 18))
    if magic != NBDMAGIC or opt != IHAVEOPT:
        raise SystemExit("bad greeting")
    send(s, struct.pack(">I", 3))       # FIXED_NEWSTYLE | NO_ZEROES
    return flags


def option(s, code, data=b""):
    send(s, struct.pack(">QII", IHAVEOPT, code, len(data)) + data)


def option_reply(s):
    magic, opt, typ, length = struct.unpack(">QIII", recv_exact(s, 20))
    if magic != REPMAGIC:
        raise SystemExit("bad option reply magic")
    return opt, typ, recv_exact(s, length)


def go_data(name=b"", infos=()):
    return (struct.pack(">I", len(name)) + name + struct.pack(">H", len(infos))
            + b"".join(struct.pack(">H", i) for i in infos))


def meta_data(queries):
    return (struct.pack(">I", 0) + struct.pack(">I", len(queries)) +
            b"".join(struct.pack(">I", len(q)) + q for q in queries))


def starttls(s):
    option(s, OPT_STARTTLS)
    opt, typ, _ = option_reply(s)
    if opt != OPT_STARTTLS or typ != REP_ACK:
        raise SystemExit("STARTTLS: reply type 0x%x, want ACK" % typ)


def tls_context(certdir):
    ctx = ssl.create_default_context(cafile=os.path.join(certdir, "ca-cert.pem"))
    cert = os.path.join(certdir, "client-cert.pem")
    if os.path.exists(cert):
        ctx.load_cert_chain(cert, os.path.join(certdir, "client-key.pem"))
    return ctx


def go(s):
    option(s, OPT_GO, go_data(b"", (3,)))
    size = None
    while True:
        opt, typ, data = option_reply(s)
        if typ == REP_INFO and struct.unpack(">H", data[:2])[0] == 0:
            size = struct.unpack(">Q", data[2:10])[0]
        elif typ == REP_ACK:
            return size
        elif typ != REP_INFO:
            raise SystemExit("GO over TLS: reply type 0x%x" % typ)


def request(typ, offset, count, cookie=1, flags=0):
    return struct.pack(">IHHQQI", REQ_MAGIC, flags, typ, cookie, offset, count)


# --- required ------------------------------------------------------------------
PLAIN_OPTIONS = [
    ("LIST", OPT_LIST, b""),
    ("INFO", OPT_INFO, go_data(b"", (0, 1, 2, 3))),
    ("GO", OPT_GO, go_data(b"", (0, 1, 2, 3))),
    ("STRUCTURED_REPLY", OPT_SR, b""),
    ("LIST_META_CONTEXT", OPT_LIST_META, meta_data([b"base:"])),
    ("SET_META_CONTEXT", OPT_SET_META, meta_data([b"base:allocation"])),
    ("an unknown option", 99, b"x" * 10),
    ("option 0", 0, b""),
]


def required(port):
    s = connect(port)
    greeting(s)
    for name, code, data in PLAIN_OPTIONS:
        option(s, code, data)
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
    try:
        data = s.recv(65536)
    except (ConnectionResetError, socket.timeout):
        data = b""
    if data:
        raise SystemExit("a read request before TLS got %d bytes back"
                         % len(data))
    print("READ                 no reply, hung up")
    s.close()
    s = connect(port)
    greeting(s)
    option(s, OPT_EXPORT_NAME, b"")
    try:
        data = s.recv(65536)
    except (ConnectionResetError, socket.timeout):
        data = b""
    if data:
        raise SystemExit("EXPORT_NAME before TLS got %d bytes: %r"
                         % (len(data), data[:32]))
    print("EXPORT_NAME          hung up, no byte sent")
    s.close()
    s = connect(port)
    greeting(s)
    option(s, OPT_ABORT)
    opt, typ, _ = option_reply(s)
    if opt != OPT_ABORT or typ != REP_ACK:
        raise SystemExit("ABORT before TLS: reply type 0x%x, want ACK" % typ)
    print("ABORT                ACK")
    s.close()


def x509(port, certdir):
    s = connect(port)
    greeting(s)
    starttls(s)
    # Refused by the server (its handshake fails, or, in TLS 1.3, its
    # check of the client's certificate after the client's side is done):
    # the session ends before any answer comes through it.  Exit 3 then,
    # so that a test expecting a refusal knows it was one.
    try:
        t = tls_context(certdir).wrap_socket(s, server_hostname="localhost")
        print("TLS:", t.version(), t.cipher()[0])
        option(t, OPT_STARTTLS)
        opt, typ, _ = option_reply(t)
    except (Closed, ssl.SSLError, OSError) as e:
        print("refused in TLS: %s" % e)
        sys.exit(3)
    if typ != REP_ERR_INVALID:
        raise SystemExit("STARTTLS in TLS: reply type 0x%x, want "
                         "NBD_REP_ERR_INVALID" % typ)
    size = go(t)
    send(t, request(CMD_READ, 0, 4096, cookie=5))
    magic, err, cookie = struct.unpack(">IIQ", recv_exact(t, 16))
    if magic != SIMPLE_MAGIC or err or cookie != 5:
        raise SystemExit("read over TLS: magic 0x%x error %d" % (magic, err))
    print("size", size)
    print(recv_exact(t, 4096).hex())
    t.close()


# --- hostile -------------------------------------------------------------------
def starttls_hang_up(port, certdir, rnd):
    s = connect(port)
    greeting(s)
    starttls(s)
    return s


def garbage_record(port, certdir, rnd):
    s = connect(port)
    greeting(s)
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
    greeting(s)
    starttls(s)
    hello = client_hello(certdir)
    send(s, hello[:rnd.randrange(1, len(hello))])
    return s


def hello_then_vanish(port, certdir, rnd):
    s = connect(port)
    greeting(s)
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
    greeting(s)
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
    greeting(s)
    # INFO in plain text first: with --tls=require refused, with --tls=on
    # answered; either way STARTTLS then starts a clean TLS session.
    option(s, OPT_INFO, go_data(b"", (3,)))
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
    magic, err, cookie = struct.unpack(">IIQ", recv_exact(t, 16))
    if err or cookie != 9:
        raise SystemExit("downgrade: read over TLS failed: error %d" % err)
    recv_exact(t, 512)
    return t


def plain_after_ack(port, certdir, rnd):
    s = connect(port)
    greeting(s)
    starttls(s)
    # The server now expects a ClientHello: NBD options are garbage to it.
    option(s, OPT_GO, go_data(b"", (3,)))
    try:
        data = s.recv(4096)
    except (OSError, socket.timeout):
        data = b""
    if data[:8] == struct.pack(">Q", REPMAGIC):
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
    greeting(p)
    go(p)
    s = connect(port)
    greeting(s)
    starttls(s)
    t = tls_context(certdir).wrap_socket(s, server_hostname="localhost")
    go(t)
    for c, cookie in ((p, 1), (t, 2)):
        send(c, request(CMD_READ, 0, 512, cookie=cookie))
        magic, err, got = struct.unpack(">IIQ", recv_exact(c, 16))
        if err or got != cookie:
            raise SystemExit("read before the hand-over failed")
        recv_exact(c, 512)
    open(os.path.join(flagdir, "ready"), "w").close()
    while not os.path.exists(os.path.join(flagdir, "go")):
        time.sleep(0.1)
    send(p, request(CMD_READ, 4096, 512, cookie=3))
    magic, err, got = struct.unpack(">IIQ", recv_exact(p, 16))
    if magic != SIMPLE_MAGIC or err or got != 3:
        raise SystemExit("plain client after the hand-over: magic 0x%x "
                         "error %d" % (magic, err))
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
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                        "rawclient.py")
    with open(path) as f:
        src = f.read()
    # Its definitions without its last line, the call of its main().
    raw = {"__name__": "rawclient"}
    exec(compile(src[:src.rindex("\nmain()")], path, "exec"), raw)
    raw["connect"] = lambda _path, timeout=20: connect(port, timeout)
    raw["ABUSES"] = [a for a in raw["ABUSES"] if a.__name__ != "starttls"]
    raw["hostile"](None, n, seed)


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
