# SPDX-License-Identifier: BSD-3-Clause
# --- resize: pdio resize and the image's identity ---------------------------------------
# The image grows under a mounted filesystem while fio runs on it; pdio
# resize gives the device the new size (NBD_CMD_RECONFIGURE), the kernel's
# uevent follows, resize2fs / xfs_growfs grow the filesystem online.
# Before growing, the old filesystem is filled (fallocate) to RS_SLACK of
# free space, so that RS_NEW of files written after it cannot all fit in
# the old space: their being there, intact after a remount, proves the
# new space usable.  A server killed after that comes back at the new
# size.  The device carries the image's identity
# (NBD_ATTR_BACKEND_IDENTIFIER), which the kernel insists every
# reconfigure repeats, and the supervisor does not serve another file put
# at the image's path.  Shrinking an open device is refused (mounted;
# open by a process) and allowed once it is closed; nbdkit (pdio attach
# --nbdkit, which pdio resize restarts) grows too.
#
# Each test was shown to fail against a deliberately broken pdio
# (run.sh --break LIST, tests/vm/breaks.c):
#   resize-no-reconfigure   pdio resize does not tell the kernel: the
#                           device keeps its size, the grow tests fail
#   resize-no-shrink-check  pdio resize shrinks a device in use: the
#                           shrink test fails
#   resize-no-restart       pdio resize does not restart nbdkit: the
#                           nbdkit test fails (its server serves the old
#                           size, which pdio resize sees and refuses)
#   no-backend              pdio attach gives the kernel no identity: the
#                           backend test fails (empty backend, and a
#                           reconfigure for another image is taken)
#   no-identity-check       the supervisor serves whatever file is at the
#                           image's path: the replaced-image test fails
#   supervisor-stale-size   the supervisor keeps the size of the attach:
#                           the restart-after-resize test fails (the
#                           record and pdio list go back to it)
# and pdio serve that keeps its size (a local patch: conn.c not reading
# the size for new connections) fails the native grow tests.
RS_IMG=/scratch/rs.img
RS_SLACK=$((24 * 1048576))   # free space left in the old filesystem
RS_NEW=48                    # MiB of files written after growing

rs_dev() { cat "$STATE/rs.dev"; }
rs_idx() { d=$(rs_dev); echo "${d#/dev/nbd}"; }
rs_field() { sed -n "s/^$1=//p" "$PDIO_RUN/nbd$(rs_idx).rec"; }
rs_dev_size() { echo $(($(cat "/sys/block/nbd$(rs_idx)/size") * 512)); }
rs_avail() { df -B1 "$MNT" | awk 'NR == 2 { print $4 }'; }
rs_fs_size() { df -B1 "$MNT" | awk 'NR == 2 { print $2 }'; }

# rs_attach FS SIZE [ATTACH-FLAGS]: a fresh image, attached, FS made and
# mounted, files written, the rest filled up to RS_SLACK.
rs_attach() {
    fs=$1 size=$2; shift 2
    rm -f "$RS_IMG"
    truncate -s "$size" "$RS_IMG"
    echo "$RS_IMG" > "$STATE/img"
    pdio attach "$@" "$RS_IMG" > "$STATE/rs.dev"
    case $fs in
    ext4) mkfs.ext4 -F -q "$(rs_dev)"; mount -t ext4 -o noinit_itable "$(rs_dev)" "$MNT" ;;
    xfs) mkfs.xfs -f -q "$(rs_dev)"; mount -t xfs "$(rs_dev)" "$MNT" ;;
    esac
    mkdir -p "$MNT/old" "$MNT/fio"
    write_files "$MNT/old" 60 "$STATE/rs.old.sums"
    fill=$(($(rs_avail) - RS_SLACK))
    xfs_io -f -c "falloc 0 $fill" "$MNT/fill"
    sync
    detail "$(rs_dev) ($*), $fs of $(($(rs_fs_size) / 1048576)) MiB on $((size / 1048576)) MiB, filled to $(($(rs_avail) / 1048576)) MiB free"
    [ "$(rs_dev_size)" = "$size" ]
    [ "$(rs_field size)" = "$size" ]
}

