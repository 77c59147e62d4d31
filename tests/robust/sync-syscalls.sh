#!/usr/bin/env bash
# What flush and FUA turn into, seen by strace on a short session:
#
#   backend=psync: a plain write is pwritev2(..., 0); a FUA write is
#   pwritev2(..., RWF_DSYNC); a flush is fdatasync on the image; and no
#   write is followed by a sync nobody asked for.
#   backend=io_uring (the default): the writes are io_uring_enter calls
#   (no pwritev2 at all) and a flush is still fdatasync.
#
# Why psync for the flags: with io_uring the RWF_DSYNC flag travels in the
# submission queue entry, in memory shared with the kernel, and strace
# shows only io_uring_enter(fd, to_submit, ...), never the entry.  Both
# backends get the flag from the same place (the planner's rw_flags, see
# src/io.c), and crash.sh checks that FUA writes through io_uring really
# are synced: its volatile disk model sees the fsync each one causes, and
# its "fua" rounds fail when they are not.
set -eu
. "$TESTS_SRCDIR/lib/common.sh"
require_cmd strace
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
[ "$n" = 1 ] || fail "$n fdatasync calls for one flush with io_uring"
echo "io_uring: $(grep -c 'io_uring_enter(' "$tmp/uring.trace") io_uring_enter calls, flush = fdatasync: ok"
