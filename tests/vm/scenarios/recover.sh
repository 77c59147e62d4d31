# SPDX-License-Identifier: BSD-3-Clause
# --- the device outlives its server ------------------------------------------------
# pdio attach leaves a supervisor that restarts a dead server and hands the
# device fresh connections (NBD_CMD_RECONFIGURE); requests in flight are
# resent once the request timeout (--timeout) expires, so the filesystem
# sees a pause of about that long, not an error.  A short --timeout keeps
# the pauses (and this scenario) short.
#
# Each test was shown to fail against a deliberately broken pdio:
# run.sh --break LIST runs the test build with PDIO_TEST_BREAK=LIST
# (tests/vm/breaks.c):
#   no-restart            the supervisor records a death but starts no new
#                         server: the SIGKILL, SIGABRT and restart tests
#                         fail (fio errors, no new server, pdio restart
#                         times out)
#   no-give-up            the supervisor never gives up: "cannot come back"
#                         fails (pdio list never says failed)
#   server-exits-with-supervisor  the server runs as nbdkit -f
#                         --exit-with-parent under the supervisor, so it
#                         dies with it: "supervisor killed" fails (fio
#                         errors, then the device fails)
#   no-autoclear          mount.pdio does not arm autoclear: the mount
#                         helper test fails (device, server left after
#                         umount)
#   no-partscan           attach does not read the partition table: the
#                         partitions test fails (no nbdNp1)
#   no-take-over          pdio restart refuses a device whose supervisor
#                         is gone: "supervisor killed" fails (no new
#                         supervisor, the killed server stays dead)
#   no-udev-settle        pdio attach --autoclear arms autoclear without
#                         waiting for udev's probe: the systemd scenario's
#                         autoclear test fails (the probe detaches it)
#   no-umount-helper      mount.pdio does not mark its mounts helper=pdio,
#                         so umount(8) does not wait for the cleanup: the
#                         mount helper test and the systemd scenario's
#                         shutdown-order test fail

rc_attach() {
    rc_attach_fs --timeout "$RC_TIMEOUT" --dead-timeout "$RC_DEAD"
    sup=$(rc_field supervisor_pid)
    detail "$(rc_dev), server pid $(rc_field server_pid) ($(srv_name)), supervisor pid $sup ($(cat "/proc/$sup/comm")), timeout $RC_TIMEOUT s, dead-connection timeout $RC_DEAD s"
    [ "$(cat "/proc/$sup/comm")" = pdio-supervise ]
}

rc_fsck() {
    umount "$MNT"
    e2fsck -fn "$(rc_dev)"
    mount -t ext4 "$(rc_dev)" "$MNT"
}

