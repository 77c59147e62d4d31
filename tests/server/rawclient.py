#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""Raw-socket NBD clients for tests/server/native.tap: what libnbd will
not do on purpose.

  rawclient.py hostile SOCKET N SEED
      N connections, each one abuse picked by the seed: hang up at once or
      mid-greeting, garbage, unknown client flags, bad option magic, an
      option flood (more than the server's limit), option lengths up to
      4 GiB with the data cut short, malformed INFO/GO/meta-context data,
      STARTTLS (the reply must be NBD_REP_ERR_POLICY), a byte-at-a-time
      handshake, then in transmission: bad request magic, out-of-range and
      oversized requests, a write whose payload is cut short, and reads
      whose replies are never read before hanging up.  Checks the replies
      the spec fixes (STARTTLS, unknown options, GO's infos, EINVAL for a
      read past the end); anything else the server does (reply or hang
      up) is its choice, as long as it keeps serving: the caller checks.
      Prints a count per kind of abuse; exit 0, or 1 on a wrong reply.

  rawclient.py sigterm SOCKET PID IMAGE OUT
      Negotiates, pipelines 64 writes of 64 KiB (distinct offsets, each
      filled with its own byte), sends SIGTERM to PID while they are in
      flight, then reads replies until the server closes.  Writes the
      acknowledged cookies to OUT, one per line; the caller checks the
      image after the server has exited.  Exit 0 if every reply was a
      success reply to a request it sent.
  rawclient.py partial SOCKET SENT DONE
      For a hand-over (server/handover.tap): opens connections that each
      leave the server part of a request -- half a header; a WRITE's
      header and half its payload (4 KiB: the combined receive; 128 KiB:
      a MSG_WAITALL one); a WRITE's header alone; a refused WRITE (past
      the end) with part of its payload; a whole READ then half the next
      header -- once the server has read all of that (SIOCOUTQ), writes
      a line to the fifo SENT, waits for a line on the fifo DONE (the
      caller hands the server over meanwhile), sends the rest and checks
      every reply and the data written (read back on the same
      connection).  Exit 0 if all is right.

  rawclient.py stream SOCKET SHADOW SENT GO
      For a hand-over in the middle of streamed requests
      (server/handover.tap): one connection sends a 64 MiB WRITE's header
      and its first 8 MiB, another a 64 MiB READ and 10 bytes of the next
      header; writes a line to the fifo SENT and goes on sending the
      WRITE's payload and reading the READ's reply at 1 MiB/s until a
      line comes on the fifo GO (the caller has started a successor, and
      the server is handing over), then at full speed, the WRITE followed
      at once by a 4 KiB WRITE; then sends the rest of the READ's next
      header.  Both streams must still have been going at GO.
      The old server must finish both streams; the successor serves what
      came after them.  Checks every reply, the READ's data against the
      file SHADOW (a copy of the image), and data read back; applies the
      writes to SHADOW for the caller to compare with the image.  Exit 0
      if all is right.

  rawclient.py flags SOCKET
      Negotiates as the other modes do and prints the transmission flags
      the server gave, in hex (for taken-stream).

  rawclient.py taken-stream HANDOVER NBD_SOCKET SIZE EFLAGS SHADOW
      A predecessor that hands over a connection in the middle of a
      24 MiB WRITE (streamed by pdio's server) with 9 MiB + 123 bytes of
      its payload received: listens on HANDOVER and NBD_SOCKET, offers
      the export (SIZE bytes; the connection negotiated EFLAGS, simple
      replies) to the successor that connects, with the connection's
      record, the bytes, and one end of a socket pair as its socket; once
      acknowledged, sends the rest of the payload on the other end and
      checks the reply and the data read back.  Applies the write to
      SHADOW.  Exit 0 if all is right.

  rawclient.py stranger PATH
      Connects to a server's hand-over socket PATH and sends garbage
      instead of a successor's hello.

  rawclient.py fake-old-server PATH KIND
      Listens on PATH as an old server would for its successor, reads the
      hello and answers with a broken offer of KIND (magic, version,
      count, fds): the successor must refuse it.
"""
import fcntl
import os
import random
import select
import signal
import socket
import struct
import sys
import termios
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "lib"))
from nbdwire import (  # noqa: E402
    C_FIXED_NEWSTYLE, CMD_DISC, CMD_READ, CMD_WRITE, EINVAL, OPT_ABORT,
    OPT_GO, OPT_INFO, OPT_LIST, OPT_LIST_META_CONTEXT, OPT_SET_META_CONTEXT,
    OPT_STARTTLS, OPT_STRUCTURED_REPLY, REP_ACK, REP_ERR_INVALID,
    REP_ERR_POLICY, REP_ERR_UNSUP, REP_INFO, Closed, client_flags, greeting,
    info_request, info_type, negotiate, option, option_reply, recv_big,
    recv_exact, request, send, send_option, simple_reply)


def connect(path, timeout=20):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    s.connect(path)
    return s


# --- the abuses ------------------------------------------------------------
def hang_up_at_once(s, rnd):
    pass


def hang_up_mid_greeting(s, rnd):
    recv_exact(s, rnd.randrange(1, 18))


def garbage(s, rnd):
    greeting(s)
    send(s, rnd.randbytes(rnd.randrange(1, 4096)))


def bad_client_flags(s, rnd):
    greeting(s)
    send(s, client_flags(rnd.choice([4, 0xffffffff, 1 << 31])))
    try:
        if s.recv(1):
            raise SystemExit("the server went on after unknown client flags")
    except (ConnectionResetError, socket.timeout):
        pass


def bad_option_magic(s, rnd):
    greeting(s)
    send(s, client_flags(C_FIXED_NEWSTYLE) + rnd.randbytes(16))


def option_flood(s, rnd):
    """More options than the server takes; each must be answered UNSUP
    until it hangs up."""
    greeting(s)
    send(s, client_flags(C_FIXED_NEWSTYLE))
    for i in range(400):
        send_option(s, 1000 + i, rnd.randbytes(rnd.randrange(0, 64)))
        try:
            opt, typ, _ = option_reply(s)
        except Closed:
            return
        if opt != 1000 + i or typ != REP_ERR_UNSUP:
            raise SystemExit("unknown option %d: reply type 0x%x" % (opt, typ))
    raise SystemExit("400 options accepted: no flood limit")


def long_option_cut_short(s, rnd):
    greeting(s)
    send(s, client_flags(C_FIXED_NEWSTYLE))
    length = rnd.choice([5000, 100000, 1 << 20, 0xffffffff])
    send(s, option(rnd.choice([OPT_GO, OPT_LIST, 77]),
                   rnd.randbytes(rnd.randrange(0, 3000)), length=length))


def malformed_options(s, rnd):
    greeting(s)
    send(s, client_flags(C_FIXED_NEWSTYLE))
    for data, code in [
            (struct.pack(">I", 1000) + b"ab", OPT_GO),
            (struct.pack(">IH", 0, 5), OPT_INFO),
            (b"\0\0\0\0\0\0\0\5", OPT_SET_META_CONTEXT),  # before structured
            (b"xx", OPT_LIST), (b"x", OPT_STRUCTURED_REPLY)]:
        send_option(s, code, data)
        opt, typ, _ = option_reply(s)
        if opt != code or typ != REP_ERR_INVALID:
            raise SystemExit("malformed option %d: reply type 0x%x" % (code, typ))
    send_option(s, OPT_STRUCTURED_REPLY)
    option_reply(s)
    send_option(s, OPT_LIST_META_CONTEXT,
                struct.pack(">II", 0, 3) + struct.pack(">I", 99))
    opt, typ, _ = option_reply(s)
    if typ != REP_ERR_INVALID:
        raise SystemExit("query running past the option: reply type 0x%x" % typ)


def starttls(s, rnd):
    greeting(s)
    send(s, client_flags(C_FIXED_NEWSTYLE))
    send_option(s, OPT_STARTTLS)
    opt, typ, _ = option_reply(s)
    if opt != OPT_STARTTLS or typ != REP_ERR_POLICY:
        raise SystemExit("STARTTLS: reply type 0x%x, want NBD_REP_ERR_POLICY" % typ)
    send_option(s, OPT_GO, info_request(b"some name", (1, 2, 3)))
    seen = set()
    while True:
        opt, typ, data = option_reply(s)
        if typ == REP_ACK:
            break
        if typ != REP_INFO:
            raise SystemExit("GO after STARTTLS: reply type 0x%x" % typ)
        seen.add(info_type(data))
    if not {0, 1, 3} <= seen:
        raise SystemExit("GO: infos %s, want EXPORT, NAME, BLOCK_SIZE" % seen)
    send(s, request(CMD_DISC, 0, 0))


def byte_at_a_time(s, rnd):
    greeting(s)
    data = client_flags(C_FIXED_NEWSTYLE) + option(OPT_LIST)
    for b in data:
        send(s, bytes([b]))
    opt, typ, _ = option_reply(s)
    if opt != OPT_LIST:
        raise SystemExit("LIST: reply to option %d" % opt)
    send_option(s, OPT_ABORT)


def bad_request_magic(s, rnd):
    negotiate(s)
    send(s, rnd.randbytes(28))


def out_of_range(s, rnd):
    size, _ = negotiate(s)
    send(s, request(CMD_READ, size, 512, cookie=7))
    err, cookie = simple_reply(s)
    if err != EINVAL or cookie != 7:
        raise SystemExit("read past the end: error %d cookie %d" % (err, cookie))
    send(s, request(CMD_READ, 0, 0xffffffff, cookie=8))
    err, cookie = simple_reply(s)
    if err == 0:
        raise SystemExit("a 4 GiB read was accepted")
    send(s, request(rnd.randrange(9, 65536), 0, 4096, cookie=9))
    err, _ = simple_reply(s)
    if err != EINVAL:
        raise SystemExit("unknown command: error %d" % err)


def write_cut_short(s, rnd):
    negotiate(s)
    count = rnd.choice([4096, 1 << 20, 32 << 20, 0xffffffff])
    send(s, request(CMD_WRITE, 0, count) + rnd.randbytes(rnd.randrange(0, 4096)))


def replies_never_read(s, rnd):
    negotiate(s, structured=rnd.random() < 0.5)
    send(s, b"".join(request(CMD_READ, 4096 * i, 1 << 16, cookie=i)
                     for i in range(rnd.randrange(1, 64))))


ABUSES = [hang_up_at_once, hang_up_mid_greeting, garbage, bad_client_flags,
          bad_option_magic, option_flood, long_option_cut_short,
          malformed_options, starttls, byte_at_a_time, bad_request_magic,
          out_of_range, write_cut_short, replies_never_read]


def hostile(path, n, seed):
    rnd = random.Random(seed)
    counts = {}
    for i in range(n):
        abuse = ABUSES[i % len(ABUSES)] if i < len(ABUSES) else rnd.choice(ABUSES)
        s = connect(path)
        try:
            abuse(s, rnd)
        except Closed:
            pass                # the server hung up: allowed for all of these
        finally:
            # SO_LINGER 0: a reset, the most abrupt hang-up there is.
            if rnd.random() < 0.5:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                             struct.pack("ii", 1, 0))
            s.close()
        counts[abuse.__name__] = counts.get(abuse.__name__, 0) + 1
    for k in sorted(counts):
        print("%-24s %d" % (k, counts[k]))
    print("%d hostile connections" % n)


def sigterm(path, pid, image, out):
    s = connect(path, timeout=60)
    negotiate(s)
    n, length = 64, 65536
    reqs = [request(CMD_WRITE, i * length, length, cookie=i + 1) +
            bytes([i + 1]) * length for i in range(n)]

    def sender():
        try:
            for r in reqs:
                s.sendall(r)
        except OSError:
            pass                # the server stopped reading: fine
    t = threading.Thread(target=sender)
    t.start()
    # Some requests in, most still in flight or on the wire.
    first = simple_reply(s)
    os.kill(pid, signal.SIGTERM)
    acked = []
    replies = [first]
    try:
        while True:
            replies.append(simple_reply(s))
    except Closed:
        pass
    t.join()
    for err, cookie in replies:
        if err != 0 or not 1 <= cookie <= n:
            raise SystemExit("reply error %d for cookie %d" % (err, cookie))
        acked.append(cookie)
    with open(out, "w") as f:
        f.write("".join("%d\n" % c for c in acked))
    print("%d of %d writes acknowledged before the server closed" % (len(acked), n))


def unread(s):
    """What the peer has not yet read of what s sent: SIOCOUTQ (=
    TIOCOUTQ) on a unix stream socket counts the buffers still queued at
    the peer, 0 once it has read them all."""
    return struct.unpack("i", fcntl.ioctl(s.fileno(), termios.TIOCOUTQ,
                                          bytes(4)))[0]


def hung_up(s):
    p = select.poll()
    p.register(s, select.POLLRDHUP)
    return bool(p.poll(0))


def wait_received(named, deadline=60):
    """Waits until the peer of each (name, socket) has read all that was
    sent on it; the deadline only guards against a server that never
    does.  A peer that closes frees what it had not read, so a hang-up
    is a failure, not the end of the wait."""
    end = time.monotonic() + deadline
    while True:
        gone = [name for name, s in named if hung_up(s)]
        if gone:
            raise SystemExit("FAIL: the server hung up before the hand-over: "
                             "%s" % ", ".join(gone))
        left = [(name, n) for name, n in ((name, unread(s))
                                          for name, s in named) if n]
        if not left:
            return
        if time.monotonic() > end:
            raise SystemExit("FAIL: after %d s the server has not read all "
                             "that was sent: %s" % (deadline, ", ".join(
                                 "%s (%d queued)" % x for x in left)))
        time.sleep(0.01)


def partial(path, sent, done):
    rnd = random.Random(1)
    cases = []
    size = None

    def conn():
        nonlocal size
        s = connect(path, timeout=60)
        size, _ = negotiate(s)
        return s

    def data(n):
        return bytes(rnd.getrandbits(8) for _ in range(n))

    # Half a header of a READ.
    s = conn()
    r = request(CMD_READ, 4096, 4096, cookie=11)
    send(s, r[:14])
    cases.append(("half a header", s, r[14:], [(11, 0, None)], []))
    # A WRITE's header and half its payload: combined receive, then
    # MSG_WAITALL.
    for n, off, cookie in ((4096, 1 << 20, 21), (131072, 2 << 20, 22)):
        s = conn()
        d = data(n)
        r = request(CMD_WRITE, off, n, cookie=cookie) + d
        send(s, r[:28 + n // 2])
        cases.append(("a %d-byte WRITE cut in its payload" % n, s,
                      r[28 + n // 2:], [(cookie, 0, None)], [(off, d)]))
    # A WRITE's header alone.
    s = conn()
    d = data(8192)
    r = request(CMD_WRITE, 3 << 20, 8192, cookie=31) + d
    send(s, r[:28])
    cases.append(("a WRITE's header alone", s, r[28:], [(31, 0, None)],
                  [(3 << 20, d)]))
    # A refused WRITE (past the end) with part of its payload.
    s = conn()
    r = request(CMD_WRITE, size, 65536, cookie=41) + bytes(65536)
    send(s, r[:28 + 30000])
    cases.append(("a refused WRITE cut in its payload", s, r[28 + 30000:],
                  [(41, 28, None)], []))
    # A whole READ (served by the old server) and half the next header.
    s = conn()
    r1 = request(CMD_READ, 0, 512, cookie=51)
    r2 = request(CMD_READ, 512, 512, cookie=52)
    send(s, r1 + r2[:10])
    cases.append(("a READ and half the next header", s, r2[10:],
                  [(51, 0, 512), (52, 0, 512)], []))
    # The caller checks what the server says it handed over of each
    # request, so the server must have received all that was sent before
    # the hand-over starts: wait for that event, not for a time (a loaded
    # machine can take longer than any guess).
    try:
        wait_received([(name, s) for name, s, _, _, _ in cases])
    except SystemExit:
        with open(sent, "w") as f:      # the caller waits on the fifo
            f.write("failed\n")
        raise
    with open(sent, "w") as f:
        f.write("sent\n")
    with open(done) as f:
        f.readline()
    bad = 0
    for name, s, rest, replies, written in cases:
        try:
            send(s, rest)
            got = {}
            for cookie, err, rlen in replies:
                e, c = simple_reply(s)
                if e == 0 and c in (11, 51, 52):
                    recv_exact(s, 4096 if c == 11 else 512)
                got[c] = e
            want = {c: e for c, e, _ in replies}
            if got != want:
                raise SystemExit("%s: replies %r, expected %r" % (name, got, want))
            for off, d in written:
                send(s, request(CMD_READ, off, len(d), cookie=99))
                e, c = simple_reply(s)
                back = recv_exact(s, len(d)) if e == 0 else b""
                if e or c != 99 or back != d:
                    raise SystemExit("%s: the data read back differs" % name)
            send(s, request(CMD_DISC, 0, 0, cookie=100))
            print("ok: %s" % name)
        except Closed:
            print("FAIL: %s: the connection closed" % name)
            bad += 1
        s.close()
    if bad:
        raise SystemExit(1)


def stream(path, shadow, sent, go):
    MiB = 1 << 20
    big = 64 * MiB
    w_off, r_off = 64 * MiB + 512, 0
    small_off = 40 * MiB + 4096
    next_off = 8 * MiB + 4096   # read by the successor: not small_off,
                                # which the other connection writes then
    payload = os.urandom(big)
    small = os.urandom(4096)
    with open(shadow, "rb") as f:
        f.seek(r_off)
        before = f.read(big)

    w = connect(path, timeout=60)
    negotiate(w)
    r = connect(path, timeout=60)
    negotiate(r)
    send(w, request(CMD_WRITE, w_off, big, cookie=61) + payload[:8 * MiB])
    nxt = request(CMD_READ, next_off, 4096, cookie=72)
    send(r, request(CMD_READ, r_off, big, cookie=71) + nxt[:10])

    # Both streams keep moving, slowly (1 MiB/s: neither ends for a
    # minute), until the hand-over has begun, then at full speed: a
    # server handing over gives a stalled client 5 s, and this one is
    # never stalled, however long the successor takes to start.
    going = threading.Event()
    step = 128 * 1024
    at_go = {}
    errors = []

    def paced(n, fn):
        done = 0
        while done < n:
            k = min(step, n - done)
            fn(done, k)
            done += k
            if not going.is_set():
                going.wait(0.125)
        return done

    def writer():
        try:
            rest = payload[8 * MiB:]
            sent_at_go = [None]

            def put(off, k):
                if going.is_set() and sent_at_go[0] is None:
                    sent_at_go[0] = 8 * MiB + off
                send(w, rest[off:off + k])
            paced(len(rest), put)
            at_go["write"] = sent_at_go[0]
            send(w, request(CMD_WRITE, small_off, 4096, cookie=62) + small)
        except Closed:
            errors.append("the WRITE's connection closed")

    def reader():
        try:
            e, c = simple_reply(r)
            if (e, c) != (0, 71):
                errors.append("the 64 MiB READ: error %d, cookie %d" % (e, c))
                return
            buf = bytearray(big)
            view = memoryview(buf)
            got_at_go = [None]

            def get(off, k):
                if going.is_set() and got_at_go[0] is None:
                    got_at_go[0] = off
                while k:
                    n = r.recv_into(view[off:], k)
                    if not n:
                        raise Closed()
                    off += n
                    k -= n
            paced(big, get)
            at_go["read"] = got_at_go[0]
            if bytes(buf) != before:
                errors.append("the 64 MiB READ's data differs from the "
                              "image's")
        except (Closed, OSError):
            errors.append("the READ's connection closed")

    threads = [threading.Thread(target=writer), threading.Thread(target=reader)]
    for t in threads:
        t.start()
    time.sleep(0.5)
    with open(sent, "w") as f:
        f.write("sent\n")
    with open(go) as f:
        f.readline()
    going.set()
    for t in threads:
        t.join()
    if errors:
        raise SystemExit("FAIL: " + "; ".join(errors))
    # Both must have been in the middle when the hand-over began.
    if at_go.get("write") is None or at_go.get("read") is None:
        raise SystemExit("a stream ended before the hand-over began: "
                         "%r" % at_go)
    print("ok: the hand-over began with %d of the WRITE's %d bytes sent, "
          "%d of the READ's received" % (at_go["write"], big, at_go["read"]))
    print("ok: the 64 MiB READ's reply, as the image")
    try:
        send(r, nxt[10:])
        e, c = simple_reply(r)
        if ((e, c) != (0, 72) or
                recv_exact(r, 4096) != before[next_off:next_off + 4096]):
            raise SystemExit("the READ after the 64 MiB one: error %d, "
                             "cookie %d, or its data differs" % (e, c))
        print("ok: the READ whose header was cut, served by the successor")
        got = [simple_reply(w), simple_reply(w)]
        if got != [(0, 61), (0, 62)]:
            raise SystemExit("the WRITEs' replies: %r, expected "
                             "[(0, 61), (0, 62)]" % got)
        print("ok: the 64 MiB WRITE and the one behind it acknowledged")
        for off, d, cookie in ((w_off, payload, 63), (small_off, small, 64)):
            send(w, request(CMD_READ, off, len(d), cookie=cookie))
            e, c = simple_reply(w)
            if (e, c) != (0, cookie) or recv_big(w, len(d)) != d:
                raise SystemExit("%d bytes at %d: not read back as written"
                                 % (len(d), off))
        print("ok: both WRITEs read back as written")
        for s in (w, r):
            send(s, request(CMD_DISC, 0, 0, cookie=100))
            s.close()
    except Closed:
        raise SystemExit("FAIL: a connection closed")
    with open(shadow, "r+b") as f:
        f.seek(w_off)
        f.write(payload)
        f.seek(small_off)
        f.write(small)

def flags(path):
    s = connect(path)
    _, f = negotiate(s)
    send(s, request(CMD_DISC, 0, 0))
    s.close()
    print("0x%x" % f)


def listen_at(path):
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    ls = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    ls.bind(path)
    ls.listen(8)
    return ls


def taken_stream(ho_path, nbd_path, size, eflags, shadow):
    MiB = 1 << 20
    count, got, off, cookie = 24 * MiB, 9 * MiB + 123, 16 * MiB + 1536, 81
    payload = os.urandom(count)
    ho_ls, nbd_ls = listen_at(ho_path), listen_at(nbd_path)
    ho_ls.settimeout(30)
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    mine.settimeout(60)
    succ, _ = ho_ls.accept()
    succ.settimeout(30)
    recv_exact(succ, 16)                                    # the hello
    offer = struct.pack(">QIIQII", 0x50444f484f464652, 1, 1, size, 0,
                        os.getpid())
    succ.sendmsg([offer], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                            struct.pack("2i", nbd_ls.fileno(),
                                        ho_ls.fileno()))])
    hdr = request(CMD_WRITE, off, count, cookie=cookie)
    record = struct.pack(">IIQHHII", 0x434f4e4e, 4, size, eflags, 0,
                         32 * MiB, 28) + hdr + struct.pack(">II", got, 0)
    succ.sendmsg([record], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                             struct.pack("i", theirs.fileno()))])
    theirs.close()
    succ.sendall(payload[:got])
    succ.sendall(struct.pack(">Q", 0x50444f48454e4421))
    if struct.unpack(">Q", recv_exact(succ, 8))[0] != 0x50444f4841434b21:
        raise SystemExit("the successor did not acknowledge")
    print("ok: the successor took the connection over with %d payload "
          "bytes" % got)
    try:
        send(mine, payload[got:])
        e, c = simple_reply(mine)
        if (e, c) != (0, cookie):
            raise SystemExit("the %d-byte WRITE: error %d, cookie %d"
                             % (count, e, c))
        send(mine, request(CMD_READ, off, count, cookie=82))
        e, c = simple_reply(mine)
        if (e, c) != (0, 82) or recv_big(mine, count) != payload:
            raise SystemExit("the %d-byte WRITE: not read back as written"
                             % count)
        print("ok: the WRITE acknowledged and read back as written")
        send(mine, request(CMD_DISC, 0, 0, cookie=100))
    except Closed:
        raise SystemExit("FAIL: the connection closed")
    with open(shadow, "r+b") as f:
        f.seek(off)
        f.write(payload)


def stranger(path):
    s = connect(path)
    send(s, b"GET / HTTP/1.0\r\n\r\n")
    try:
        s.recv(1)
    except (OSError, socket.timeout):
        pass
    s.close()


def fake_old_server(path, kind):
    ls = listen_at(path)
    ls.settimeout(30)
    s, _ = ls.accept()
    s.settimeout(30)
    hello = recv_exact(s, 16)
    magic = 0x50444f484f464652
    version, n, fds = 1, 0, [ls.fileno(), ls.fileno()]
    if kind == "magic":
        magic ^= 1
    elif kind == "version":
        version = 99
    elif kind == "count":
        n = 1 << 20
    elif kind == "fds":
        fds = [0, 1]            # not listening sockets
    offer = struct.pack(">QIIQII", magic, version, n, 0, 0, os.getpid())
    s.sendmsg([offer], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                         struct.pack("%di" % len(fds), *fds))])
    s.sendall(struct.pack(">Q", 0x50444f48454e4421))
    try:
        s.recv(8)
    except (OSError, socket.timeout):
        pass
    print("hello %r; sent a broken offer (%s)" % (hello[:8], kind))


def main():
    if sys.argv[1] == "hostile":
        hostile(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    elif sys.argv[1] == "sigterm":
        sigterm(sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5])
    elif sys.argv[1] == "partial":
        partial(sys.argv[2], sys.argv[3], sys.argv[4])
    elif sys.argv[1] == "stream":
        stream(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5])
    elif sys.argv[1] == "flags":
        flags(sys.argv[2])
    elif sys.argv[1] == "taken-stream":
        taken_stream(sys.argv[2], sys.argv[3], int(sys.argv[4]),
                     int(sys.argv[5], 0), sys.argv[6])
    elif sys.argv[1] == "stranger":
        stranger(sys.argv[2])
    elif sys.argv[1] == "fake-old-server":
        fake_old_server(sys.argv[2], sys.argv[3])
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main()
