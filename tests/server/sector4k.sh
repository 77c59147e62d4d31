#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# 4 KiB backing: an ext4 file system on a loop device with 4096-byte
# logical sectors, so the image's direct-I/O alignment is 4096 (512-byte
# O_DIRECT fails there).  pdio must advertise a preferred block size of
# 4096 (the minimum is 1), refuse align=512 (below what the file allows), and pass the
# shadow-model and the interleaved-write tests with every request mapped
# onto 4 KiB blocks.
set -eu
. "$TESTS_SRCDIR/lib/common.sh"
require_cmd losetup mkfs.ext4 mount umount nbdinfo
make_tmpdir
pick_seed

truncate -s 96M "$tmp/backing"
loop=$(losetup --find --show --sector-size 4096 "$tmp/backing") ||
    hard_error "losetup --sector-size 4096 failed"
at_exit "losetup -d '$loop'"
echo "loop device: $loop ($(blockdev --getss "$loop")-byte sectors)"
mkfs.ext4 -q -F "$loop"
mkdir "$tmp/mnt"
mount "$loop" "$tmp/mnt"
at_exit "umount_retry '$tmp/mnt'"
dir=$tmp/mnt

# The premise: 4096-byte direct I/O works there, 512-byte does not.
make_image "$dir/probe" $((1024 * 1024)) 1
dd if="$dir/probe" of=/dev/null bs=4096 count=1 iflag=direct status=none ||
    hard_error "4096-byte O_DIRECT fails on the 4K file system"
if dd if="$dir/probe" of=/dev/null bs=512 skip=1 count=1 iflag=direct status=none 2>/dev/null; then
    hard_error "512-byte O_DIRECT works on the 4K file system: it is not a 4K test"
fi

start_server "$tmp/info.log" "$PLUGIN" file="$dir/probe"
nbdinfo --json "$uri" > "$tmp/info.json"
stop_server
pref=$(info_field "$tmp/info.json" block_size_preferred)
echo "4K file system: block_size_preferred=$pref"
[ "$pref" = 4096 ] || fail "preferred block size '$pref' on a 4K file system, expected 4096"

expect_start_failure "$tmp/align512.log" "$PLUGIN" file="$dir/probe" align=512
log_has "$tmp/align512.log" "align=512"

img=$dir/odd.img
make_image "$img" $((10 * 1024 * 1024 + 1234)) "$seed"
shadow_args="-n 6000 -c 4 -q 8"
shadow_run shadow-4k "$img"
v=$(stat_value "$tmp/shadow-4k.log" rmw_blocks)
[ "$v" -gt 0 ] || fail "rmw_blocks=$v on the 4K file system after an unaligned workload"

small=$dir/small.img
make_image "$small" $((192 * 1024 + 1234)) "$seed"
interleave_args="-c 4 -q 16 -n 5000"
interleave_run interleave-4k "$small"
