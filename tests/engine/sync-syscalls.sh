#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# What flush and FUA turn into, seen by strace on a short session:
#
#   backend=psync: a plain write is pwritev2(..., 0); a FUA write is
#   pwritev2(..., RWF_DSYNC); a flush is fdatasync on the image; and no
#   write is followed by a sync nobody asked for.
#   backend=io_uring (the default): the writes and the flush are
#   io_uring_enter calls (no pwritev2, no fdatasync system call at all: a
#   flush is IORING_OP_FSYNC with IORING_FSYNC_DATASYNC on the ring).
#
# Why psync for the flags: with io_uring the RWF_DSYNC flag travels in the
# submission queue entry, in memory shared with the kernel, and strace
# shows only io_uring_enter(fd, to_submit, ...), never the entry.  So the
# third part looks where the flag must end up, with both backends: at the
# disk.  The image sits on ext4 (no journal, so no flush but ours) on a
# loop device, whose requests a private tracefs instance records
# (block:block_rq_issue).  The loop device has a volatile write cache and
# no FUA, so the block layer turns a FUA write into the write plus a cache
# flush ("FF"): a plain write must reach the device with no flush after
# it, a FUA write must be followed by a flush before its reply, and a
# flush must issue one.  crash.sh checks the same durability end to end
# (data that survives a power cut), this shows what the kernel is asked.
set -eu
# strace follows nbdkit's pid file and threads: nbdkit serves, always.
. "$TESTS_SRCDIR/lib/common.sh" --server=nbdkit
require_cmd strace losetup mkfs.ext4 mount umount
make_tmpdir
pick_seed

img=$tmp/img
make_image "$img" $((4 * 1024 * 1024)) "$seed"

# nbdkit under strace: the pid file still names nbdkit itself, so
# stop_server signals it and strace exits with it.
real_nbdkit=$NBDKIT
cat > "$tmp/nbdkit-strace" <<EOF
#!/bin/sh
exec strace -f -qq -s 0 -o "\$STRACE_OUT" \
    -e trace=fdatasync,fsync,sync_file_range,pwritev2,pwrite64,io_uring_enter \
    "$real_nbdkit" "\$@"
EOF
chmod +x "$tmp/nbdkit-strace"

plain=1048576 fua=2097152
session ()
{
    run_client "$tools/nbdreq" "$sock" \
        write:$plain:4096:0x11 write:$fua:4096:0x22:fua flush \
        read:$plain:4096:0x11 read:$fua:4096:0x22
}

NBDKIT=$tmp/nbdkit-strace

echo "== backend=psync"
export STRACE_OUT=$tmp/psync.trace
start_server "$tmp/psync.log" "$PLUGIN" file="$img" backend=psync
session
stop_server
grep -E 'pwritev2|fdatasync|fsync' "$tmp/psync.trace" || :

w_plain=$(grep -E "pwritev2\\(.*, $plain, " "$tmp/psync.trace" || :)
w_fua=$(grep -E "pwritev2\\(.*, $fua, " "$tmp/psync.trace" || :)
[ -n "$w_plain" ] || fail "no pwritev2 at offset $plain for the plain write"
[ -n "$w_fua" ] || fail "no pwritev2 at offset $fua for the FUA write"
case $w_plain in *RWF_DSYNC*) fail "the plain write carries RWF_DSYNC: $w_plain" ;; esac
case $w_fua in *RWF_DSYNC*) ;; *) fail "the FUA write does not carry RWF_DSYNC: $w_fua" ;; esac
n=$(grep -c 'fdatasync(' "$tmp/psync.trace" || :)
[ "$n" = 1 ] || fail "$n fdatasync calls for one flush (and no other sync requested)"
# The flush's fdatasync comes after both writes.
last_write=$(grep -n 'pwritev2(' "$tmp/psync.trace" | tail -n 1 | cut -d: -f1)
sync_line=$(grep -n 'fdatasync(' "$tmp/psync.trace" | cut -d: -f1)
[ "$sync_line" -gt "$last_write" ] || fail "fdatasync came before the writes it should make durable"
echo "psync: plain write without flags, FUA write with RWF_DSYNC, flush = fdatasync: ok"

