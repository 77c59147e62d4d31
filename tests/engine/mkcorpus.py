#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
# Regenerates tests/engine/corpus/, the seed corpus of fuzz_plan: one input
# per interesting shape of request (see fuzz_plan.c for the byte layout).
# The files are committed; this only says how they were made.
import struct, os
out = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'corpus')
def seed(name, align_exp, mem_exp, cap, offset, count, residue, write, execute, short=0, eagain=0, eof=0, data=1):
    scale_count = count
    # count bytes: top 5 bits scale, low 27 bits value; pick the scale so that
    # count-1 < 16 << scale and the value is count-1.
    scale = 0
    while (16 << scale) <= count - 1 and scale < 22:
        scale += 1
    raw = (scale << 27) | (count - 1)
    flags = (1 if write else 0) | (2 if execute else 0) | (short << 2) | (eagain << 5)
    b = bytes([align_exp, mem_exp]) + struct.pack('<H', cap) + struct.pack('<Q', offset) \
        + struct.pack('<I', raw) + struct.pack('<H', residue) + bytes([flags, eof]) + struct.pack('<Q', data)
    open(os.path.join(out, name), 'wb').write(b)
# align 512 (exp 0), 4096 (exp 3), 64K (exp 7); mem_align exps: 2 (4 B), 9 (512), 12 (4096)
seed('read-aligned-direct',            0, 9, 0, 4096, 8192, 0, False, True)
seed('write-aligned-direct',           0, 9, 0, 4096, 8192, 0, True, True)
seed('write-unaligned-head-tail',      0, 2, 100, 1000, 5000, 16, True, True)
seed('write-inside-one-block',         3, 9, 0, 4097, 100, 16, True, True)
seed('write-two-partial-blocks-4k',    3, 9, 0, 4000, 200, 4080, True, True)
seed('read-misaligned-memory-bounced', 3, 12, 0, 0, 65536, 16, False, True)
seed('write-chunked-small-cap',        0, 9, 0, 777, 100000, 16, True, True, short=3)
seed('read-eof-inside-block',          0, 9, 0, 300, 3000, 0, False, True, eof=128)
seed('write-short-and-eagain',         3, 2, 5000, 513, 70000, 64, True, True, short=2, eagain=3)
seed('read-short-transfers',           3, 9, 0, 8192, 200000, 0, False, True, short=2)
seed('write-64k-align',                7, 12, 1000, 65535, 131074, 4096, True, True)
seed('plan-64mib-write-unaligned',     0, 9, 0, 12345, 64 << 20, 16, True, False)
seed('plan-64mib-read-direct',         3, 9, 65535, 1 << 30, 64 << 20, 0, False, False)
seed('plan-huge-offset',               3, 2, 1234, (1 << 40) - 5, 9, 7, True, False)
seed('plan-1-byte-write',              7, 12, 0, 65535, 1, 1, True, False)
seed('plan-cap-not-multiple',          3, 9, 4321, 100, 3 << 20, 4095, True, False)
