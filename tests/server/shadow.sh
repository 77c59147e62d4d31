#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Shadow-model random I/O through pdio.so with the default backend
# (io_uring) on an image on / whose size is not a multiple of any block
# size (10 MiB + 1234 bytes): 4 connections x 8 requests in flight of
# reads, writes, FUA writes, zero (may-trim, no-hole, fast), trim and flush
# at aligned and unaligned offsets, lengths 1 byte .. 2 MiB.  Every read is
# checked as it completes, the whole export at the end, and the image file
# against the shadow after the server exits.  The engine's counters must
# show that all three paths were taken: direct, bounced, and
# read-modify-write of partial blocks, plus writes into the partial tail.
set -eu
. "$TESTS_SRCDIR/lib/common.sh"
make_tmpdir
pick_seed

shadow_odd shadow 12000

log=$tmp/shadow.log
grep -q 'backend io_uring' "$log" || fail "the default backend is not io_uring here"
all_paths_taken "$log"
# One stats line per connection closed (4) and one at exit.
n=$(grep -c 'stats:' "$log")
[ "$n" -ge 5 ] || fail "$n 'stats:' lines in the log, expected one per connection (4) and one at exit"
echo "direct=$(stat_value "$log" direct) bounced=$(stat_value "$log" bounced) rmw_blocks=$(stat_value "$log" rmw_blocks)"
