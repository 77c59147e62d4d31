#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
# relay_io.py SOCKET SHADOW SEED: libnbd through test_relay's unix socket
# (oldstyle, then relay.c and TLS to pdio serve): writes of 512 B to
# 4 MiB, many in flight at once (so that both of the relay's buffers fill
# and drain), reads of the same, each checked against SHADOW (a copy of
# the image), which is kept up to date and written back for cmp.
import random
import sys

import nbd

sock, shadow_path, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
rng = random.Random(seed)
with open(shadow_path, "rb") as f:
    shadow = bytearray(f.read())
size = len(shadow)

h = nbd.NBD()
h.connect_unix(sock)
assert h.get_size() == size, (h.get_size(), size)

bad = 0
ops = 0
for rnd in range(6):
    # A batch of non-overlapping writes in flight together.
    cmds = []
    used = []
    for _ in range(24):
        n = rng.choice([512, 4096, 65536, 1 << 20, 4 << 20])
        off = rng.randrange(0, (size - n) // 512) * 512
        if any(off < b and a < off + n for a, b in used):
            continue
        used.append((off, off + n))
        data = rng.randbytes(n)
        shadow[off:off + n] = data
        cmds.append(h.aio_pwrite(data, off))
    while h.aio_in_flight() > 0:
        h.poll(-1)
    h.flush()
    ops += len(cmds)
    # Reads in flight together, each against the shadow.
    reads = []
    for _ in range(24):
        n = rng.choice([512, 4096, 65536, 1 << 20, 4 << 20])
        off = rng.randrange(0, (size - n) // 512) * 512
        buf = nbd.Buffer(n)
        reads.append((off, n, buf, h.aio_pread(buf, off)))
    while h.aio_in_flight() > 0:
        h.poll(-1)
    for off, n, buf, _ in reads:
        if buf.to_bytearray() != shadow[off:off + n]:
            bad += 1
            print("# mismatch at %d+%d" % (off, n))
    ops += len(reads)
h.shutdown()
with open(shadow_path, "wb") as f:
    f.write(shadow)
print("ops %d mismatches %d" % (ops, bad))
sys.exit(1 if bad else 0)
