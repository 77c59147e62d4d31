# SPDX-License-Identifier: BSD-3-Clause
"""The NBD wire format for the Python test clients that speak it by hand
(tests/server/rawclient.py, tests/server/tlsclient.py, the seed corpus of
tests/protocol/mkcorpus-server.py and the short clients inside the server
tests): the constants, each message as bytes (a client's, and a
server's for the fuzzer's seeds), and a socket's side of the handshake.
The C side's one codec is src/protocol (proto.h); this is the same
layout, for what libnbd will not send.

Socket helpers raise Closed when the server hangs up, resets or times
out, and SystemExit on a reply that breaks the protocol.
"""
import struct

NBDMAGIC = 0x4e42444d41474943
IHAVEOPT = 0x49484156454F5054
REP_MAGIC = 0x3e889045565a9
REQUEST_MAGIC = 0x25609513
SIMPLE_REPLY_MAGIC = 0x67446698
STRUCTURED_REPLY_MAGIC = 0x668e33ef

FLAG_FIXED_NEWSTYLE, FLAG_NO_ZEROES = 1, 2
C_FIXED_NEWSTYLE, C_NO_ZEROES = 1, 2

OPT_EXPORT_NAME, OPT_ABORT, OPT_LIST, OPT_STARTTLS = 1, 2, 3, 5
OPT_INFO, OPT_GO, OPT_STRUCTURED_REPLY = 6, 7, 8
OPT_LIST_META_CONTEXT, OPT_SET_META_CONTEXT = 9, 10

REP_ACK, REP_SERVER, REP_INFO, REP_META_CONTEXT = 1, 2, 3, 4
REP_ERR_UNSUP, REP_ERR_POLICY, REP_ERR_INVALID = 0x80000001, 0x80000002, 0x80000003
REP_ERR_TLS_REQD = 0x80000005

INFO_EXPORT, INFO_NAME, INFO_DESCRIPTION, INFO_BLOCK_SIZE = 0, 1, 2, 3

CMD_READ, CMD_WRITE, CMD_DISC, CMD_FLUSH, CMD_TRIM = 0, 1, 2, 3, 4
CMD_WRITE_ZEROES, CMD_BLOCK_STATUS = 6, 7
CMD_FLAG_FUA, CMD_FLAG_NO_HOLE, CMD_FLAG_DF = 1, 2, 4
CMD_FLAG_REQ_ONE, CMD_FLAG_FAST_ZERO = 8, 16

REPLY_FLAG_DONE = 1
REPLY_TYPE_NONE, REPLY_TYPE_OFFSET_DATA, REPLY_TYPE_BLOCK_STATUS = 0, 1, 5
REPLY_TYPE_ERROR = 0x8001

EINVAL = 22

GREETING_LEN = 18
OPTION_REPLY_LEN = 20
REQUEST_LEN = 28
SIMPLE_REPLY_LEN = 16


# --- messages as bytes ---------------------------------------------------------
def client_flags(flags=C_FIXED_NEWSTYLE | C_NO_ZEROES):
    return struct.pack(">I", flags)


def option(code, data=b"", length=None):
    """An option: its header (length, if given, in place of the data's
    own), then the data."""
    return struct.pack(">QII", IHAVEOPT, code,
                       len(data) if length is None else length) + data


def info_request(name=b"", infos=()):
    """INFO and GO's data: an export name and the NBD_INFO_* asked for."""
    return (struct.pack(">I", len(name)) + name + struct.pack(">H", len(infos))
            + b"".join(struct.pack(">H", i) for i in infos))


def meta_request(queries, name=b""):
    """LIST_META_CONTEXT and SET_META_CONTEXT's data."""
    return (struct.pack(">I", len(name)) + name + struct.pack(">I", len(queries))
            + b"".join(struct.pack(">I", len(q)) + q for q in queries))


def request(typ, offset=0, count=0, cookie=1, flags=0):
    return struct.pack(">IHHQQI", REQUEST_MAGIC, flags, typ, cookie, offset,
                       count)


def server_greeting(gflags=FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES):
    return struct.pack(">QQH", NBDMAGIC, IHAVEOPT, gflags)


def reply(typ, payload=b"", option=OPT_GO):
    """An option reply and its payload."""
    return struct.pack(">QIII", REP_MAGIC, option, typ, len(payload)) + payload


def info_export(size, eflags):
    return struct.pack(">HQH", INFO_EXPORT, size, eflags)


def info_string(typ, s):
    """NBD_INFO_NAME or NBD_INFO_DESCRIPTION."""
    return struct.pack(">H", typ) + s


