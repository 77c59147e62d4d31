#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Negative control: interleave_io must catch the bug it is for.  Served by
# racy_rmw.so (whole-block read-modify-write with no lock), it has to
# report a lost write; if it passed, interleave.sh would prove nothing.
set -eu
# racy_rmw.so is an nbdkit plugin: nbdkit serves, always.
. "$TESTS_SRCDIR/lib/common.sh" --server=nbdkit
make_tmpdir
pick_seed

racy=$(built "$TESTS_BUILDDIR/server/.libs/racy_rmw.so")
img=$tmp/small.img
make_image "$img" $((64 * 1024 + 1234)) "$seed"

start_server "$tmp/racy.log" "$racy" file="$img"
status=0
run_client "$tools/interleave_io" -s "$seed" -i "$img" -c 4 -q 16 -n 1500 \
    "$sock" > "$tmp/out" 2>&1 || status=$?
cat "$tmp/out"
stop_server
[ $status -eq 1 ] ||
    fail "interleave_io exited $status against a server that loses writes (want 1)"
grep -q 'write lost' "$tmp/out" ||
    fail "interleave_io failed, but not by reporting a lost write"
echo "interleave_io detected the racy read-modify-write, as it must"
