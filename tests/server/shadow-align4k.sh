#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# align=4096 on ordinary storage: the export advertises a 4096-byte
# preferred block size (minimum 1), and the shadow-model test passes with every request
# mapped onto 4 KiB blocks (so a 512-byte aligned write is read-modify-
# write too).
set -eu
. "$TESTS_SRCDIR/lib/common.sh"
require_cmd nbdinfo
make_tmpdir
pick_seed

# Its own image: serving the same one again right after is restart.sh's
# business, not this test's.
make_image "$tmp/info.img" $((1024 * 1024 + 8192)) "$seed"
start_server "$tmp/info.log" "$PLUGIN" file="$tmp/info.img" align=4096
nbdinfo --json "$uri" > "$tmp/info.json"
stop_server
pref=$(info_field "$tmp/info.json" block_size_preferred)
echo "align=4096: block_size_preferred=$pref"
[ "$pref" = 4096 ] || fail "align=4096 advertises a preferred block size of '$pref', not 4096"

shadow_odd shadow-align4k 6000 align=4096
v=$(stat_value "$tmp/shadow-align4k.log" rmw_blocks)
[ "$v" -gt 0 ] || fail "rmw_blocks=$v with align=4096 after an unaligned workload"
