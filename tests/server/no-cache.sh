#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# No double caching, measured: after a mixed aligned + unaligned workload
# through pdio (reads, writes, FUA, zero, trim, flush, including the
# partial tail block), none of the image's pages are in the host page
# cache -- neither while the server still runs nor after it exits.
# For comparison only, the same workload through nbdkit's file plugin.
set -eu
. "$TESTS_SRCDIR/lib/common.sh"
require_cmd fincore
make_tmpdir
pick_seed

size=$((10 * 1024 * 1024 + 1234))
workload="-s $seed -n 1500 -c 4 -q 8"

# cold IMAGE: the image starts with nothing cached (or the figure would
# mean nothing).
cold ()
{
    [ "$(fincore_pages "$1")" = 0 ] || drop_cache "$1"
    [ "$(fincore_pages "$1")" = 0 ] ||
        hard_error "cannot drop $1 from the page cache: $(fincore_pages "$1") pages stay"
}

img=$tmp/img
make_image "$img" $size "$seed"
cold "$img"
start_server "$tmp/pdio.log" "$PLUGIN" file="$img"
# shellcheck disable=SC2086
run_client "$tools/shadow_io" -r $workload -i "$img" -o "$tmp/shadow" "$sock" ||
    fail "shadow_io failed (seed $seed)"
during=$(fincore_pages "$img")
stop_server
after=$(fincore_pages "$img")
show_stats "$tmp/pdio.log"
echo "pdio: $during pages of $img cached after the workload, $after after the server exited"

# The comparison: same workload, same image content, the file plugin.
ref=$tmp/ref
make_image "$ref" $size "$seed"
cold "$ref"
start_server "$tmp/file.log" file file="$ref"
# shellcheck disable=SC2086
run_client "$tools/shadow_io" $workload -i "$ref" "$sock" > "$tmp/file.out" ||
    { cat "$tmp/file.out"; fail "shadow_io over the file plugin failed"; }
file_pages=$(fincore_pages "$ref")
stop_server
echo "file plugin (comparison only): $file_pages pages of $((  (size + 4095) / 4096 )) cached after the same workload"

[ "$during" = 0 ] || fail "pdio left $during pages of the image in the page cache"
[ "$after" = 0 ] || fail "$after pages of the image in the page cache after pdio exited"
# Only now may the image be read through the cache.
cmp "$tmp/shadow" "$img" || fail "the image differs from the shadow"
