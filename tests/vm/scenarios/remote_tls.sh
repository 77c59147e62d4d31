# SPDX-License-Identifier: BSD-3-Clause
# tests/vm/scenarios/remote_tls.sh — remote devices over TLS: pdio attach
# nbds://..., in the guest, sourced by guest-init.sh; it reuses remote.sh's
# network (two namespaces joined by a veth pair, rm_setup), its helpers
# (rm_in_bg, rm_unserve, rm_raw, rm_fs, rm_link_down, rm_under_fio...) and
# its state files (rm.dev), with pdio serve in srv asking for TLS.  The
# credentials are made on the host by run.sh (make_remote_tls_credentials:
# a CA, the server's certificate for 10.99.0.2, and a PSK file) in
# /pdio/rtls.  The scenario:
#
#   x509 kTLS    pdio attach --tls-certificates nbds://10.99.0.2/: the
#                record and pdio list say kTLS; the device's socket has
#                the TLS ULP (/proc/net/tls_stat counts one TX and one RX
#                session of the kernel's; ss -tie shows tcp-ulp-tls); no
#                relay thread in the supervisor
#   data         a raw region against its shadow; mkfs, mount, fio verify
#   link down    the veth link down 5 s under fio verify: 0 errors
#   restart      the server killed and started again 5 s later under fio
#                verify: 0 errors, the device reconnects with a new kTLS
#                session (still one of each in tls_stat)
#   PSK relay    rmmod tls; pdio attach --tls-psk: pdio list says relay,
#                the supervisor has its relay thread; raw region, mkfs,
#                mount, fio verify, e2fsck; the link down 5 s under fio
#                verify; tls.ko loaded back
#   refusals     a client CA that did not sign the server's certificate,
#                and a wrong PSK: attach fails, saying which
#   mount        ext4 made in the image: mount -t pdio -o
#                tls-certificates=DIR nbds://10.99.0.2/ /mnt (the TLS
#                settings as mount options), files written, kTLS; umount
#                leaves no device, supervisor, record or claim
#   fstab        "nbds://10.99.0.2/?tls-certificates=DIR /mnt pdio
#                _netdev,fstype=ext4 0 0" (the settings in the URI):
#                mount -a -O _netdev, the files' checksums, umount
#                leaves nothing
#   kTLS lost    kTLS takes the first connection's send side and refuses
#                its receive side (the test build's ktls-rx-refused):
#                attach connects again and the relay carries TLS; a raw
#                region against its shadow
#   name         pdio attach --name rdisk nbds://...: under udevd (as the
#                names scenario runs it) /dev/disk/by-pdio/rdisk leads to
#                the device, pdio list --json says so; gone after detach
#   late exit    detach of a device whose supervisor's main thread ends
#                a second before its process (the test build's
#                supervisor-exits-late, as a relay thread slow to exit):
#                detach waits for the process, and no claim is left
#   interop      qemu-nbd --tls-creds and nbdkit --tls=require (x509) in
#                srv: attach, raw region, mkfs, mount, fio verify, e2fsck
#   figures      64 MiB written and read through kTLS, the relay and
#                nbd-client -enable-tls, against the same pdio serve: MiB/s
#                and ratios, printed (TCG: not pass conditions)
#
# Shown failing against the test build (run.sh --scenario remote_tls
# --break LIST): no-ktls (the x509 step: the relay carries TLS instead),
# relay-flip (the relay flips a bit of what the kernel writes: the data
# checks fail), no-autoclear (mount, fstab: the device stays after
# umount), no-alias (name: no link).

RT_DIR=/pdio/rtls
RT_URI=nbds://$RM_S/
RT_PSK_URI=nbds://alice@$RM_S/
RT_PSK_IMG=/scratch/remote-psk.img