# rs_grow FS NEWSIZE FIO: the image is grown while FS is mounted (and fio
# runs on it if FIO=fio), pdio resize, the filesystem grown online.
rs_grow() {
    fs=$1 size=$2 withfio=$3
    kmsg_reset
    old_fs=$(rs_fs_size)
    pid0=$(rs_field server_pid) r0=$(rs_field restarts)
    if [ "$withfio" = fio ]; then rc_fio_loop "resize-$fs"; fi
    sleep 2
    truncate -s "$size" "$RS_IMG"
    # Failures are looked at once fio has stopped.
    t0=$(cut -d' ' -f1 /proc/uptime)
    resize_rc=0 grow_rc=0
    pdio resize "$(rs_dev)" || resize_rc=$?
    t1=$(cut -d' ' -f1 /proc/uptime)
    case $fs in
    ext4) resize2fs "$(rs_dev)" || grow_rc=$? ;;
    xfs) xfs_growfs "$MNT" || grow_rc=$? ;;
    esac
    t2=$(cut -d' ' -f1 /proc/uptime)
    sleep 2
    fioerrs=0 maxlat=- runs=-
    if [ "$withfio" = fio ]; then
        touch "$STATE/rc.stop"
        wait "$(cat "$STATE/rc.fiopid")" 2>/dev/null || true
        wait_until 300 test -f "$STATE/rc.fioruns" || { echo "fio loop did not end"; return 1; }
        set -- $(rc_fio_figures "resize-$fs")
        maxlat=$1 fioerrs=$2 runs=$(cat "$STATE/rc.fioruns")
    fi
    rm -rf "$MNT/fio"
    pdio list | tee "$STATE/rs.list"
    pdio list --json > "$STATE/rs.json"
    new_fs=$(rs_fs_size)
    errs=$(nbd_io_errors)
    tap_diag "resize $fs: pdio resize took $(echo "$t0 $t1" | awk '{printf "%.2f", $2 - $1}') s, the filesystem grow $(echo "$t1 $t2" | awk '{printf "%.2f", $2 - $1}') s (TCG); fio $runs runs, $fioerrs errors, max latency $maxlat ms"
    detail "pdio resize exit $resize_rc, grow exit $grow_rc; device $(rs_dev_size) bytes, $fs $((old_fs / 1048576)) -> $((new_fs / 1048576)) MiB; server pid $pid0 -> $(rs_field server_pid); fio $runs runs, $fioerrs errors; kernel I/O errors $errs"
    [ ! -s "$STATE/rc.fiofail" ] || { cat "$STATE/rc.fiofail"; return 1; }
    [ "$resize_rc" = 0 ] && [ "$grow_rc" = 0 ]
    [ "$fioerrs" = 0 ] && [ "$errs" = 0 ]
    [ "$(rs_dev_size)" = "$size" ]
    [ "$new_fs" -gt $((old_fs + 64 * 1048576)) ]
    # pdio list shows the new size, in the text and the JSON.
    grep "^$(rs_dev) " "$STATE/rs.list" | grep -q " $size ok"
    grep -qF "\"size\": $size," "$STATE/rs.json"
    [ "$(rs_field size)" = "$size" ]
    # pdio's own server takes the new size as it runs; nbdkit is replaced.
    if [ "$(rs_field frontend)" = nbdkit ]; then
        [ "$(rs_field server_pid)" != "$pid0" ] && [ "$(rs_field restarts)" = $((r0 + 1)) ]
    else
        [ "$(rs_field server_pid)" = "$pid0" ] && [ "$(rs_field restarts)" = "$r0" ]
    fi
}

