#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Crash consistency: SIGKILL nbdkit (pdio.so) in the middle of a concurrent
# write workload with FUA writes and flushes, cut the power of the disk
# under it, restart, and check that every write acknowledged before a
# completed flush and every acknowledged FUA write reads back intact, that
# writes in flight (or acknowledged but not yet flushed) are old, new or
# torn only within their own range, and that nothing else changed.  Eight
# kill points, at random times (from the printed seed), alternating
# align=512 and align=4096, on an image of odd size (the tail path), half
# with backend=io_uring and half with the default (psync on FUSE).
#
# Why a power cut and not just the kill: an O_DIRECT write that completed
# is in the file whatever happens to the process, so after a mere SIGKILL
# the data would be there even if flush and FUA did nothing.  O_DIRECT
# skips the page cache, not the disk's volatile write cache.  So the image
# sits on volatile_fs (a FUSE file system that models such a cache: writes
# are volatile until an fsync/fdatasync, and the power cut keeps a random
# half of what was not synced).  The kill comes first, then the cut; then
# the durable image is served again, directly from disk, and crash_io
# verify checks it against the journal of what the client saw (crash_io.c
# explains the rule).  With flush or FUA turned into no-ops in the engine,
# acknowledged durable writes are lost at the cut and this test fails
# (checked by hand when this test was written).
#
# The client sees the server die (connection reset), never hangs up on a
# live one, so nbdkit 1.32.5's abort on client hang-up cannot occur here.
set -eu
. "$TESTS_SRCDIR/lib/common.sh"
require_cmd fusermount3 mountpoint
[ -c /dev/fuse ] || hard_error "/dev/fuse is missing: FUSE is needed to model a volatile disk cache"
make_tmpdir
pick_seed

bin=$TESTS_BUILDDIR/engine
rounds=${PDIO_CRASH_ROUNDS:-8}
disk=$tmp/disk.img
make_image "$disk" $((8 * 1024 * 1024 + 1234)) "$seed"

# A seeded stream of small numbers for the kill delays.
rand_state=$seed
next_rand ()
{
    rand_state=$(( (rand_state * 1103515245 + 12345) % 2147483648 ))
    rand=$(( rand_state / 65536 ))
}

# For wait_until: volatile_fs serves $mnt; crash_io is running.  Either
# fails the test if its process has exited.
fs_up ()
{
    mountpoint -q "$mnt" && [ -f "$mnt/img" ] && return 0
    kill -0 "$fs_pid" 2>/dev/null && return 1
    cat "$tmp/fs.$round.log"
    hard_error "volatile_fs did not mount"
}

client_running ()
{
    grep -qs "^running" "$tmp/run.$round.out" && return 0
    kill -0 "$client_pid" 2>/dev/null && return 1
    cat "$tmp/run.$round.out"
    fail "crash_io exited before running"
}

total_durable=0 total_dropped=0 total_datasyncs=0
for round in $(seq 1 "$rounds"); do
    rseed=$((seed + round))
    if [ $((round % 2)) = 1 ]; then align=512; else align=4096; fi
    # A FUA write's sync makes everything before it durable as well, so
    # rounds that use only flushes or only FUA are what would expose the
    # other being a no-op.
    case $((round % 3)) in
    1) mode=flush ;; 2) mode=fua ;; 0) mode=mixed ;;
    esac
    # On FUSE pdio defaults to psync (io_uring mishandles short direct
    # transfers there); rounds 1-4 ask for io_uring, 5-8 take the default.
    if [ "$round" -le $((rounds / 2)) ]; then backend=io_uring; else backend=default; fi
    next_rand
    delay_ms=$((300 + rand % 1700))
    echo "== round $round: seed $rseed, align=$align, $mode, backend $backend, kill after ${delay_ms} ms"

    cp "$disk" "$tmp/base.img"
    mnt=$tmp/mnt.$round
    mkdir "$mnt"
    "$bin/volatile_fs" -b "$disk" -s "$rseed" -k 50 "$mnt" \
        > "$tmp/fs.$round.log" 2>&1 &
    fs_pid=$!
    at_exit "fusermount3 -u -z '$mnt' 2>/dev/null; kill $fs_pid 2>/dev/null"
    wait_until 10 fs_up || hard_error "volatile_fs did not mount in 10 s"

    if [ $backend = default ]; then bparam=; else bparam=backend=$backend; fi
    # shellcheck disable=SC2086
    start_server "$tmp/server.$round.log" "$PLUGIN" file="$mnt/img" align=$align $bparam
    "$bin/crash_io" run -s "$rseed" -j "$tmp/journal.$round" -m $mode -c 4 -q 8 "$sock" \
        > "$tmp/run.$round.out" 2>&1 &
    client_pid=$!
    wait_until 10 client_running || fail "crash_io did not start in 10 s"
    sleep "$(printf '%d.%03d' $((delay_ms / 1000)) $((delay_ms % 1000)))"

    kill -KILL "$server_pid"
    st=0; wait "$server_pid" || st=$?
    [ $st = 137 ] || { cat "$server_log"; fail "round $round: nbdkit was not running at the kill point (status $st)"; }
    # The power goes off right after the process died.
    echo cut > "$mnt/powercut"
    st=0; wait $client_pid || st=$?
    cat "$tmp/run.$round.out"
    [ $st = 0 ] || fail "round $round: crash_io run failed with status $st (seed $rseed)"
    fusermount3 -u -z "$mnt"
    wait $fs_pid || { cat "$tmp/fs.$round.log"; fail "volatile_fs exited with an error"; }
    cat "$tmp/fs.$round.log"

    # Restart on what the disk kept, and check it.
    start_server "$tmp/verify.$round.log" "$PLUGIN" file="$disk" align=$align
    st=0
    run_client "$bin/crash_io" verify -s "$rseed" -j "$tmp/journal.$round" \
        -b "$tmp/base.img" "$sock" > "$tmp/verify.$round.out" 2>&1 || st=$?
    cat "$tmp/verify.$round.out"
    stop_server
    [ $st = 0 ] || fail "round $round: data lost or corrupted after the crash (seed $rseed; rerun with PDIO_TEST_SEED=$seed)"

    durable=$(sed -n 's/^verify: .*acknowledged, \([0-9]*\) durable.*/\1/p' "$tmp/verify.$round.out")
    total_durable=$((total_durable + ${durable:-0}))
    dropped=$(sed -n 's/.*power cut:.* cut_dropped=\([0-9]*\).*/\1/p' "$tmp/fs.$round.log")
    syncs=$(sed -n 's/.*power cut:.*(datasync \([0-9]*\)).*/\1/p' "$tmp/fs.$round.log")
    total_dropped=$((total_dropped + ${dropped:-0}))
    total_datasyncs=$((total_datasyncs + ${syncs:-0}))
    rm -f "$tmp/journal.$round"
done
echo "$rounds kill points survived: $total_durable durable writes intact, $total_datasyncs fdatasyncs reached the disk, $total_dropped unsynced writes were lost at the cuts"
[ "$total_datasyncs" -gt 0 ] || fail "no fdatasync ever reached the disk: flush and FUA cannot have worked"
[ "$total_durable" -gt 0 ] || fail "no write was ever durable at a kill point: the test proved nothing"
[ "$total_dropped" -gt 0 ] || fail "no unsynced write was ever lost at a power cut: the test proved nothing"