rt_serve() {
    rm_in_bg "$LOGS/remote-tls-serve.log" pdio serve --port "$RM_PORT" \
        --bind "$RM_S" "$@"
}
rt_serve_x509() {
    rt_serve --tls-certificates "$RT_DIR/server" "$1"
    wait_until 60 nbdinfo --size "nbds://$RM_S/?tls-certificates=$RT_DIR/client" > /dev/null
}
rt_serve_psk() {
    rt_serve --tls-psk "$RT_DIR/keys.psk" "$1"
    wait_until 60 nbdinfo --size "nbds://alice@$RM_S/?tls-psk-file=$RT_DIR/keys.psk" > /dev/null
}
# tls_stat NAME: the kernel's count of kTLS sessions, 0 without the module
rt_stat() { awk -v k="$1" '$1 == k { print $2 }' /proc/net/tls_stat 2>/dev/null || echo 0; }
rt_relay_threads() {
    sup=$(rm_field supervisor_pid)
    cat /proc/"$sup"/task/*/comm 2>/dev/null | grep -c '^pdio-relay' || true
}

rt_setup() {
    rm_setup
    rm_unserve
    rt_serve_x509 "$RM_IMG"
    [ -d /sys/module/tls ] || insmod /modules/tls.ko
    detail "pdio serve --tls-certificates on $RM_S:$RM_PORT in netns $RM_NS; tls module loaded; tls_stat: TX $(rt_stat TlsCurrTxSw), RX $(rt_stat TlsCurrRxSw)"
}

rt_attach_ktls() {
    tx0=$(rt_stat TlsCurrTxSw) rx0=$(rt_stat TlsCurrRxSw)
    pdio attach --dead-timeout "$RM_LONG_DEAD" --tls-certificates "$RT_DIR/client" \
        "$RT_URI" > "$STATE/rm.dev"
    pdio list | tee "$STATE/rt.list"
    js=$(pdio list --json | jq -r --arg d "$(rm_dev)" '.nbddevices[] | select(.name == $d) | "\(.link) \(.tls)"')
    ss -tie > "$STATE/rt.ss.all" 2>&1 || true
    grep -A2 "$RM_S:$RM_PORT" "$STATE/rt.ss.all" > "$STATE/rt.ss" || cat "$STATE/rt.ss.all"
    cat "$STATE/rt.ss"
    tx=$(rt_stat TlsCurrTxSw) rx=$(rt_stat TlsCurrRxSw) relays=$(rt_relay_threads)
    grep 'TLS' "$PDIO_RUN/nbd$(rm_idx).supervisor.log" || true
    detail "$(rm_dev): record tls=$(rm_field tls), --json: $js; tls_stat TX $tx0 -> $tx, RX $rx0 -> $rx; relay threads $relays; ss: $(grep -o 'tcp-ulp-tls[^ ]*' "$STATE/rt.ss" | head -n 1)"
    [ "$(rm_field tls)" = ktls ]
    [ "$js" = "connected ktls" ]
    grep -q "^$(rm_dev) .*TLS by kTLS" "$STATE/rt.list"
    [ $((tx - tx0)) = 1 ] && [ $((rx - rx0)) = 1 ]
    [ "$relays" = 0 ]
    grep -q 'tcp-ulp-tls' "$STATE/rt.ss"
}

# (From rm_under_fio's "||": explicit returns.)
rt_kill_restart() {
    rm_unserve
    wait_until 30 rm_linking reconnecting || return 1
    sleep 5
    rt_serve_x509 "$RM_IMG" || return 1
    wait_until 60 rm_linking connected || { echo "no link: $(rm_field link_why)"; return 1; }
}

rt_restart() {
    o0=$(rm_field outages)
    rm_under_fio tls-restart rt_kill_restart
    o1=$(rm_field outages)
    tx=$(rt_stat TlsCurrTxSw) rx=$(rt_stat TlsCurrRxSw)
    grep 'link of\|TLS' "$PDIO_RUN/nbd$(rm_idx).supervisor.log" | tail -n 3
    detail "$(cat "$STATE/rm.figures"); outages $o0 -> $o1, last $(rm_field last_outage_ms) ms; tls=$(rm_field tls), tls_stat TX $tx RX $rx"
    [ "$o1" -gt "$o0" ]
    [ "$(rm_field tls)" = ktls ]
    [ "$tx" = 1 ] && [ "$rx" = 1 ]
}

rt_detach() {
    umount "$MNT"
    e2fsck -fn "$(rm_dev)"
    pdio detach "$(rm_dev)"
    [ ! -e "$PDIO_RUN/nbd$(rm_idx).rec" ]
    wait_until 10 test "$(rt_stat TlsCurrRxSw)" = 0
    rm_unserve
}

rt_psk_relay() {
    rmmod tls
    [ ! -d /sys/module/tls ]
    rm -f "$RT_PSK_IMG"
    truncate -s "$RM_SIZE" "$RT_PSK_IMG"
    rt_serve_psk "$RT_PSK_IMG"
    pdio attach --dead-timeout "$RM_LONG_DEAD" --tls-psk "$RT_DIR/keys.psk" \
        --tls-username alice "nbds://$RM_S/" > "$STATE/rm.dev"
    pdio list | tee "$STATE/rt.list"
    relays=$(rt_relay_threads)
    grep 'TLS' "$PDIO_RUN/nbd$(rm_idx).supervisor.log" || true
    detail "$(rm_dev): tls=$(rm_field tls), relay threads $relays"
    [ "$(rm_field tls)" = relay ]
    grep -q "^$(rm_dev) .*TLS by a relay" "$STATE/rt.list"
    [ "$relays" = 1 ]
}

rt_psk_data() {
    RM_IMG=$RT_PSK_IMG rm_raw
    rm_fs
    detail "the relay: raw region against its shadow (device and image), ext4, fio verify"
}

rt_psk_link_down() {
    rm_link_down
}

rt_psk_detach() {
    umount "$MNT"
    e2fsck -fn "$(rm_dev)"
    sup=$(rm_field supervisor_pid)
    pdio detach "$(rm_dev)"
    wait_until 10 proc_gone "$sup"
    rm_unserve
    insmod /modules/tls.ko
    [ -d /sys/module/tls ]
}

# attach must fail, saying WORDS.
rt_refused() {
    words=$1; shift
    if pdio attach "$@" > "$STATE/rt.dev" 2> "$STATE/rt.err"; then
        pdio detach "$(cat "$STATE/rt.dev")" || true
        echo "attached: $*"
        return 1
    fi
    cat "$STATE/rt.err"
    grep -q "$words" "$STATE/rt.err"
}

rt_refusals() {
    rt_serve_x509 "$RM_IMG"
    rt_refused "certificate was refused" --tls-certificates "$RT_DIR/other" "$RT_URI"
    e1=$(cat "$STATE/rt.err")
    rm_unserve
    rt_serve_psk "$RM_IMG"
    rt_refused "refused the PSK of user \"alice\"" --tls-psk "$RT_DIR/wrong.psk" "$RT_PSK_URI"
    e2=$(cat "$STATE/rt.err")
    rm_unserve
    detail "$e1 | $e2"
}

# mount -t pdio of an nbds:// export: its ext4, made in the image
# beforehand, mounted with the TLS settings as mount options, which
# mount.pdio gives pdio attach (the filesystem would refuse them).
RT_FILES=12
RT_FSTAB=/tmp/remote-tls-fstab
rt_mount() {
    ro_clean
    rm_unserve
    mkfs.ext4 -F -q "$RM_IMG"
    rt_serve_x509 "$RM_IMG"
    $MOUNT -t pdio -o "tls-certificates=$RT_DIR/client" "$RT_URI" "$MNT"
    grep " $MNT " /proc/mounts
    dev=$(grep " $MNT " /proc/mounts | cut -d' ' -f1)
    mnt_write_files "$RT_FILES"
    pdio list | tee "$STATE/rt.list"
    tls=$(rm_field_of "$dev" tls)
    ac=$(rm_field_of "$dev" autoclear)
    $UMOUNT "$MNT"
    gone=yes
    ro_nothing_left || gone=no
    detail "mount -t pdio -o tls-certificates=$RT_DIR/client $RT_URI $MNT: $dev, TLS by $tls, autoclear=$ac, $RT_FILES files written; nothing left when umount returned: $gone"
    [ "$tls" = ktls ] && [ "$ac" = 1 ]
    grep -q "^$dev .*TLS by kTLS" "$STATE/rt.list"
    [ "$gone" = yes ]
}

# The same export from an fstab line, its TLS settings in the URI.
rt_fstab() {
    ro_clean
    ro_fstab_mount "$RT_FSTAB" \
        "$RT_URI?tls-certificates=$RT_DIR/client $MNT pdio _netdev,fstype=ext4 0 0" \
        "$RT_FILES"
    tls=$(rm_field_of "$dev" tls)
    $UMOUNT "$MNT"
    gone=yes
    ro_nothing_left || gone=no
    rm_unserve
    detail "fstab '$(cat "$RT_FSTAB")': mount -a -O _netdev mounted $dev, TLS by $tls, $RT_FILES checksums match; nothing left after umount: $gone"
    [ "$tls" = ktls ]
    [ "$gone" = yes ]
}

# kTLS leaves the first connection unusable (send side in the kernel,
# receive side refused: the test build's ktls-rx-refused): the attach
# connects again, through the relay.
rt_ktls_lost() {
    ro_clean
    rm_unserve
    rt_serve_x509 "$RM_IMG"
    rc=0
    PDIO_TEST_BREAK=ktls-rx-refused${PDIO_TEST_BREAK:+,$PDIO_TEST_BREAK} \
        /pdio/broken/pdio attach --dead-timeout "$RM_LONG_DEAD" \
        --tls-certificates "$RT_DIR/client" "$RT_URI" > "$STATE/rm.dev" \
        2> "$STATE/rt.err" || rc=$?
    cat "$STATE/rt.err"
    [ "$rc" = 0 ] || { echo "attach failed: exit $rc"; return 1; }
    pdio list | tee "$STATE/rt.list"
    relays=$(rt_relay_threads)
    tls=$(rm_field tls)
    rm_raw
    pdio detach "$(rm_dev)"
    rm_unserve
    detail "$(rm_dev): tls=$tls, relay threads $relays, $RM_RAW_MIB MiB raw region equal to its shadow; attach said: $(tr '\n' ' ' < "$STATE/rt.err")"
    [ "$tls" = relay ]
    [ "$relays" = 1 ]
    grep -q 'TLS_RX.*connecting again' "$STATE/rt.err"
}

# /dev/disk/by-pdio/NAME for a remote export's device (--name), under
# udevd as names.sh runs it (stopped again before the checks, so that
# the later steps run without it, as they were written to).
rt_name() {
    ro_clean
    rm_unserve
    rt_serve_x509 "$RM_IMG"
    nm_udev_start
    rc=0
    pdio attach --name rdisk --tls-certificates "$RT_DIR/client" "$RT_URI" \
        > "$STATE/rm.dev" || rc=$?
    udevadm settle --timeout=60
    dev=$(cat "$STATE/rm.dev")
    link=$(nm_link rdisk)
    backend=$(cat "/sys/block/${dev#/dev/}/backend" 2>/dev/null || true)
    by=$(pdio list --json | jq -r --arg d "$dev" '.nbddevices[] | select(.name == $d) | .["by-pdio"]')
    [ "$rc" != 0 ] || pdio detach "$dev" || rc=$?
    udevadm settle --timeout=60
    gone=yes
    nm_links_gone || gone=no
    nm_udev_stop
    rm_unserve
    detail "pdio attach --name rdisk $RT_URI: $dev (exit $rc), backend '$backend'; /dev/disk/by-pdio/rdisk -> '$link'; --json by-pdio: $by; no link after detach: $gone"
    [ "$rc" = 0 ]
    [ "$link" = "$dev" ]
    [ "$by" = /dev/disk/by-pdio/rdisk ]
    [ "$gone" = yes ]
}

# A supervisor whose main thread is a zombie a second before its process
# ends (the test build's supervisor-exits-late; a relay thread that takes
# its time to exit does the same): detach waits for the whole process,
# which holds the claim until then, and removes it.
rt_late_exit() {
    ro_clean
    rm_unserve
    rt_serve_x509 "$RM_IMG"
    PDIO_TEST_BREAK=supervisor-exits-late${PDIO_TEST_BREAK:+,$PDIO_TEST_BREAK} \
        /pdio/broken/pdio attach --tls-certificates "$RT_DIR/client" \
        "$RT_URI" > "$STATE/rm.dev"
    sup=$(rm_field supervisor_pid)
    t0=$(cut -d' ' -f1 /proc/uptime)
    pdio detach "$(rm_dev)"
    t1=$(cut -d' ' -f1 /proc/uptime)
    left=$(ls "$PDIO_RUN" | grep '^nbd' || true)
    sup_state=$(sed -n 's/^.*) \(.\).*/\1/p' "/proc/$sup/stat" 2>/dev/null || echo gone)
    rm_unserve
    detail "pdio detach took $(echo "$t0 $t1" | awk '{ printf "%.2f", $2 - $1 }') s; supervisor $sup after it: $sup_state; left in $PDIO_RUN: '${left}'"
    [ -z "$left" ]
}

