#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""A known mix of NBD requests through libnbd, for tests/cli/stats.tap.

statsclient.py mix SOCKET SIZE: reads, writes, flushes, trims, zeroes and
block status of known counts and lengths, and one read past the end
(refused: EINVAL).  statsclient.py readonly SOCKET: one write to a
read-only export (refused: EPERM).  Either prints what it sent as JSON:
{"op": {"requests": N, "bytes": B, "errors": {"ERRNO": N}}}, bytes being
the lengths of the requests that succeeded, as pdio stats counts them.
libnbd's strict mode is off so that the refused requests reach the
server.
"""
import errno
import json
import sys

import nbd

OPS = ("read", "write", "flush", "trim", "zero", "block_status", "other")


def main():
    what, sock = sys.argv[1], sys.argv[2]
    sent = {op: {"requests": 0, "bytes": 0, "errors": {}} for op in OPS}
    h = nbd.NBD()
    h.add_meta_context("base:allocation")
    h.set_strict_mode(0)
    h.connect_unix(sock)

    def ok(op, length):
        sent[op]["requests"] += 1
        sent[op]["bytes"] += length

    def refused(op, fn, want):
        try:
            fn()
        except nbd.Error as e:
            # libnbd gives the errno's name (or its number, in some
            # versions).
            name = errno.errorcode[want]
            if e.errno not in (want, name):
                sys.exit("%s: errno %s, expected %s" % (op, e.errno, name))
            sent[op]["requests"] += 1
            sent[op]["errors"][name] = sent[op]["errors"].get(name, 0) + 1
            return
        sys.exit("%s: succeeded, expected errno %d" % (op, want))

    if what == "mix":
        size = int(sys.argv[3])
        for i in range(20):
            h.pread(4096, i * 4096)
            ok("read", 4096)
        for i in range(7):
            h.pwrite(bytes([i]) * 8192, 1048576 + i * 8192)
            ok("write", 8192)
        for _ in range(3):
            h.flush()
            ok("flush", 0)
        for i in range(4):
            h.trim(65536, 2097152 + i * 65536)
            ok("trim", 65536)
        for i in range(5):
            h.zero(131072, 4194304 + i * 131072)
            ok("zero", 131072)
        for _ in range(2):
            h.block_status(1048576, 0, lambda *a: 0)
            ok("block_status", 1048576)
        # Past NBD_STREAM_OVER (2 MiB): the server streams it in pieces.
        h.pread(2 * 1048576 + 4096, 0)
        ok("read", 2 * 1048576 + 4096)
        refused("read", lambda: h.pread(4096, size), errno.EINVAL)
    elif what == "readonly":
        refused("write", lambda: h.pwrite(b"x" * 4096, 0), errno.EPERM)
        h.pread(512, 0)
        ok("read", 512)
    else:
        sys.exit("unknown mix " + what)
    h.shutdown()
    json.dump(sent, sys.stdout)
    print()


main()
