#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# A client that pipelines (fio, the kernel) has its requests taken in
# rounds, not one trip through the ring each: 16 bursts of 32 requests
# (4 KiB writes, some to the same blocks, and reads), each burst sent
# whole before its replies are read (server/burst.py).  strace counts the
# server's io_uring_enter calls over the session: with each receive made
# on the ring there is at least one per request (measured: 1.2); with the
# receives that find bytes waiting made at once, well under one (0.2-0.6
# on a loaded machine: the rest are the write completions' wake-ups); the
# bound is 7/8.  The image must then
# hold what the writes left in the order they were sent (overlapping
# writes are not reordered by being taken in a batch).
set -eu
. "$TESTS_SRCDIR/lib/common.sh" --server=native
require_cmd strace python3 cmp
make_tmpdir
pick_seed

bursts=16
requests=$((bursts * 32))
img=$tmp/img
make_image "$img" $((1024 * 1024)) "$seed"

start_server "$tmp/server.log" "$PLUGIN" file="$img"
strace -f -p "$server_pid" -o "$tmp/strace" -e trace=io_uring_enter,recvmsg \
    2> "$tmp/strace.err" &
strace_pid=$!
at_exit "kill $strace_pid 2>/dev/null"
wait_until 10 grep -qs 'attached' "$tmp/strace.err" ||
    { cat "$tmp/strace.err"; fail "strace did not attach to the server"; }
sleep 0.2       # every thread: strace announces them one by one
run_client python3 "$TESTS_SRCDIR/server/burst.py" "$sock" "$seed" "$bursts" \
    "$img" "$tmp/shadow" || fail "burst.py failed (seed $seed)"
kill "$strace_pid"; wait "$strace_pid" || :
stop_server

# A call strace shows in two parts ("resumed") is counted once.
enters=$(grep -c 'io_uring_enter(' "$tmp/strace" || :)
recvs=$(grep -c 'recvmsg(' "$tmp/strace" || :)
echo "$requests requests: $enters io_uring_enter, $recvs recvmsg"
head -c $((24 * 4096)) "$img" | cmp - "$tmp/shadow" ||
    fail "the image differs from the shadow of the writes in order (seed $seed)"
[ "$enters" -gt 0 ] || fail "strace saw no io_uring_enter: it traced the wrong threads"
[ $((enters * 8)) -lt $((requests * 7)) ] ||
    fail "$enters io_uring_enter calls for $requests pipelined requests: not under 7 per 8"
