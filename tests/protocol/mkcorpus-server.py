#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""Writes the seed corpus of fuzz_server (tests/protocol/corpus-server/):
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
    C_FIXED_NEWSTYLE, C_NO_ZEROES, INFO_DESCRIPTION, INFO_NAME, REP_ACK,
    REP_INFO, REP_META_CONTEXT, REPLY_TYPE_BLOCK_STATUS, REPLY_TYPE_ERROR,
    REPLY_TYPE_NONE, REPLY_TYPE_OFFSET_DATA, block_status, chunk,
    client_flags, error_payload, info_block_size, info_export, info_request,
    info_string, meta_context, meta_request, offset_data, option, reply,
    request, server_greeting, simple)

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
INFO, ACK = REP_INFO, REP_ACK
client = {
    "client-go": server_greeting() +
        reply(INFO, info_export(1 << 30, 0x1cd)) +
        reply(INFO, info_string(INFO_NAME, b"name")) +
        reply(INFO, info_string(INFO_DESCRIPTION, b"a description")) +
        reply(INFO, info_block_size(512, 4096, 32 << 20)) +
        reply(INFO, info_string(99, b"?")) +
        reply(REP_META_CONTEXT, meta_context(1, b"base:allocation")) +
        reply(ACK) + simple() + simple(22, 2) +
        chunk(REPLY_TYPE_OFFSET_DATA, offset_data(4096, b"d" * 16), flags=0) +
        chunk(REPLY_TYPE_BLOCK_STATUS, block_status(1, [(4096, 0), (8192, 3)])) +
        chunk(REPLY_TYPE_ERROR, error_payload(5, b"bad")) +
        chunk(REPLY_TYPE_NONE),
    # Each payload a byte short or over, an error message running past.
    "client-malformed": server_greeting() +
        reply(INFO, info_export(1 << 30, 0)[:-1]) +
        reply(INFO, info_block_size(512, 4096, 1) + b"x") +
        reply(INFO, b"\0") + reply(REP_META_CONTEXT, b"\0\0\1") + reply(ACK) +
        chunk(REPLY_TYPE_BLOCK_STATUS, b"\0" * 7) +
        chunk(REPLY_TYPE_ERROR, error_payload(5, b"x", length=9)) +
        chunk(REPLY_TYPE_OFFSET_DATA, b"\0" * 4),
}
for name, body in client.items():
    with open(os.path.join(out, name), "wb") as f:
        f.write(bytes([0x40, 0]) + body)