# RS_NEW MiB of new files: more than the old filesystem had free, so
# most of them are in the new space; read back after a remount, with the
# old files, and the filesystem checked.
rs_new_space() {
    fs=$1
    mkdir -p "$MNT/new"
    head -c 1048576 /dev/urandom > /tmp/rs.pat
    i=0
    while [ $i -lt "$RS_NEW" ]; do
        { echo "$i"; cat /tmp/rs.pat; } > "$MNT/new/f$i"
        i=$((i + 1))
    done
    sync
    (cd "$MNT/new" && sha256sum f*) > "$STATE/rs.new.sums"
    fs_check "$fs" "$(rs_dev)"
    mount -t "$fs" "$(rs_dev)" "$MNT"
    verify_files "$MNT/old" 60 "$STATE/rs.old.sums"
    ok_new=$( (cd "$MNT/new" && sha256sum -c "$STATE/rs.new.sums") | grep -c ': OK$')
    detail "$RS_NEW MiB written past the old free space ($((RS_SLACK / 1048576)) MiB); after a remount $ok_new of $RS_NEW new files and the 60 old ones verify; ${fs} check clean"
    [ "$ok_new" = "$RS_NEW" ]
}

# After a resize, the server is killed: the supervisor's new server and
# connections serve the new size, and the record keeps it.
rs_restart() {
    size=$(rs_dev_size) pid0=$(rs_field server_pid) r0=$(rs_field restarts)
    kill -KILL "$pid0"
    wait_until 60 rc_replaced_dev "$(rs_idx)" $((r0 + 1)) "$pid0" ||
        { echo "no new server"; return 1; }
    dd if=/dev/urandom of="$MNT/new/after-restart" bs=64k count=16 2>/dev/null
    sync
    sum=$(md5sum < "$MNT/new/after-restart")
    echo 3 > /proc/sys/vm/drop_caches
    pdio list | tee "$STATE/rs.list"
    detail "server $pid0 killed, replaced by $(rs_field server_pid); record size $(rs_field size), device $(rs_dev_size)"
    [ "$(md5sum < "$MNT/new/after-restart")" = "$sum" ]
    [ "$(rs_dev_size)" = "$size" ] && [ "$(rs_field size)" = "$size" ]
    grep "^$(rs_dev) " "$STATE/rs.list" | grep -q " $size ok"
}

# For wait_until: the record of nbdIDX counts RESTARTS and names a live
# server other than OLD.
rc_replaced_dev() {
    rec=$PDIO_RUN/nbd$1.rec
    new=$(sed -n 's/^server_pid=//p' "$rec")
    [ "$(sed -n 's/^restarts=//p' "$rec")" = "$2" ] && [ -n "$new" ] &&
        [ "$new" != 0 ] && [ "$new" != "$3" ] && [ -d "/proc/$new" ]
}

# rs_held_by PID COMM: PID is COMM, with the device open on its stdin.
rs_held_by() {
    [ "$(readlink "/proc/$1/fd/0" 2>/dev/null)" = "$(rs_dev)" ] &&
        [ "$(cat "/proc/$1/comm" 2>/dev/null)" = "$2" ]
}

