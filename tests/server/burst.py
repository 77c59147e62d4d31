#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""A client that pipelines the way fio and the kernel do, for
tests/server/pipelined.sh.

  burst.py SOCKET SEED BURSTS IMAGE SHADOW

Each burst is 32 requests sent in one sendall, before any reply is read:
4 KiB WRITEs (each with its own bytes) and, one in eight, 4 KiB READs,
all within the first 96 KiB, so that writes to the same block are in
flight together.  Then the 32 replies, in whatever order they come; a
READ's data is not checked (it may see either of two overlapping writes).
The shadow starts as IMAGE's first 96 KiB, read from the file before
anything is written, and follows the writes in the order they were sent;
it goes to SHADOW at the end, for the caller to hold the image to once
the server has stopped (so that nothing but the bursts and the handshake
runs on the connection).  Prints the counts; exit 0, or 1 on a wrong
reply.
"""
import os
import random
import socket
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "lib"))
import nbdwire as w  # noqa: E402

BLOCK = 4096
BLOCKS = 24
DEPTH = 32


def replies(s, reads, n):
    """n simple replies; a READ's (cookie in reads) data follows it."""
    for _ in range(n):
        err, cookie = w.simple_reply(s)
        if err:
            raise SystemExit("request %d failed: error %d" % (cookie, err))
        if cookie in reads:
            w.recv_exact(s, BLOCK)
            reads.discard(cookie)


def main():
    path, seed, bursts = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    image, shadow_path = sys.argv[4], sys.argv[5]
    rnd = random.Random(seed)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(60)
    s.connect(path)
    size, _ = w.negotiate(s)
    if size < BLOCKS * BLOCK:
        raise SystemExit("image of %d bytes is too small" % size)
    with open(image, "rb") as f:
        shadow = bytearray(f.read(BLOCKS * BLOCK))

    cookie = 100
    writes = nreads = 0
    for _ in range(bursts):
        out = bytearray()
        reads = set()
        for _ in range(DEPTH):
            cookie += 1
            off = rnd.randrange(BLOCKS) * BLOCK
            if rnd.randrange(8) == 0:
                out += w.request(w.CMD_READ, off, BLOCK, cookie=cookie)
                reads.add(cookie)
                nreads += 1
                continue
            data = bytes([cookie & 0xff]) * 8 + rnd.randbytes(BLOCK - 8)
            out += w.request(w.CMD_WRITE, off, BLOCK, cookie=cookie) + data
            shadow[off:off + BLOCK] = data
            writes += 1
        w.send(s, bytes(out))
        replies(s, reads, DEPTH)

    with open(shadow_path, "wb") as f:
        f.write(shadow)
    w.send(s, w.request(w.CMD_DISC, cookie=3))
    s.close()
    print("writes %d reads %d" % (writes, nreads))


if __name__ == "__main__":
    main()
