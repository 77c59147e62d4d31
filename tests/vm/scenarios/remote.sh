# SPDX-License-Identifier: BSD-3-Clause
# tests/vm/scenarios/remote.sh — remote devices: pdio attach nbd://..., in
# the guest, sourced by guest-init.sh (run.sh copies it to
# /pdio/scenarios/); it uses the guest library's helpers
# (tests/lib/tap.sh, tests/lib/guest.sh): step, detail, tap_diag,
# wait_until, proc_gone, rc_fio_loop, rc_probe, rc_pauses, rc_fio_figures,
# nbd_io_errors, kmsg_reset, fio_pass.
#
# A real TCP path the test can cut: two network namespaces, the root one
# (the client: pdio attach) and "srv" (the servers), joined by a veth
# pair, 10.99.0.1 <-> 10.99.0.2.  The scenario:
#
#   setup        the namespaces and the link; pdio serve in srv on
#                10.99.0.2 (--bind, --tls=off: plain beyond loopback)
#   attach       pdio attach nbd://10.99.0.2/: the block size the export
#                prefers, pdio list shows the URI and "connected", a
#                second attach of the URI is refused (also with --shared
#                against one without)
#   raw          a raw region written through the device equals its
#                shadow, on the device and in the image the server has
#   fs           mkfs, mount, fio verify
#   link down    the veth link down for 5 s, then up, under fio verify:
#                0 errors; the pause and the outages printed
#   restart      the server killed and started again 20 s later on the
#                same port, under fio verify: pdio list says
#                "reconnecting" meanwhile; 0 errors; the outage's length
#                and the reconnect time (listening -> device connected)
#                printed; e2fsck -fn clean
#   identity     the server restarted on a different-size image: the
#                reconnect is refused, a read waits and then fails once
#                the dead-connection timeout has passed, not before
#   detach       pdio detach URI during an outage leaves nothing: no
#                device, no supervisor, no record, no claim
#   interop      qemu-nbd (its default: one client at a time, so the
#                watchdog's probe connection waits in its backlog) and
#                nbd-server (plain) in srv: attach, raw region, mkfs,
#                mount, fio verify, e2fsck, detach
#
# Shown failing against the test build (run.sh --scenario remote --break
# LIST): no-reconnect (restart: fio errors, no reconnect; detach during
# the outage still clean), no-export-check (identity: the device takes
# the other export).

# iproute2's (netns, veth): the guest's busybox sh prefers its own
# applets, whose ip knows neither.
RM_IP=/usr/sbin/ip
RM_NS=srv
RM_C=10.99.0.1
RM_S=10.99.0.2
RM_PORT=10809
RM_URI=nbd://$RM_S/
RM_CANON=nbd://$RM_S:$RM_PORT/
RM_IMG=/scratch/remote.img
RM_OTHER=/scratch/remote-other.img
RM_SIZE=$((256 * 1024 * 1024))
RM_DEAD=30                  # --dead-timeout of the identity check
RM_LONG_DEAD=120            # of the main device: outages well within it
RM_RESTART_GAP=20           # the server is down this long
RM_RAW_OFF_MIB=64
RM_RAW_MIB=8

rm_dev() { cat "$STATE/rm.dev"; }
rm_idx() { d=$(rm_dev); echo "${d#/dev/nbd}"; }
rm_field() { sed -n "s/^$1=//p" "$PDIO_RUN/nbd$(rm_idx).rec"; }
# Into srv's network namespace only: ip netns exec would also give the
# command a mount namespace of its own, holding a copy of every mount of
# the moment -- the device's file system among them, which the server
# would then keep busy after its umount here.
rm_in() { nsenter --net="/run/netns/$RM_NS" "$@"; }
# rm_in_bg LOG CMD...: CMD in srv in the background, its pid in rm.server
# (exec: the pid is the server's own, not a subshell's, so that killing it
# kills the server).
rm_in_bg() {
    _log=$1; shift
    ( exec nsenter --net="/run/netns/$RM_NS" "$@" >> "$_log" 2>&1 ) &
    echo $! > "$STATE/rm.server"
}