# Shrinking: refused while mounted and while open (with the device's and
# the image's sizes untouched), done once closed.
rs_shrink() {
    size=$(rs_dev_size) small=$(($(rs_dev_size) - 64 * 1048576))
    rc=0
    pdio resize --size "$small" "$(rs_dev)" 2> "$STATE/rs.err" || rc=$?
    cat "$STATE/rs.err"
    [ "$rc" = 1 ] && grep -q "is in use (mounted on $MNT)" "$STATE/rs.err"
    [ "$(rs_dev_size)" = "$size" ] && [ "$(stat -c %s "$RS_IMG")" = "$size" ]
    umount "$MNT"
    sleep 600 < "$(rs_dev)" &
    holder=$!
    # Refused only once the holder has the device open and is sleep (not
    # yet the shell's child): else the shrink goes ahead on a loaded host.
    wait_until 60 rs_held_by "$holder" sleep ||
        { kill "$holder"; echo "pid $holder: not sleep with $(rs_dev) open after 60 s"; return 1; }
    rc=0
    pdio resize --size "$small" "$(rs_dev)" 2> "$STATE/rs.err" || rc=$?
    kill "$holder"; wait "$holder" 2>/dev/null || true
    cat "$STATE/rs.err"
    [ "$rc" = 1 ] && grep -q "is in use (open by sleep (pid $holder))" "$STATE/rs.err"
    [ "$(rs_dev_size)" = "$size" ] && [ "$(stat -c %s "$RS_IMG")" = "$size" ]
    pdio resize --size "$small" "$(rs_dev)" 2> "$STATE/rs.err"
    cat "$STATE/rs.err"
    grep -q "warning: shrinking $(rs_dev) from $size to $small bytes: the data past the new end is lost" "$STATE/rs.err"
    detail "refused while mounted and while open by a process; closed: $((size / 1048576)) -> $(($(rs_dev_size) / 1048576)) MiB, image $(($(stat -c %s "$RS_IMG") / 1048576)) MiB"
    [ "$(rs_dev_size)" = "$small" ] && [ "$(stat -c %s "$RS_IMG")" = "$small" ]
    [ "$(rs_field size)" = "$small" ]
}

# The device names its image; a reconfigure for another image (the test
# build's break point sends one) is refused by the kernel and changes
# nothing.
rs_backend() {
    b=$(cat "/sys/block/nbd$(rs_idx)/backend")
    ino=$(stat -c %i "$RS_IMG")
    kmsg_reset
    size=$(rs_dev_size)
    truncate -s $((size + 64 * 1048576)) "$RS_IMG"
    rc=0
    PDIO_TEST_BREAK=backend-mismatch /pdio/broken/pdio resize "$(rs_dev)" || rc=$?
    dmesg | grep "backend image doesn't match" || true
    detail "/sys/block/nbd$(rs_idx)/backend: $b; a reconfigure for another image: exit $rc, size $(rs_dev_size)"
    # pdio:MAJ:MIN:INO:NAME:PATH, the name the image's (rs).
    case $b in "pdio:"*":$ino:rs:$RS_IMG") ;; *) echo "backend is '$b'"; return 1 ;; esac
    [ "$b" = "$(rs_field backend)" ]
    [ "$rc" = 1 ] && [ "$(rs_dev_size)" = "$size" ]
    dmesg | grep -q "backend image doesn't match with $b"
    # The right identity takes it.
    pdio resize "$(rs_dev)"
    [ "$(rs_dev_size)" = $((size + 64 * 1048576)) ]
}

# The image is replaced by a copy (another file at the same path), then
# the server killed: the supervisor does not serve the copy to the
# device, and says why.
rs_replaced() {
    pid0=$(rs_field server_pid)
    mv "$RS_IMG" "$RS_IMG.orig"
    cp "$RS_IMG.orig" "$RS_IMG"
    kill -KILL "$pid0"
    wait_until 60 grep -q '^gave_up=1' "$PDIO_RUN/nbd$(rs_idx).rec" ||
        { echo "the supervisor served the copy: $(rs_field server_pid)"; pdio list; rm -f "$RS_IMG.orig"; return 1; }
    pdio list | tee "$STATE/rs.list"
    rm -f "$RS_IMG.orig"
    detail "$(rs_field reason)"
    grep "^$(rs_dev) " "$STATE/rs.list" | grep -q "failed: gave up: $RS_IMG is not the image attached any more"
}

rs_detach() {
    if mounted; then umount "$MNT"; fi
    pdio detach "$(rs_dev)"
    srv_no_state
    srv_no_server
}

