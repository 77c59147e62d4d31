#!/usr/bin/env python3
"""Writes the seed corpus of fuzz_server (tests/robust/corpus-server/):
one file per client conversation, each a well-formed or a deliberately
broken handshake followed by requests.  Byte 0 picks the export, byte 1
the receive cap (see the header of fuzz_server.c).  The client-* seeds
(byte 0 bit 6) are a server's side instead, for the client's readers.
Rerun it after changing the seeds; the fuzzer never writes into the
source tree."""
import os
import struct
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "lib"))
from nbdwire import (  # noqa: E402
    C_FIXED_NEWSTYLE, C_NO_ZEROES, IHAVEOPT, NBDMAGIC, OPT_GO, REP_MAGIC,
    SIMPLE_REPLY_MAGIC, STRUCTURED_REPLY_MAGIC, client_flags, info_request,
    meta_request, option, request)

out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "corpus-server")
os.makedirs(out, exist_ok=True)

opt = option


def go(name=b"", infos=(), code=7):
    return opt(code, info_request(name, infos))


def meta(code, queries, name=b""):
    return opt(code, meta_request(queries, name))


def req(typ, offset=0, count=0, flags=0, cookie=1, payload=b""):
    return request(typ, offset, count, cookie, flags) + payload


FLAGS = client_flags(C_FIXED_NEWSTYLE | C_NO_ZEROES)
SR = opt(8)
seeds = {
    "go-read-write": FLAGS + SR + go(b"", (1, 2, 3)) +
        req(1, 4096, 512, payload=b"x" * 512) + req(0, 0, 4096) +
        req(3) + req(1, 0, 16, flags=1, payload=b"y" * 16) + req(2),
    "go-meta-block-status": FLAGS + SR +
        meta(9, []) + meta(9, [b"base:"]) +
        meta(10, [b"base:allocation", b"x-other:thing"]) + go() +
        req(7, 0, 65536) + req(7, 512, 4096, flags=8) + req(2),
    "export-name-simple": client_flags(C_FIXED_NEWSTYLE) + opt(1, b"anything") +
        req(0, 0, 512) + req(6, 0, 8192, flags=2 | 16) + req(4, 0, 4096) +
        req(2),
    "list-info-abort": FLAGS + opt(3) + go(b"name", (0, 1, 2, 3), code=6) +
        opt(2),
    "starttls-unknown": FLAGS + opt(5) + opt(99, b"junk") + opt(11) + go(),
    "bad-client-flags": client_flags(0xff),
    "bad-option-magic": FLAGS + b"\0" * 16,
    "option-too-long": FLAGS + opt(3, b"z" * 5000) + go(),
    "option-huge": FLAGS + opt(7, length=0xffffffff),
    "go-malformed": FLAGS + opt(7, struct.pack(">I", 100) + b"ab") +
        opt(10, b"\0\0\0\0\0\0\0\5") + go(),
    "bad-requests": FLAGS + go() + req(0, 0, 0) + req(0, 1 << 62, 512) +
        req(1, 0, 1 << 30) + req(0, 0, 64 << 20, flags=4) + req(9) +
        req(3, 1, 1) + req(0, 0, 512, flags=0x8000),
    "readonly-writes": FLAGS + SR + go() +
        req(1, 0, 512, payload=b"w" * 512) + req(4, 0, 512) + req(6, 0, 512),
    "truncated-write": FLAGS + go() + req(1, 0, 4096, payload=b"p" * 100),
    "bad-request-magic": FLAGS + go() + b"\xde\xad\xbe\xef" + b"\0" * 24,
}
# TLS (byte 0 bits 4-5: 1 on, 2 require): plain-text options that must be
# refused, then STARTTLS (taken as a TLS handshake that succeeded) and a
# session inside it; a second STARTTLS; EXPORT_NAME before TLS.
seeds["tls-require-refused-then-starttls"] = (
    FLAGS + SR + opt(3) + go(b"", (0, 1, 2, 3), code=6) + go() +
    meta(9, [b"base:"]) + opt(99, b"x") + opt(5, b"data") + opt(5) +
    opt(5) + SR + go(b"", (3,)) + req(0, 0, 4096) + req(2))
seeds["tls-require-export-name"] = FLAGS + opt(1, b"x") + req(0, 0, 512)
seeds["tls-require-abort"] = FLAGS + opt(3) + opt(2)
seeds["tls-on-plain-go"] = FLAGS + SR + go() + req(0, 0, 512) + req(2)
seeds["tls-on-starttls-go"] = (FLAGS + SR + opt(5) + meta(10, [b"base:allocation"])
                               + go() + req(7, 0, 4096) + req(2))
exports = {"readonly-writes": 1 | 2}
tls = {"tls-require-refused-then-starttls": 0x20,
       "tls-require-export-name": 0x20, "tls-require-abort": 0x20,
       "tls-on-plain-go": 0x10, "tls-on-starttls-go": 0x10}
for name, body in seeds.items():
    with open(os.path.join(out, name), "wb") as f:
        f.write(bytes([exports.get(name, 2) | tls.get(name, 0), 0]) + body)
    with open(os.path.join(out, name + "-short-reads"), "wb") as f:
        f.write(bytes([exports.get(name, 2) | 8 | tls.get(name, 0), 7]) + body)


# What a server sends, for the client's readers (byte 0 bit 6).
def hello_from_server(gflags=3):
    return struct.pack(">QQH", NBDMAGIC, IHAVEOPT, gflags)


def reply(typ, payload=b"", option=OPT_GO):
    return struct.pack(">QIII", REP_MAGIC, option, typ, len(payload)) + payload


def chunk(typ, payload=b"", flags=1, cookie=1):
    return struct.pack(">IHHQI", STRUCTURED_REPLY_MAGIC, flags, typ, cookie,
                       len(payload)) + payload


def simple(error=0, cookie=1):
    return struct.pack(">IIQ", SIMPLE_REPLY_MAGIC, error, cookie)


client = {
    "client-go": hello_from_server() +
        reply(3, struct.pack(">HQH", 0, 1 << 30, 0x1cd)) +
        reply(3, struct.pack(">H", 1) + b"name") +
        reply(3, struct.pack(">H", 2) + b"a description") +
        reply(3, struct.pack(">HIII", 3, 512, 4096, 32 << 20)) +
        reply(3, struct.pack(">H", 99) + b"?") +
        reply(4, struct.pack(">I", 1) + b"base:allocation") +
        reply(1) + simple() + simple(22, 2) +
        chunk(1, struct.pack(">Q", 4096) + b"d" * 16, flags=0) +
        chunk(5, struct.pack(">IIIII", 1, 4096, 0, 8192, 3)) +
        chunk(0x8001, struct.pack(">IH", 5, 3) + b"bad") + chunk(0),
    "client-malformed": hello_from_server() +
        reply(3, struct.pack(">HQ", 0, 1 << 30) + b"x") +
        reply(3, struct.pack(">HIII", 3, 512, 4096, 1) + b"x") +
        reply(3, b"\0") + reply(4, b"\0\0\1") + reply(1) +
        chunk(5, b"\0" * 7) + chunk(0x8001, struct.pack(">IH", 5, 9) + b"x") +
        chunk(1, b"\0" * 4),
}
for name, body in client.items():
    with open(os.path.join(out, name), "wb") as f:
        f.write(bytes([0x40, 0]) + body)