echo "== backend=io_uring"
export STRACE_OUT=$tmp/uring.trace
start_server "$tmp/uring.log" "$PLUGIN" file="$img"
session
stop_server
log_has "$tmp/uring.log" "backend io_uring"
n=$(grep -c 'io_uring_enter(' "$tmp/uring.trace" || :)
[ "$n" -gt 0 ] || fail "no io_uring_enter: the writes did not go through io_uring"
! grep -q 'pwritev2(' "$tmp/uring.trace" || fail "pwritev2 used although the backend is io_uring"
n=$(grep -c 'fdatasync(' "$tmp/uring.trace" || :)
[ "$n" = 0 ] || fail "$n fdatasync system calls with io_uring: the flush should be an IORING_OP_FSYNC on the ring"
echo "io_uring: $(grep -c 'io_uring_enter(' "$tmp/uring.trace") io_uring_enter calls, flush on the ring: ok"

echo "== at the device: ext4 on a loop device, block_rq_issue traced"
tracing=/sys/kernel/tracing
[ -d "$tracing/instances" ] || mount -t tracefs nodev "$tracing" ||
    hard_error "tracefs is not available at $tracing"
truncate -s 64M "$tmp/disk"
mkfs.ext4 -q -O ^has_journal "$tmp/disk"
loopdev=$(losetup -f --show "$tmp/disk")
at_exit "losetup -d $loopdev"
mkdir "$tmp/mnt"
mount -o noatime "$loopdev" "$tmp/mnt"
at_exit "umount '$tmp/mnt'"
echo "$loopdev: fua=$(cat "/sys/block/${loopdev#/dev/}/queue/fua") write_cache=$(cat "/sys/block/${loopdev#/dev/}/queue/write_cache")"
inst=$tracing/instances/pdio-test-$$
mkdir "$inst"
at_exit "echo 0 > '$inst/events/block/block_rq_issue/enable'; rmdir '$inst'"
devno=$(( ($(stat -c '0x%t' "$loopdev") << 20) | $(stat -c '0x%T' "$loopdev") ))
echo "dev == $devno" > "$inst/events/block/block_rq_issue/filter"

# Requests between two marks, as "RWBS" words.
between ()
{
    sed -n "/pdio-mark $1\$/,/pdio-mark $2\$/p" "$tmp/$3.blk" |
        sed -n 's/.*block_rq_issue: [0-9]*,[0-9]* \([A-Z]*\) .*/\1/p' | tr '\n' ' '
}

for backend in io_uring psync; do
    make_image "$tmp/mnt/img" $((4 * 1024 * 1024)) "$seed"
    sync
    start_server "$tmp/blk-$backend.log" "$PLUGIN" file="$tmp/mnt/img" backend=$backend
    log_has "$tmp/blk-$backend.log" "backend $backend"
    : > "$inst/trace"
    echo 1 > "$inst/events/block/block_rq_issue/enable"
    mark () { echo "pdio-mark $1" > "$inst/trace_marker"; }
    mark plain
    run_client "$tools/nbdreq" "$sock" write:$plain:4096:0x33 > /dev/null
    mark fua
    run_client "$tools/nbdreq" "$sock" write:$fua:4096:0x44:fua > /dev/null
    mark flush
    run_client "$tools/nbdreq" "$sock" flush > /dev/null
    mark end
    echo 0 > "$inst/events/block/block_rq_issue/enable"
    cp "$inst/trace" "$tmp/$backend.blk"
    stop_server
    grep -E 'pdio-mark|block_rq_issue' "$tmp/$backend.blk" | sed 's/^ *//'
    p=$(between plain fua "$backend") f=$(between fua flush "$backend") l=$(between flush end "$backend")
    echo "$backend: plain write: [$p] FUA write: [$f] flush: [$l]"
    case " $p" in *" W"*) ;; *) fail "$backend: the plain write never reached the device" ;; esac
    case " $p" in *F*) fail "$backend: a plain write was followed by a cache flush or FUA: [$p]" ;; esac
    case " $f" in *" W"*) ;; *) fail "$backend: the FUA write never reached the device" ;; esac
    # A flush request (FF), or the write itself carrying FUA (WF...).
    case " $f" in *" FF"*|*" WF"*) ;; *) fail "$backend: a FUA write was acknowledged with no cache flush or FUA at the device: [$f]" ;; esac
    case " $l" in *" FF"*) ;; *) fail "$backend: a flush was acknowledged with no cache flush at the device: [$l]" ;; esac
    echo "$backend: FUA and flush reach the device as cache flushes, a plain write does not: ok"
done