# Other servers with TLS, through remote.sh's rm_interop (attach, raw
# region, ext4, fio verify, e2fsck, detach); the credentials in the URI.
rt_qemu_nbd() {
    rm -f "$RM_OTHER"
    truncate -s "$RM_SIZE" "$RM_OTHER"
    rm_in_bg "$LOGS/remote-tls-qemu-nbd.log" qemu-nbd -f raw --cache=none \
        --aio=native -b "$RM_S" -p 10810 -x disk -t \
        --object "tls-creds-x509,id=tls0,dir=$RT_DIR/server,endpoint=server,verify-peer=off" \
        --tls-creds tls0 "$RM_OTHER"
    wait_until 60 nbdinfo --size "nbds://$RM_S:10810/disk?tls-certificates=$RT_DIR/client" > /dev/null
    RM_IMG=$RM_OTHER rm_interop qemu-nbd "nbds://$RM_S:10810/disk?tls-certificates=$RT_DIR/client"
    grep 'TLS' "$PDIO_RUN"/nbd*.supervisor.log 2>/dev/null | tail -n 1 || true
    rm_unserve
}

rt_nbdkit() {
    rm -f "$RM_OTHER"
    truncate -s "$RM_SIZE" "$RM_OTHER"
    rm_in_bg "$LOGS/remote-tls-nbdkit.log" nbdkit -f -i "$RM_S" -p 10812 \
        --tls=require --tls-certificates="$RT_DIR/server" file "$RM_OTHER"
    wait_until 60 nbdinfo --size "nbds://$RM_S:10812/?tls-certificates=$RT_DIR/client" > /dev/null
    RM_IMG=$RM_OTHER rm_interop nbdkit "nbds://$RM_S:10812/?tls-certificates=$RT_DIR/client"
    rm_unserve
}

