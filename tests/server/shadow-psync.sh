#!/usr/bin/env bash
# The shadow-model test of shadow.sh with backend=psync (preadv2/pwritev2
# on the same O_DIRECT descriptor instead of io_uring).
set -eu
. "$TESTS_SRCDIR/lib/common.sh"
make_tmpdir
pick_seed

img=$tmp/odd.img
make_image "$img" $((10 * 1024 * 1024 + 1234)) "$seed"
shadow_args="-n 6000 -c 4 -q 8"
shadow_run shadow-psync "$img" backend=psync

grep -q 'backend psync' "$tmp/shadow-psync.log" || fail "backend=psync did not select psync"
all_paths_taken "$tmp/shadow-psync.log"