def info_block_size(minimum, preferred, maximum):
    return struct.pack(">HIII", INFO_BLOCK_SIZE, minimum, preferred, maximum)


def meta_context(context_id, name):
    return struct.pack(">I", context_id) + name


def simple(error=0, cookie=1):
    """A simple reply's header."""
    return struct.pack(">IIQ", SIMPLE_REPLY_MAGIC, error, cookie)


def chunk(typ, payload=b"", flags=REPLY_FLAG_DONE, cookie=1):
    """A structured reply chunk and its payload."""
    return struct.pack(">IHHQI", STRUCTURED_REPLY_MAGIC, flags, typ, cookie,
                       len(payload)) + payload


def offset_data(offset, data):
    return struct.pack(">Q", offset) + data


def error_payload(error, message=b"", length=None):
    """ERROR's payload (length, if given, in place of the message's own)."""
    return struct.pack(">IH", error,
                       len(message) if length is None else length) + message


def block_status(context_id, extents):
    """BLOCK_STATUS's payload: (length, flags) per extent."""
    return struct.pack(">I", context_id) + b"".join(
        struct.pack(">II", length, flags) for length, flags in extents)


# --- a socket ------------------------------------------------------------------
class Closed(Exception):
    pass


def recv_exact(s, n):
    buf = b""
    while len(buf) < n:
        try:
            chunk = s.recv(n - len(buf))
        except OSError:         # resets, timeouts, TLS errors
            raise Closed()
        if not chunk:
            raise Closed()
        buf += chunk
    return buf


def recv_big(s, n):
    """recv_exact without the copying that grows with n squared."""
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        try:
            k = s.recv_into(view[got:], n - got)
        except OSError:
            raise Closed()
        if not k:
            raise Closed()
        got += k
    return bytes(buf)


def send(s, data):
    try:
        s.sendall(data)
    except OSError:
        raise Closed()


def greeting(s):
    """Reads the server's greeting; returns its flags."""
    magic, opt, flags = struct.unpack(">QQH", recv_exact(s, GREETING_LEN))
    if magic != NBDMAGIC or opt != IHAVEOPT:
        raise SystemExit("bad greeting")
    return flags


def hello(s, cflags=C_FIXED_NEWSTYLE | C_NO_ZEROES):
    """The greeting, then the client's flags; returns the server's."""
    flags = greeting(s)
    send(s, client_flags(cflags))
    return flags


def send_option(s, code, data=b""):
    send(s, option(code, data))


def option_reply(s):
    """One option reply: (option, type, payload)."""
    magic, opt, typ, length = struct.unpack(">QIII",
                                            recv_exact(s, OPTION_REPLY_LEN))
    if magic != REP_MAGIC:
        raise SystemExit("bad option reply magic")
    return opt, typ, recv_exact(s, length)


def info_type(payload):
    return struct.unpack(">H", payload[:2])[0]


def parse_info_export(payload):
    """NBD_INFO_EXPORT's (size, transmission flags)."""
    if len(payload) != 12:
        raise SystemExit("NBD_INFO_EXPORT of %d bytes" % len(payload))
    return struct.unpack(">QH", payload[2:])


def go(s, infos=(INFO_BLOCK_SIZE,)):
    """NBD_OPT_GO for the default export, its replies up to the ACK;
    returns (size, transmission flags)."""
    send_option(s, OPT_GO, info_request(b"", infos))
    export = None
    while True:
        opt, typ, data = option_reply(s)
        if typ == REP_INFO:
            if info_type(data) == INFO_EXPORT:
                export = parse_info_export(data)
        elif typ == REP_ACK:
            break
        else:
            raise SystemExit("GO failed: reply type 0x%x" % typ)
    if export is None:
        raise SystemExit("GO: no NBD_INFO_EXPORT")
    return export


def negotiate(s, structured=False):
    """Fixed newstyle, structured replies if asked, GO; returns (size,
    transmission flags)."""
    hello(s)
    if structured:
        send_option(s, OPT_STRUCTURED_REPLY)
        if option_reply(s)[1] != REP_ACK:
            raise SystemExit("structured replies refused")
    return go(s)


def simple_reply(s):
    """A simple reply's header: (error, cookie)."""
    magic, err, cookie = struct.unpack(">IIQ", recv_exact(s, SIMPLE_REPLY_LEN))
    if magic != SIMPLE_REPLY_MAGIC:
        raise SystemExit("bad simple reply magic 0x%x" % magic)
    return err, cookie