# rt_dd DEV: MiB/s of a 64 MiB direct write then read of DEV, or "failed"
rt_dd() {
    t0=$(cut -d' ' -f1 /proc/uptime)
    dd if=/dev/zero of="$1" bs=1M count=64 oflag=direct status=none || { echo "failed failed"; return 0; }
    t1=$(cut -d' ' -f1 /proc/uptime)
    dd if="$1" of=/dev/null bs=1M count=64 iflag=direct status=none || { echo "failed failed"; return 0; }
    t2=$(cut -d' ' -f1 /proc/uptime)
    echo "$t0 $t1 $t2" | awk '{ printf "%.1f %.1f", 64 / ($2 - $1), 64 / ($3 - $2) }'
}

# Figures, not pass conditions (TCG): one export served by pdio serve
# (x509), written then read 64 MiB through pdio attach with kTLS, with
# the relay (tls module removed), and nbd-client -enable-tls (its own
# user-space proxy): MiB/s and their ratios to kTLS.
rt_figures() {
    rt_serve_x509 "$RM_IMG"
    dev=$(pdio attach --tls-certificates "$RT_DIR/client" "$RT_URI")
    [ "$(rm_field_of "$dev" tls)" = ktls ]
    set -- $(rt_dd "$dev"); kw=$1 kr=$2
    pdio detach "$dev"
    wait_until 10 test "$(rt_stat TlsCurrRxSw)" = 0
    nc=failed; set -- failed failed
    if nbd-client "$RM_S" "$RM_PORT" /dev/nbd7 -b 512 -enable-tls \
            -cacertfile "$RT_DIR/client/ca-cert.pem" -tlshostname "$RM_S"; then
        set -- $(rt_dd /dev/nbd7)
        nbd-client -d /dev/nbd7 || true
    fi
    nw=$1 nr=$2
    # The server's end of nbd-client's connection is a kTLS socket too,
    # and holds the module until the server has closed it.
    wait_until 10 rmmod tls 2>/dev/null
    dev=$(pdio attach --tls-certificates "$RT_DIR/client" "$RT_URI")
    [ "$(rm_field_of "$dev" tls)" = relay ]
    set -- $(rt_dd "$dev"); rw=$1 rr=$2
    pdio detach "$dev"
    insmod /modules/tls.ko
    rm_unserve
    ratio() { echo "$1 $2" | awk '$1 + 0 > 0 && $2 + 0 > 0 { printf "%.2f", $1 / $2; exit } { printf "-" }'; }
    echo "MiB/s write/read: kTLS $kw/$kr, relay $rw/$rr, nbd-client -enable-tls $nw/$nr" > "$STATE/rt.figures"
    cat "$STATE/rt.figures"
    detail "$(cat "$STATE/rt.figures"); relay/kTLS $(ratio "$rw" "$kw")/$(ratio "$rr" "$kr"), nbd-client/kTLS $(ratio "$nw" "$kw")/$(ratio "$nr" "$kr") (TCG, figures only)"
}
rm_field_of() { sed -n "s/^$2=//p" "$PDIO_RUN/nbd${1#/dev/nbd}.rec"; }