# The supervisor is killed: the device keeps working (a fio run), list
# says so; pdio restart starts a new supervisor, which replaces the server
# and then restarts it when it is killed; pdio detach still cleans up
# everything.
rc_supervisor_killed() {
    sup=$(rc_field supervisor_pid)
    server=$(rc_field server_pid)
    kill -KILL "$sup"
    sleep 1
    kmsg_reset; errs0=0
    FIO_DIR=$MNT/fio FIO_SIZE=$RC_FIO_SIZE fio --output-format=json \
        --output="$LOGS/fio-rc-unsupervised-1.json" /pdio/fio/recover.fio
    set -- $(rc_fio_figures unsupervised)
    fioerrs=$2
    pdio list | tee "$STATE/rc.list"
    grep -q "ok, unsupervised" "$STATE/rc.list"
    # A new supervisor, and a server of its own.
    r0=$(rc_field restarts)
    pdio restart "$(rc_dev)"
    sup2=$(rc_field supervisor_pid) server2=$(rc_field server_pid)
    [ "$(cat "/proc/$sup2/comm")" = pdio-supervise ]
    [ "$sup2" != "$sup" ]
    [ "$server2" != "$server" ]
    [ -d "/proc/$server2" ]
    [ "$(rc_field restarts)" = $((r0 + 1)) ]
    [ "$(rc_field reason)" = "pdio restart (its supervisor was gone)" ]
    pdio list | tee "$STATE/rc.list"
    grep -q " ok" "$STATE/rc.list"
    if grep -q unsupervised "$STATE/rc.list"; then return 1; fi
    # ... which it supervises: killed, it comes back, and I/O goes on.
    kill -KILL "$server2"
    wait_until 30 rc_replaced $((r0 + 2)) "$server2" ||
        { echo "the new supervisor did not restart its server"; return 1; }
    server3=$new
    dd if=/dev/urandom of="$MNT/after-take-over" bs=64k count=16 2>/dev/null
    sync
    sum=$(md5sum < "$MNT/after-take-over")
    umount "$MNT"
    e2fsck -fn "$(rc_dev)"
    mount -t ext4 "$(rc_dev)" "$MNT"
    [ "$(md5sum < "$MNT/after-take-over")" = "$sum" ]
    umount "$MNT"
    pdio detach "$(rc_dev)"
    if srv_connected "$(rc_idx)"; then echo "still connected"; return 1; fi
    proc_gone "$server"
    proc_gone "$server3"
    proc_gone "$sup2"
    srv_no_state
    srv_no_server
    detail "supervisor $sup killed: fio $fioerrs errors; pdio restart: supervisor $sup2, server $server -> $server2, killed -> $server3 (restarts $r0 -> $(($r0 + 2))); kernel I/O errors $(($(nbd_io_errors) - errs0)); detach left no server, no supervisor, no state"
    [ "$fioerrs" = 0 ] && [ "$(nbd_io_errors)" = "$errs0" ]
}

