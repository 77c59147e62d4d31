#!/usr/bin/env python3
"""Writes the seed corpus of fuzz_server (tests/robust/corpus-server/):
one file per client conversation, each a well-formed or a deliberately
broken handshake followed by requests.  Byte 0 picks the export, byte 1
the receive cap (see the header of fuzz_server.c).  Rerun it after
changing the seeds; the fuzzer never writes into the source tree."""
import os
import struct
import sys

out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "corpus-server")
os.makedirs(out, exist_ok=True)

IHAVEOPT = 0x49484156454F5054


def opt(code, data=b""):
    return struct.pack(">QII", IHAVEOPT, code, len(data)) + data


def go(name=b"", infos=(), code=7):
    return opt(code, struct.pack(">I", len(name)) + name +
               struct.pack(">H", len(infos)) +
               b"".join(struct.pack(">H", i) for i in infos))


def meta(code, queries, name=b""):
    d = struct.pack(">I", len(name)) + name + struct.pack(">I", len(queries))
    for q in queries:
        d += struct.pack(">I", len(q)) + q
    return opt(code, d)


def req(typ, offset=0, count=0, flags=0, cookie=1, payload=b""):
    return struct.pack(">IHHQQI", 0x25609513, flags, typ, cookie, offset,
                       count) + payload


FLAGS = struct.pack(">I", 3)        # fixed newstyle, no zeroes
SR = opt(8)
seeds = {
    "go-read-write": FLAGS + SR + go(b"", (1, 2, 3)) +
        req(1, 4096, 512, payload=b"x" * 512) + req(0, 0, 4096) +
        req(3) + req(1, 0, 16, flags=1, payload=b"y" * 16) + req(2),
    "go-meta-block-status": FLAGS + SR +
        meta(9, []) + meta(9, [b"base:"]) +
        meta(10, [b"base:allocation", b"x-other:thing"]) + go() +
        req(7, 0, 65536) + req(7, 512, 4096, flags=8) + req(2),
    "export-name-simple": struct.pack(">I", 1) + opt(1, b"anything") +
        req(0, 0, 512) + req(6, 0, 8192, flags=2 | 16) + req(4, 0, 4096) +
        req(2),
    "list-info-abort": FLAGS + opt(3) + go(b"name", (0, 1, 2, 3), code=6) +
        opt(2),
    "starttls-unknown": FLAGS + opt(5) + opt(99, b"junk") + opt(11) + go(),
    "bad-client-flags": struct.pack(">I", 0xff),
    "bad-option-magic": FLAGS + b"\0" * 16,
    "option-too-long": FLAGS + struct.pack(">QII", IHAVEOPT, 3, 5000) +
        b"z" * 5000 + go(),
    "option-huge": FLAGS + struct.pack(">QII", IHAVEOPT, 7, 0xffffffff),
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