# A device the kernel made on demand (--device past nbds_max, 16 here):
# resized like any other, the new space written through it and found in
# the image, and still destroyed when detached (the resize's reconfigure
# keeps the device's client flags and identity).
RS_OD_IDX=20
rs_od_gone() { [ ! -e "/sys/block/nbd$RS_OD_IDX" ]; }
rs_on_demand() {
    rm -f "$RS_IMG"
    truncate -s $((16 * 1048576)) "$RS_IMG"
    d=$(pdio attach --device "/dev/nbd$RS_OD_IDX" "$RS_IMG")
    echo "$d" > "$STATE/rs.dev"
    [ "$d" = "/dev/nbd$RS_OD_IDX" ]
    [ "$(rs_field on_demand)" = 1 ] || { echo "not made on demand"; return 1; }
    b=$(cat "/sys/block/nbd$RS_OD_IDX/backend")
    pdio resize --size 24M "$d"
    detail "$d (made on demand) resized: $(rs_dev_size) bytes, record $(rs_field size), backend $(cat "/sys/block/nbd$RS_OD_IDX/backend")"
    [ "$(rs_dev_size)" = $((24 * 1048576)) ]
    [ "$(rs_field size)" = $((24 * 1048576)) ]
    [ "$(cat "/sys/block/nbd$RS_OD_IDX/backend")" = "$b" ]
    head -c 1048576 /dev/urandom > /tmp/rs.od
    dd if=/tmp/rs.od of="$d" bs=1048576 count=1 seek=20 oflag=direct conv=notrunc 2>/dev/null
    dd if="$d" bs=1048576 count=1 skip=20 iflag=direct 2>/dev/null | cmp - /tmp/rs.od
    dd if="$RS_IMG" bs=1048576 count=1 skip=20 2>/dev/null | cmp - /tmp/rs.od
    pdio detach "$d"
    srv_no_state
    srv_no_server
    wait_until 10 rs_od_gone || { echo "$d is still there after detach"; return 1; }
}

scenario_resize() {
    step "resize: pdio attach, mkfs.ext4 on 128 MiB, files, filled to $((RS_SLACK / 1048576)) MiB free" rs_attach ext4 $((128 * 1048576))
    step "resize: image grown to 256 MiB during fio verify, pdio resize, resize2fs: 0 errors, pdio list shows it" rs_grow ext4 $((256 * 1048576)) fio
    step "resize: $RS_NEW MiB of new files in the new space; all files verify after remount, e2fsck -fn clean" rs_new_space ext4
    step "resize: the server killed after the resize: the new one serves the new size, the record keeps it" rs_restart
    step "resize: /sys/block/nbdN/backend names the image; a reconfigure for another image is refused" rs_backend
    step "resize: shrinking refused while mounted or open, done once closed" rs_shrink
    step "resize: the image replaced by a copy: the supervisor does not serve it" rs_replaced
    step "resize: pdio detach leaves nothing" rs_detach
    step "resize: xfs on 320 MiB, files, filled to $((RS_SLACK / 1048576)) MiB free" rs_attach xfs $((320 * 1048576))
    step "resize: image grown to 448 MiB during fio verify, pdio resize, xfs_growfs: 0 errors" rs_grow xfs $((448 * 1048576)) fio
    step "resize: $RS_NEW MiB of new files in the new space; all files verify after remount, xfs_repair -n clean" rs_new_space xfs
    step "resize: pdio detach leaves nothing" rs_detach
    step "resize: pdio attach --nbdkit, ext4 on 128 MiB, filled" rs_attach ext4 $((128 * 1048576)) --nbdkit --timeout 8
    step "resize: nbdkit: image grown to 256 MiB, pdio resize restarts nbdkit, resize2fs" rs_grow ext4 $((256 * 1048576)) nofio
    step "resize: nbdkit: $RS_NEW MiB of new files in the new space; all verify after remount, e2fsck -fn clean" rs_new_space ext4
    step "resize: nbdkit: pdio detach leaves nothing" rs_detach
    step "resize: a device made on demand (/dev/nbd$RS_OD_IDX) grown to 24 MiB, written in the new space; destroyed on detach" rs_on_demand
}
