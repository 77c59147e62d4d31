#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# What pdio advertises to clients (nbdinfo --json), on images whose size is
# a multiple of 4096 so that the block-size contract is tested on its own:
#   - writable, flush, FUA, trim, zero, fast zero, multi-conn, extents
#     (base:allocation);
#   - block sizes: minimum = 1 (any byte offset, as qemu-nbd), preferred =
#     the file's direct-I/O alignment (512 on /, or align=4096), which the
#     front ends give the kernel as its logical block size, maximum = 32 MiB;
#     the same on images whose size is not a multiple of the alignment;
#   - FUA is native: FUA writes alone never reach the plugin's flush (the
#     engine's flushes= counter stays 0), as they would if nbdkit emulated
#     FUA with a flush after each write.
set -eu
. "$TESTS_SRCDIR/lib/common.sh"
require_cmd nbdinfo
make_tmpdir

img=$tmp/img
make_image "$img" $((4 * 1024 * 1024)) 5
# The contract's preferred size on / is 512: check / really takes 512-byte
# O_DIRECT I/O at a 512-byte offset, so a mismatch is pdio's.
dd if="$img" of=/dev/null bs=512 skip=1 count=1 iflag=direct status=none ||
    hard_error "$tmp does not take 512-byte direct I/O; the expected preferred size is wrong here"

check_sizes ()
{
    _json=$1 _pref=$2
    for _f in block_size_minimum:1 block_size_preferred:$_pref \
              block_size_maximum:33554432; do
        _got=$(info_field "$_json" "${_f%%:*}")
        echo "${_f%%:*}=$_got"
        [ "$_got" = "${_f#*:}" ] || fail "${_f%%:*} is '$_got', expected ${_f#*:}"
    done
}

start_server "$tmp/default.log" "$PLUGIN" file="$img"
nbdinfo --json "$uri" > "$tmp/default.json"
cat "$tmp/default.json"
run_client "$tools/nbdreq" "$sock" write:0:4096:1:fua write:4196:100:2:fua \
    write:100000:5000:3:fua
stop_server
show_stats "$tmp/default.log"

for f in can_flush can_fua can_trim can_zero can_fast_zero can_multi_conn; do
    [ "$(info_field "$tmp/default.json" $f)" = true ] || fail "$f is not true"
done
[ "$(info_field "$tmp/default.json" is_read_only)" = false ] || fail "served read-only"
grep -q '"base:allocation"' "$tmp/default.json" || fail "no base:allocation context (extents)"
check_sizes "$tmp/default.json" 512
[ "$(stat_value "$tmp/default.log" writes)" = 3 ] || fail "expected 3 writes in the stats"
[ "$(stat_value "$tmp/default.log" flushes)" = 0 ] ||
    fail "FUA writes caused flushes: FUA is emulated, not native"

img4k=$tmp/img4k
make_image "$img4k" $((4 * 1024 * 1024)) 6
start_server "$tmp/align4k.log" "$PLUGIN" file="$img4k" align=4096
nbdinfo --json "$uri" > "$tmp/align4k.json"
stop_server
check_sizes "$tmp/align4k.json" 4096

# Sizes that are not a multiple of the alignment: nothing changes (the
# minimum is 1 anyway; the size need not be a multiple of the preferred).
for case in $((4 * 1024 * 1024 + 1536)):4096:4096 \
            $((4 * 1024 * 1024 + 1234)):512:512 \
            $((4 * 1024 * 1024 + 1)):512:512; do
    size=${case%%:*} rest=${case#*:}
    align=${rest%%:*} want=${rest#*:}
    make_image "$tmp/odd-$size" "$size" 7
    start_server "$tmp/odd-$size.log" "$PLUGIN" file="$tmp/odd-$size" align="$align"
    nbdinfo --json "$uri" > "$tmp/odd-$size.json"
    stop_server
    echo "size $size, align=$align:"
    check_sizes "$tmp/odd-$size.json" "$want"
done
echo "advertised as the contract says"