# rm_serve IMAGE [PORT]: pdio serve in srv, its pid in rm.server.
rm_serve() {
    rm_in_bg "$LOGS/remote-serve.log" pdio serve --port "${2:-$RM_PORT}" \
        --bind "$RM_S" --tls off "$1"
    wait_until 60 nbdinfo --size "nbd://$RM_S:${2:-$RM_PORT}/" > /dev/null
}
rm_unserve() {
    p=$(cat "$STATE/rm.server" 2>/dev/null || true)
    [ -z "$p" ] || kill -KILL "$p" 2>/dev/null || true
    [ -z "$p" ] || wait_until 10 proc_gone "$p"
    # nbd-server forks a process per client.
    for p in $(comm_pids nbd-server); do kill -KILL "$p"; done
    rm -f "$STATE/rm.server"
}

# rm_net: the two namespaces and the veth pair (bench/kernel-guest.sh's
# remote rows use it too).
rm_net() {
    "$RM_IP" link set lo up
    "$RM_IP" netns add "$RM_NS"
    "$RM_IP" link add veth-c type veth peer name veth-s
    "$RM_IP" link set veth-s netns "$RM_NS"
    "$RM_IP" addr add "$RM_C/24" dev veth-c
    "$RM_IP" link set veth-c up
    rm_in "$RM_IP" link set lo up
    rm_in "$RM_IP" addr add "$RM_S/24" dev veth-s
    rm_in "$RM_IP" link set veth-s up
}

rm_setup() {
    rm_net
    rm -f "$RM_IMG"
    truncate -s "$RM_SIZE" "$RM_IMG"
    rm_serve "$RM_IMG"
    [ "$(cat "/proc/$(cat "$STATE/rm.server")/comm")" = pdio ]
    detail "veth-c $RM_C (root namespace) <-> veth-s $RM_S (netns $RM_NS); pdio serve pid $(cat "$STATE/rm.server") on $RM_S:$RM_PORT; nbdinfo: $(nbdinfo --size "$RM_URI") bytes"
}

rm_attach() {
    pdio attach --dead-timeout "$RM_LONG_DEAD" "$RM_URI" > "$STATE/rm.dev"
    sup=$(rm_field supervisor_pid)
    [ "$(cat "/proc/$sup/comm")" = pdio-supervise ]
    lbs=$(cat "/sys/block/nbd$(rm_idx)/queue/logical_block_size")
    pref=$(nbdinfo --json "$RM_URI" | jq '.exports[0]["block_size_preferred"] // 512')
    pdio list | tee "$STATE/rm.list"
    pdio list --json > "$STATE/rm.json"
    js=$(jq -r --arg d "$(rm_dev)" '.nbddevices[] | select(.name == $d) | "\(.["back-file"]) \(.remote) \(.link) \(.outages)"' "$STATE/rm.json")
    detail "$(rm_dev): block size $lbs (the export prefers $pref), supervisor $sup; pdio list --json: $js"
    [ "$lbs" = "$pref" ] || [ "$pref" -gt 4096 ]
    grep -q "^$(rm_dev) .*$RM_CANON .*connected" "$STATE/rm.list"
    [ "$js" = "$RM_CANON true connected 0" ]
    # One attachment of an export per host, whatever its spelling.
    if pdio attach "nbd://$RM_S:$RM_PORT" > "$STATE/rm.second" 2> "$STATE/rm.second.err"; then
        echo "a second attach was let through: $(cat "$STATE/rm.second")"
        pdio detach "$(cat "$STATE/rm.second")" || true
        return 1
    fi
    cat "$STATE/rm.second.err"
    grep -q "already attached to $(rm_dev)" "$STATE/rm.second.err"
    if pdio attach --shared "$RM_URI" > "$STATE/rm.second" 2> "$STATE/rm.second.err"; then
        echo "--shared beside an attachment without it was let through"
        pdio detach "$(cat "$STATE/rm.second")" || true
        return 1
    fi
    cat "$STATE/rm.second.err"
}

