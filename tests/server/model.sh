#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Randomized model test at the NBD level, reproducible from one number.
#
#   model.sh [--seed N]        (or PDIO_MODEL_SEED=N under make check)
#
# Each seed picks a whole configuration - align=512 or 4096, an odd image
# size (0.25 .. 12 MiB plus 1 .. 4095 bytes, never a multiple of 512),
# backend io_uring or psync, 1 .. 6 connections, 1 .. 16 requests in flight
# on each, the largest request (4 KiB .. 2 MiB), the number of requests -
# and is then shadow_io's seed, which decides every request: reads, writes
# and FUA writes, zeroes (may-trim, no-hole, fast), trims and flushes at
# random offsets and lengths, checked byte for byte against a shadow image
# as they complete, over the whole export at the end, and on the image
# file after the server exits (tests/lib/shadow_io.c; this script
# only adds the random geometry around it, so the model is not written
# twice).  Requests that overlap a change are never in flight together, so
# the outcome of every request is determined: the same seed replays the
# same test.
#
# Without --seed, 6 seeds are run: the one pick_seed prints and the next
# five.  Each failure names its seed and the command that replays it.
set -eu
. "$TESTS_SRCDIR/lib/common.sh"

only=${PDIO_MODEL_SEED:-}
while [ $# -gt 0 ]; do
    case $1 in
    --seed) only=$2; shift 2 ;;
    --seed=*) only=${1#--seed=}; shift ;;
    *) hard_error "usage: model.sh [--seed N]" ;;
    esac
done

make_tmpdir
if [ -n "$only" ]; then
    seeds=$only
else
    pick_seed
    seeds="$seed $((seed + 1)) $((seed + 2)) $((seed + 3)) $((seed + 4)) $((seed + 5))"
fi

# The geometry is a function of the seed: numbers cut from its sha256, so
# that neighbouring seeds give unrelated configurations.
pick ()
{
    r=$(( 0x${_hash:$((_at * 6)):6} % $1 ))
    _at=$((_at + 1))
}

for s in $seeds; do
    _hash=$(printf 'pdio-model-%s' "$s" | sha256sum | cut -c1-64) _at=0
    pick 2; if [ $r = 0 ]; then align=512; else align=4096; fi
    pick 2; if [ $r = 0 ]; then backend=io_uring; else backend=psync; fi
    pick 48; size=$(( (r + 1) * 256 * 1024 ))
    pick 4095; size=$((size + r + 1))
    [ $((size % 512)) != 0 ] || size=$((size + 1))
    pick 6; conns=$((r + 1))
    pick 16; depth=$((r + 1))
    pick 10; maxlen=$((4096 << r))
    [ $maxlen -le 2097152 ] || maxlen=2097152
    pick 3000; ops=$((2000 + r))

    echo "== seed $s: align=$align backend=$backend size=$size conns=$conns depth=$depth maxlen=$maxlen ops=$ops"
    echo "   replay: PDIO_MODEL_SEED=$s make check TESTS=server/model.sh (or: tests/server/model.sh --seed $s)"
    img=$tmp/model-$s.img
    make_image "$img" "$size" "$s"
    # shadow_run fails the test, naming shadow_io's seed, which is $s.
    seed=$s
    shadow_args="-n $ops -c $conns -q $depth -m $maxlen"
    shadow_run "model-$s" "$img" align=$align backend=$backend
    log_has "$tmp/model-$s.log" "backend $backend"
    rm -f "$img"
done
echo "model: seeds $seeds passed"
