#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Once a server has exited cleanly, the image is free: serving it again at
# once works.  pdio takes an exclusive lock on the image so that two
# servers cannot write it at the same time; that lock must be gone when
# nbdkit has exited, not some time later (a supervisor restarting the
# server, or the next step of a script, would be refused).  Each round
# does I/O on two connections first, so the engine's per-thread rings and
# whatever they hold exist when the server stops.
set -eu
. "$TESTS_SRCDIR/lib/common.sh"
make_tmpdir
pick_seed

img=$tmp/img
make_image "$img" $((1024 * 1024 + 1234)) "$seed"
for round in 1 2 3 4 5 6 7 8 9 10; do
    start_server "$tmp/round$round.log" "$PLUGIN" file="$img"
    run_client "$tools/nbdreq" "$sock" write:$round:4096:$round read:$round:4096:$round > /dev/null &
    run_client "$tools/nbdreq" "$sock" write:$((600000 + round)):700:$round read:$((600000 + round)):700:$round > /dev/null
    wait $! || fail "round $round: I/O failed"
    stop_server
done
echo "served the same image 10 times in a row, each started right after the last exited"