rm_raw() {
    head -c $((RM_RAW_MIB * 1024 * 1024)) /dev/urandom > "$STATE/rm.shadow"
    dd if="$STATE/rm.shadow" of="$(rm_dev)" bs=1M seek="$RM_RAW_OFF_MIB" oflag=direct conv=notrunc status=none
    dd if="$(rm_dev)" bs=1M skip="$RM_RAW_OFF_MIB" count="$RM_RAW_MIB" iflag=direct status=none | cmp - "$STATE/rm.shadow"
    dd if="$RM_IMG" bs=1M skip="$RM_RAW_OFF_MIB" count="$RM_RAW_MIB" iflag=direct status=none | cmp - "$STATE/rm.shadow"
    detail "$RM_RAW_MIB MiB at $RM_RAW_OFF_MIB MiB: the device and the server's image equal the shadow"
}

rm_fs() {
    mkfs.ext4 -F -q "$(rm_dev)"
    mount -t ext4 -o noinit_itable "$(rm_dev)" "$MNT"
    mkdir -p "$MNT/fio"
    # recover.fio's 512-byte direct I/O, or its 4 KiB form on a device of
    # 4096-byte blocks (an export that prefers them: qemu-nbd).
    job=/pdio/fio/recover.fio
    if [ "$(cat "/sys/block/nbd$(rm_idx)/queue/logical_block_size")" = 4096 ]; then
        sed 's/^bssplit=.*/bssplit=4k\/40:8k\/20:64k\/20:256k\/20/; s/^blockalign=.*/blockalign=4k/' \
            "$job" > "$STATE/recover-4k.fio"
        job=$STATE/recover-4k.fio
    fi
    FIO_DIR=$MNT/fio FIO_SIZE=8m fio --output="$LOGS/fio-remote-$(rm_idx).txt" "$job"
    cat "$LOGS/fio-remote-$(rm_idx).txt" | grep -E 'err=|WRITE:|READ:' || true
    [ "$(fio_errors "$LOGS/fio-remote-$(rm_idx).txt")" = 0 ]
}

# rm_under_fio TAG CMD...: fio verify in a loop and the probe while CMD
# runs; then 0 fio errors, 0 kernel I/O errors.
rm_under_fio() {
    tag=$1; shift
    kmsg_reset
    rm -f "$STATE/rc.kills"
    rc_fio_loop "$tag"
    rc_probe
    sleep 3
    cut -d' ' -f1 /proc/uptime >> "$STATE/rc.kills"
    # (Not $st: proc_gone, which the body may run, sets that.)
    rm_st=0
    "$@" || rm_st=$?
    sleep 3
    touch "$STATE/rc.stop"
    # fio ends at the latest once the device fails its requests (past
    # --dead-timeout, those stuck in flight too).
    # Requests in flight when a link died and was never replaced wait for
    # ever (request timeout 0): fio then never ends, and neither would a
    # wait for it.
    wait_until $((RM_LONG_DEAD + 120)) test -f "$STATE/rc.fioruns" ||
        { echo "$tag: fio still running $((RM_LONG_DEAD + 120)) s after the fault"; return 1; }
    wait "$(cat "$STATE/rc.fiopid")" 2>/dev/null || true
    wait "$(cat "$STATE/rc.probepid")" 2>/dev/null || true
    set -- $(rc_fio_figures "$tag")
    errs=$(nbd_io_errors)
    fails=$(cat "$STATE/rc.fiofail" 2>/dev/null | tr '\n' ' ')
    echo "$tag: $(cat "$STATE/rc.fioruns") fio runs, largest completion latency $1 ms, fio errors $2, kernel I/O errors $errs, pause seen by the probe $(rc_pauses) ms${fails:+; failures: $fails}" > "$STATE/rm.figures"
    cat "$STATE/rm.figures"
    [ "$rm_st" = 0 ] || { echo "$tag: what was done under fio failed (exit $rm_st)"; return 1; }
    [ "$2" = 0 ] && [ "$errs" = 0 ] && [ -z "$fails" ]
}

rm_cut_link() {
    "$RM_IP" link set veth-c down || return 1
    sleep 5
    "$RM_IP" link set veth-c up || return 1
    t=$(cut -d' ' -f1 /proc/uptime)
    # I/O resumes: a direct write through the device's filesystem.
    dd if=/dev/zero of="$MNT/after-link" bs=4096 count=1 oflag=direct status=none || return 1
    echo "first write after the link came back took $(echo "$(cut -d' ' -f1 /proc/uptime) $t" | awk '{ printf "%d", ($1 - $2) * 1000 }') ms" > "$STATE/rm.resume"
}

