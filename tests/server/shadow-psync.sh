#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The shadow-model test of shadow.sh with backend=psync (preadv2/pwritev2
# on the same O_DIRECT descriptor instead of io_uring).
set -eu
. "$TESTS_SRCDIR/lib/common.sh"
make_tmpdir
pick_seed

shadow_odd shadow-psync 6000 backend=psync

grep -q 'backend psync' "$tmp/shadow-psync.log" || fail "backend=psync did not select psync"
all_paths_taken "$tmp/shadow-psync.log"
