#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Concurrent unaligned writes to disjoint bytes of the same blocks from 4
# connections, 16 writes in flight on each (1..700 bytes, see
# interleave_io.c); no write may be lost.  Run with align=512 and with
# align=4096, on an image of 192 KiB + 1234 bytes so that every block is
# shared and the partial tail block is in play.  This catches a
# read-modify-write that is not serialised against overlapping ones.
set -eu
. "$TESTS_SRCDIR/lib/common.sh"
make_tmpdir
pick_seed

interleave_args="-c 4 -q 16 -n 6000"
for a in 512 4096; do
    img=$tmp/small-$a.img
    make_image "$img" $((192 * 1024 + 1234)) "$seed"
    interleave_run interleave-align$a "$img" align=$a
    v=$(stat_value "$tmp/interleave-align$a.log" rmw_blocks)
    [ "$v" -gt 0 ] || fail "align=$a: rmw_blocks=$v: the writes were not read-modify-write"
done