rm_link_down() {
    o0=$(rm_field outages)
    rm_under_fio link-down rm_cut_link
    detail "$(cat "$STATE/rm.figures"); $(cat "$STATE/rm.resume"); outages $o0 -> $(rm_field outages) (a TCP connection that outlives a 5 s cut needs no reconnect)"
}

rm_linking() { [ "$(rm_field link)" = "$1" ]; }
rm_unlinked() { ! rm_linking connected; }

# (Run from rm_under_fio's "||": set -e does not hold here, hence the
# explicit returns.)
rm_kill_restart() {
    rm_unserve
    t0=$(cut -d' ' -f1 /proc/uptime)
    wait_until 30 rm_linking reconnecting || return 1
    pdio list | tee "$STATE/rm.list.outage"
    grep -q "^$(rm_dev) .*reconnecting since" "$STATE/rm.list.outage" || return 1
    sleep "$RM_RESTART_GAP"
    rm_serve "$RM_IMG" || return 1
    t1=$(cut -d' ' -f1 /proc/uptime)
    wait_until 60 rm_linking connected || { echo "no link 60 s after the server listens again: $(rm_field link): $(rm_field link_why)"; return 1; }
    t2=$(cut -d' ' -f1 /proc/uptime)
    echo "server down $(echo "$t1 $t0" | awk '{ printf "%d", ($1 - $2) * 1000 }') ms; listening -> device connected $(echo "$t2 $t1" | awk '{ printf "%d", ($1 - $2) * 1000 }') ms; the supervisor's outage $(rm_field last_outage_ms) ms" > "$STATE/rm.outage"
}

rm_restart() {
    o0=$(rm_field outages)
    rm_under_fio restart rm_kill_restart
    o1=$(rm_field outages)
    grep 'link of' "$PDIO_RUN/nbd$(rm_idx).supervisor.log" | tail -n 2
    detail "$(cat "$STATE/rm.figures"); $(cat "$STATE/rm.outage"); outages $o0 -> $o1"
    [ "$o1" -gt "$o0" ]
}

rm_fsck() {
    umount "$MNT"
    e2fsck -fn "$(rm_dev)"
    pdio detach "$RM_URI"
    [ ! -e "$PDIO_RUN/nbd$(rm_idx).rec" ]
}

# The export behind the URI replaced by another (a different size): the
# device must not take it, and fails only once its dead timeout passed.
rm_identity() {
    pdio attach --dead-timeout "$RM_DEAD" "$RM_URI" > "$STATE/rm.dev"
    rm_unserve
    rm -f "$RM_OTHER"
    truncate -s $((RM_SIZE / 2)) "$RM_OTHER"
    t0=$(cut -d' ' -f1 /proc/uptime)
    rm_serve "$RM_OTHER"
    # A read that waits for the link: it must fail, and not before.
    rm -f "$STATE/rm.read"
    ( dd if="$(rm_dev)" of=/dev/null bs=4096 count=1 skip=1000 iflag=direct status=none &&
          echo ok > "$STATE/rm.read" || echo failed > "$STATE/rm.read" ) &
    wait_until $((RM_DEAD + 60)) test -f "$STATE/rm.read"
    t1=$(cut -d' ' -f1 /proc/uptime)
    waited=$(echo "$t1 $t0" | awk '{ printf "%d", $1 - $2 }')
    pdio list | tee "$STATE/rm.list.identity"
    grep 'another export' "$PDIO_RUN/nbd$(rm_idx).supervisor.log" | head -n 2 || true
    detail "read $(cat "$STATE/rm.read") after ${waited} s (dead-connection timeout $RM_DEAD s); link $(rm_field link): $(rm_field link_why)"
    [ "$(cat "$STATE/rm.read")" = failed ]
    [ "$waited" -ge $((RM_DEAD - 2)) ]
    grep -q 'another export' "$STATE/rm.list.identity"
}

# Detach while the link is down: nothing stays.
rm_detach_outage() {
    rm_unserve
    wait_until 30 rm_unlinked
    idx=$(rm_idx) sup=$(rm_field supervisor_pid)
    pdio detach "$RM_URI"
    wait_until 10 proc_gone "$sup"
    left=$(ls "$PDIO_RUN" | grep "^nbd$idx\.\|^nbd-" || true)
    detail "detached /dev/nbd$idx during the outage: supervisor $sup gone; left in $PDIO_RUN: ${left:-nothing}; connected: $(cat "/sys/block/nbd$idx/pid" 2>/dev/null || echo no)"
    [ -z "$left" ]
    [ ! -e "/sys/block/nbd$idx/pid" ]
}