# The image is removed, then the server killed: the supervisor cannot
# bring it back, gives up and says why; reads fail within the timeouts
# instead of hanging; pdio detach cleans up.
rc_cannot_come_back() {
    img=/scratch/gone.img
    rm -f "$img"
    truncate -s 64M "$img"
    d=$(pdio attach --timeout 4 --dead-timeout 15 "$img")
    i=${d#/dev/nbd}
    dd if="$d" of=/dev/null bs=4096 count=16 iflag=direct
    server=$(sed -n 's/^server_pid=//p' "$PDIO_RUN/nbd$i.rec")
    rm -f "$img"
    t0=$(date +%s)
    kill -KILL "$server"
    rc=0
    timeout 90 dd if="$d" of=/dev/null bs=4096 count=16 skip=100 iflag=direct || rc=$?
    t=$(($(date +%s) - t0))
    wait_until 60 grep -q '^gave_up=1' "$PDIO_RUN/nbd$i.rec" ||
        { echo "the supervisor did not give up"; pdio list; return 1; }
    pdio list | tee "$STATE/rc.list"
    why=$(grep "^$d " "$STATE/rc.list" | sed 's/.* failed: //')
    pdio detach "$d"
    if srv_connected "$i"; then echo "still connected"; return 1; fi
    srv_no_state
    srv_no_server
    detail "read after the kill: dd exit $rc after ${t}s (dead-connection timeout 15 s); pdio list: failed: $why; detached"
    [ "$rc" != 0 ] && [ "$rc" != 124 ] && [ "$t" -le 40 ]
    grep -q "failed: gave up: pdio serve could not serve" "$STATE/rc.list"
}

# One connection (the default on a one-CPU machine): the kernel requeues a
# timed-out request on a single connection too (nbd_xmit_timeout, since
# Linux 5.10) and waits for the new socket.  Raw O_DIRECT writes of one
# random 64 KiB pattern in a loop across a SIGKILL, then every one read
# back and compared.  (Broken variant: no-restart, the writes fail.)
rc_single() {
    img=/scratch/one.img
    rm -f "$img" "$STATE/one.fail" "$STATE/one.stop" "$STATE/one.n"
    truncate -s 64M "$img"
    d=$(pdio attach --connections 1 --timeout 4 --dead-timeout 30 "$img")
    i=${d#/dev/nbd}
    [ "$(ls "/sys/block/nbd$i/mq" | wc -l)" = 1 ]
    head -c 65536 /dev/urandom > /tmp/one.pat
    kmsg_reset; errs0=0
    (
        n=0
        while [ ! -f "$STATE/one.stop" ] && [ $n -lt 1000 ]; do
            dd if=/tmp/one.pat of="$d" bs=65536 count=1 seek=$n oflag=direct conv=notrunc 2>/dev/null ||
                echo "write $n failed" >> "$STATE/one.fail"
            n=$((n + 1))
        done
        echo "$n" > "$STATE/one.n"
    ) &
    loop=$!
    sleep 2
    server=$(sed -n 's/^server_pid=//p' "$PDIO_RUN/nbd$i.rec")
    case $server in ''|0) echo "no server"; touch "$STATE/one.stop"; return 1 ;; esac
    kill -KILL "$server"
    wait_until 40 restarted_once "$PDIO_RUN/nbd$i.rec" || echo "no restart"
    sleep 6
    touch "$STATE/one.stop"
    wait "$loop" || true
    n=$(cat "$STATE/one.n")
    bad=0 k=0
    while [ $k -lt "$n" ]; do
        dd if="$d" bs=65536 count=1 skip=$k iflag=direct 2>/dev/null | cmp -s - /tmp/one.pat || bad=$((bad + 1))
        k=$((k + 1))
    done
    errs=$(($(nbd_io_errors) - errs0))
    restarts=$(sed -n 's/^restarts=//p' "$PDIO_RUN/nbd$i.rec")
    pdio detach "$d"
    detail "1 connection: $n writes of 64 KiB across a SIGKILL, $(cat "$STATE/one.fail" 2>/dev/null | wc -l) failed, $bad read back wrong, restarts $restarts, kernel I/O errors $errs"
    [ ! -s "$STATE/one.fail" ] && [ "$bad" = 0 ] && [ "$errs" = 0 ] && [ "$restarts" = 1 ] && [ "$n" -gt 0 ]
}

# For wait_until: the record REC counts one restart and names a server.
restarted_once() {
    grep -q '^restarts=1$' "$1" && [ "$(sed -n 's/^server_pid=//p' "$1")" != 0 ]
}

# Run as nbdkit-recover (SERVER=nbdkit: pdio attach --nbdkit, nbdkit and
# pdio.so as the server), the same supervision: the kills and a pdio
# restart, which replaces nbdkit (only pdio's own server hands over).
scenario_recover() {
    l=$SCENARIO
    if [ "$SERVER" = nbdkit ]; then
        step "$l: pdio attach --nbdkit (timeout $RC_TIMEOUT s), mkfs.ext4, mount; a supervisor runs" rc_attach
        step "$l: nbdkit SIGKILLed 3 times during fio verify: 0 errors, 3 restarts" rc_replace kill 3
        step "$l: pdio restart during fio verify: 0 errors" rc_replace restart 1
        step "$l: unmount, e2fsck -fn clean, pdio detach leaves nothing" rc_detach
        return
    fi
    step "$l: pdio attach (timeout $RC_TIMEOUT s), mkfs.ext4, mount; a supervisor runs" rc_attach
    step "$l: server SIGKILLed 3 times during fio verify: 0 errors, 3 restarts" rc_replace kill 3
    step "$l: unmount, e2fsck -fn clean, remount" rc_fsck
    step "$l: server SIGABRTed during fio verify: 0 errors" rc_replace abort 1
    step "$l: pdio restart twice during fio verify: 0 errors" rc_replace restart 2
    step "$l: unmount, e2fsck -fn clean, remount" rc_fsck
    step "$l: supervisor killed: I/O keeps working; pdio restart starts a new supervisor, which restarts a killed server; pdio detach cleans up" rc_supervisor_killed
    step "$l: one connection: raw O_DIRECT writes across a SIGKILL, all read back" rc_single
    step "$l: a server that cannot come back: I/O errors within the timeouts, list says why, detach cleans up" rc_cannot_come_back
}
