# SPDX-License-Identifier: BSD-3-Clause
# tests/vm/scenarios/remote_faults.sh — network failures under fio verify
# on a remote device, on remote.sh's two network namespaces and its
# helpers (rm_*, defined there, and remote_ops.sh's ro_veth_free; every
# scenario file is sourced before any runs).  ext4 on pdio attach nbd://10.99.0.2/ (--dead-timeout
# $RF_DEAD), fio verify in a loop and a probe writer through each fault:
#
#   netem        every packet dropped both ways (tc netem loss 100% on
#                both ends of the veth pair) for 5 s: 0 fio errors, 0
#                kernel I/O errors; the first write after the loss ends,
#                and any outage the supervisor counted, printed
#   restart      the server killed and started again 20 s later on the
#                same port: pdio list says "reconnecting" meanwhile, 0
#                errors, an outage counted; the outage's length and the
#                time from listening to connected printed
#
# Each ends with the file system unmounted and e2fsck -fn clean.  The
# times are figures, not pass conditions.
#
# Shown failing against the test build (run.sh --scenario remote_faults
# --break LIST): no-reconnect (restart: the device fails its requests
# once --dead-timeout has passed); no-reconnect,kernel-timeout-nonzero
# (netem too: a request timeout of 1 s turns the loss into a dead link,
# which is never replaced).

RF_DEAD=60
RF_TC=/usr/sbin/tc

rf_setup() {
    wait_until 30 ro_veth_free
    rm_setup
    pdio attach --dead-timeout "$RF_DEAD" "$RM_URI" > "$STATE/rm.dev"
    mkfs.ext4 -F -q "$(rm_dev)"
    mount -t ext4 -o noinit_itable "$(rm_dev)" "$MNT"
    mkdir -p "$MNT/fio"
    modinfo=$(grep -c '^sch_netem ' /proc/modules || true)
    detail "$(rm_dev): ext4 on $RM_URI, dead-connection timeout $RF_DEAD s; sch_netem loaded: $modinfo; $($RF_TC -V)"
}

# e2fsck -fn of the device's file system, then mounted again.
rf_fsck() {
    umount "$MNT"
    e2fsck -fn "$(rm_dev)" > "$STATE/rf.fsck" 2>&1 || { cat "$STATE/rf.fsck"; return 1; }
    tail -n 1 "$STATE/rf.fsck"
    mount -t ext4 "$(rm_dev)" "$MNT"
}

rf_drop() {
    "$RF_TC" qdisc add dev veth-c root netem loss 100% || return 1
    rm_in "$RF_TC" qdisc add dev veth-s root netem loss 100% || return 1
    t0=$(cut -d' ' -f1 /proc/uptime)
    sleep 5
    "$RF_TC" -s qdisc show dev veth-c | grep -o 'dropped [0-9]*' > "$STATE/rf.dropped"
    "$RF_TC" qdisc del dev veth-c root || return 1
    rm_in "$RF_TC" qdisc del dev veth-s root || return 1
    t1=$(cut -d' ' -f1 /proc/uptime)
    dd if=/dev/zero of="$MNT/after-loss" bs=4096 count=1 oflag=direct status=none || return 1
    t2=$(cut -d' ' -f1 /proc/uptime)
    echo "packets lost for $(echo "$t1 $t0" | awk '{ printf "%d", ($1 - $2) * 1000 }') ms ($(cat "$STATE/rf.dropped") on veth-c); first write after the loss ended took $(echo "$t2 $t1" | awk '{ printf "%d", ($1 - $2) * 1000 }') ms" > "$STATE/rm.resume"
}

# rf_outage NAME FUNC FILE: fio verify across the outage FUNC makes
# (rm_under_fio), then e2fsck; on a failure, the outage's own account
# ($STATE/FILE).  Sets o0 and o1, the link's outages before and after.
rf_outage() {
    o0=$(rm_field outages)
    rm_under_fio "$1" "$2" || { cat "$STATE/$3" 2>/dev/null; return 1; }
    o1=$(rm_field outages)
    grep 'link of' "$PDIO_RUN/nbd$(rm_idx).supervisor.log" | tail -n 2 || true
    rf_fsck
}

rf_netem() {
    rf_outage netem rf_drop rm.resume
    detail "$(cat "$STATE/rm.figures"); $(cat "$STATE/rm.resume"); outages $o0 -> $o1 (last $(rm_field last_outage_ms) ms); e2fsck -fn clean"
}

rf_restart() {
    rf_outage restart rm_kill_restart rm.outage
    detail "$(cat "$STATE/rm.figures"); $(cat "$STATE/rm.outage"); outages $o0 -> $o1; e2fsck -fn clean"
    [ "$o1" -gt "$o0" ]
}

rf_teardown() {
    umount "$MNT"
    pdio detach "$RM_URI"
    rm_teardown
}

scenario_remote_faults() {
    step "remote_faults: two network namespaces, pdio serve on $RM_S; ext4 on pdio attach $RM_URI" rf_setup
    step "remote_faults: every packet dropped (tc netem loss 100%) for 5 s under fio verify: 0 errors, e2fsck clean" rf_netem
    step "remote_faults: the server killed and restarted ${RM_RESTART_GAP} s later under fio verify: reconnecting, 0 errors, e2fsck clean" rf_restart
    step "remote_faults: teardown: detach, namespace gone, nothing left" rf_teardown
}