# rm_interop NAME URI: attach, raw region, mkfs, mount, fio verify,
# e2fsck, detach.
rm_interop() {
    name=$1 uri=$2
    pdio attach "$uri" > "$STATE/rm.dev"
    lbs=$(cat "/sys/block/nbd$(rm_idx)/queue/logical_block_size")
    rm_raw
    rm_fs
    umount "$MNT"
    e2fsck -fn "$(rm_dev)"
    pdio list | grep "^$(rm_dev) "
    pdio detach "$(rm_dev)"
    detail "$name: $uri on $(cat "$STATE/rm.dev"), block size $lbs; raw region, ext4, fio verify, e2fsck clean"
}

rm_qemu_nbd() {
    rm -f "$RM_OTHER"
    truncate -s "$RM_SIZE" "$RM_OTHER"
    rm_in_bg "$LOGS/remote-qemu-nbd.log" qemu-nbd -f raw --cache=none \
        --aio=native -b "$RM_S" -p 10810 -x disk -t "$RM_OTHER"
    wait_until 60 nbdinfo --size "nbd://$RM_S:10810/disk" > /dev/null
    RM_IMG=$RM_OTHER rm_interop qemu-nbd "nbd://$RM_S:10810/disk"
    rm_unserve
}

rm_nbd_server() {
    rm -f "$RM_OTHER"
    truncate -s "$RM_SIZE" "$RM_OTHER"
    printf '[generic]\nlistenaddr = %s\nport = 10811\n[disk]\nexportname = %s\n' \
        "$RM_S" "$RM_OTHER" > "$STATE/nbd-server.conf"
    # (Not -d: nbd-server then serves one client and exits.)
    rm_in_bg "$LOGS/remote-nbd-server.log" nbd-server -C "$STATE/nbd-server.conf"
    wait_until 60 nbdinfo --size "nbd://$RM_S:10811/disk" > /dev/null
    RM_IMG=$RM_OTHER rm_interop nbd-server "nbd://$RM_S:10811/disk"
    rm_unserve
}

rm_no_veth() { ! "$RM_IP" link show veth-c > /dev/null 2>&1; }
rm_teardown() {
    rm_unserve
    "$RM_IP" netns del "$RM_NS"
    # (Not "! ip link show" alone: set -e ignores a negated command.)  The
    # kernel dismantles the namespace, and the pair with it, in the
    # background, once no process is left in it.
    wait_until 30 rm_no_veth
    left=$(ls "$PDIO_RUN" | grep '^nbd' || true)
    [ -z "$left" ] || { echo "left in $PDIO_RUN: $left"; return 1; }
}

scenario_remote() {
    step "remote: two network namespaces joined by a veth pair; pdio serve on $RM_S:$RM_PORT in one" rm_setup
    step "remote: pdio attach $RM_URI: the export's preferred block size, pdio list shows the URI and connected, a second attach refused" rm_attach
    step "remote: a raw region through the device equals its shadow, there and in the server's image" rm_raw
    step "remote: mkfs, mount, fio verify" rm_fs
    step "remote: the veth link down 5 s under fio verify: 0 errors" rm_link_down
    step "remote: the server killed and restarted ${RM_RESTART_GAP} s later under fio verify: pdio list says reconnecting, 0 errors, the device reconnects" rm_restart
    step "remote: e2fsck -fn clean, pdio detach URI" rm_fsck
    step "remote: the export swapped for a different-size image: refused; a read fails after --dead-timeout $RM_DEAD s, not before" rm_identity
    step "remote: pdio detach during an outage leaves no device, process or state" rm_detach_outage
    step "remote: qemu-nbd (plain): attach, raw region, mkfs, mount, fio verify, e2fsck" rm_qemu_nbd
    step "remote: nbd-server (plain): attach, raw region, mkfs, mount, fio verify, e2fsck" rm_nbd_server
    step "remote: teardown: namespace gone, nothing left in the run directory" rm_teardown
}