scenario_remote_tls() {
    step "remote_tls: veth between two namespaces; pdio serve --tls-certificates on $RM_S" rt_setup
    step "remote_tls: pdio attach $RT_URI (x509): TLS by kTLS, the socket has the TLS ULP, no relay" rt_attach_ktls
    step "remote_tls: kTLS: a raw region equals its shadow, device and image" rm_raw
    step "remote_tls: kTLS: mkfs, mount, fio verify" rm_fs
    step "remote_tls: kTLS: the veth link down 5 s under fio verify: 0 errors" rm_link_down
    step "remote_tls: kTLS: the server restarted under fio verify: 0 errors, a new kTLS session" rt_restart
    step "remote_tls: kTLS: e2fsck clean, detach, no kTLS session left" rt_detach
    step "remote_tls: without the tls module, PSK: TLS by the supervisor's relay" rt_psk_relay
    step "remote_tls: relay: raw region, mkfs, mount, fio verify" rt_psk_data
    step "remote_tls: relay: the veth link down 5 s under fio verify: 0 errors" rt_psk_link_down
    step "remote_tls: relay: e2fsck clean, detach; tls module back" rt_psk_detach
    step "remote_tls: another CA, a wrong PSK: attach refused, saying which" rt_refusals
    step "remote_tls: mount -t pdio -o tls-certificates=DIR $RT_URI $MNT: kTLS, files written; umount leaves nothing" rt_mount
    step "remote_tls: fstab '$RT_URI?tls-certificates=DIR $MNT pdio _netdev,...': mount -a -O _netdev, checksums, umount leaves nothing" rt_fstab
    step "remote_tls: kTLS takes the first connection's send side, refuses its receive side: attach connects again through the relay; raw region" rt_ktls_lost
    step "remote_tls: pdio attach --name rdisk $RT_URI: /dev/disk/by-pdio/rdisk under udevd, gone after detach" rt_name
    step "remote_tls: detach waits for a supervisor whose main thread exits a second before it: no claim left" rt_late_exit
    step "remote_tls: qemu-nbd --tls-creds (x509): attach, raw region, mkfs, mount, fio verify, e2fsck" rt_qemu_nbd
    step "remote_tls: nbdkit --tls=require (x509): attach, raw region, mkfs, mount, fio verify, e2fsck" rt_nbdkit
    step "remote_tls: figures: 64 MiB written and read through kTLS, the relay and nbd-client -enable-tls" rt_figures
    step "remote_tls: teardown: namespace gone, nothing left in the run directory" rm_teardown
}
