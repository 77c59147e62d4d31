# SPDX-License-Identifier: BSD-3-Clause
# tests/vm/scenarios/remote_ops.sh — what an operator does with remote
# devices, on remote.sh's two network namespaces and its helpers (rm_*,
# defined there; every scenario file is sourced before any runs):
#
#   setup        the namespaces, pdio serve in srv on 10.99.0.2, an ext4
#                file system made in its image beforehand
#   mount        mount -t pdio nbd://10.99.0.2/ /mnt: the files there;
#                umount leaves no device, supervisor, record or claim
#   fstab        "nbd://10.99.0.2/ /mnt pdio _netdev,fstype=ext4 0 0":
#                mount -a -O _netdev mounts it, umount leaves nothing;
#                systemd-fstab-generator makes it a network mount
#                (remote-fs.target, which systemd orders after
#                network-online.target)
#   shared       two attaches --shared of pdio serve's export (which
#                advertises multi-conn) both connect; a third without
#                --shared is refused, naming the device it collides with;
#                --shared on qemu-nbd's writable export (no multi-conn)
#                is refused, naming the flag
#   detach --all both shared devices and a second export's device go:
#                no device, supervisor, record or claim
#   nbdkit       nbdkit's file plugin (plain): attach, raw region, mkfs,
#                mount, fio verify, e2fsck, detach
#
# Shown failing against the test build (run.sh --scenario remote_ops
# --break LIST): no-autoclear (mount, fstab: the device stays after
# umount), no-shared-check (shared: the third attach and the --shared
# one on qemu-nbd go through).

RO_FSTAB=/tmp/remote-fstab
RO_FILES=20

# For wait_until: the veth pair can be made.  A namespace deleted by the
# scenario before (netns del) is dismantled by the kernel in the
# background, and until then its pair's names are taken ("File exists").
ro_veth_free() {
    "$RM_IP" link add veth-c type veth peer name veth-s 2> /dev/null &&
        "$RM_IP" link del veth-c
}

ro_setup() {
    wait_until 30 ro_veth_free
    rm_setup
    rm_unserve
    mkfs.ext4 -F -q "$RM_IMG"
    rm_serve "$RM_IMG"
    detail "ext4 made in $RM_IMG; pdio serve pid $(cat "$STATE/rm.server") on $RM_S:$RM_PORT"
}

# Nothing of a remote attachment left: no nbd record or claim in the run
# directory, no supervisor, no connected device.
ro_nothing_left() {
    left=$(ls "$PDIO_RUN" | grep '^nbd' || true)
    sups=$(comm_pids pdio-supervise | tr '\n' ' ')
    conn=$(ls /sys/block/nbd*/pid 2>/dev/null | tr '\n' ' ' || true)
    [ -z "$left$sups$conn" ] ||
        { echo "left: files '$left', supervisors '$sups', connected '$conn'"; return 1; }
}

# What a failed step before left (a device that stayed after its umount,
# under a break): gone, so that each step is judged on its own.
ro_clean() {
    if grep -q " $MNT " /proc/mounts; then umount "$MNT" || true; fi
    if ! ro_nothing_left > /dev/null; then
        echo "cleaning up what an earlier step left:"
        ro_nothing_left || true
        pdio detach --all --force || true
    fi
}

ro_mount() {
    $MOUNT -t pdio "$RM_URI" "$MNT"
    grep " $MNT " /proc/mounts
    dev=$(grep " $MNT " /proc/mounts | cut -d' ' -f1)
    mnt_write_files "$RO_FILES"
    pdio list | tee "$STATE/ro.list"
    grep -q "^$dev .*$RM_CANON .*connected" "$STATE/ro.list"
    grep -q '^autoclear=1$' "$PDIO_RUN/${dev#/dev/}.rec"
    helper=$(grep -c "helper=pdio" /run/mount/utab || true)
    $UMOUNT "$MNT"
    at_once=yes
    ro_nothing_left || at_once=no
    detail "mount -t pdio $RM_URI $MNT: $dev (ext4 detected, helper=pdio in utab: $helper), $RO_FILES files written; nothing left when umount returned: $at_once"
    [ "$helper" = 1 ]
    [ "$at_once" = yes ]
}

# Writes fstab line $2 into file $1 and mounts what it says on $MNT;
# then the $3 files written before must read back whole.  Sets dev.
ro_fstab_mount() {
    echo "$2" > "$1"
    # Only the network file systems: what systemd's remote-fs.target
    # (and Debian's old "mountnfs" script) mount once the network is up.
    $MOUNT -a -T "$1" -O _netdev
    grep " $MNT " /proc/mounts
    dev=$(grep " $MNT " /proc/mounts | cut -d' ' -f1)
    mnt_verify_files "$3"
}

ro_fstab() {
    ro_clean
    ro_fstab_mount "$RO_FSTAB" "$RM_URI $MNT pdio _netdev,fstype=ext4 0 0" "$RO_FILES"
    $UMOUNT "$MNT"
    ro_nothing_left
    # How systemd reads the line: a network mount, which the generator
    # puts under remote-fs.target and whose unit systemd orders after
    # network-online.target (systemd.mount(5)) by its _netdev option.
    gen=/tmp/remote-generator
    rm -rf "$gen" && mkdir -p "$gen"
    SYSTEMD_IN_INITRD=0 SYSTEMD_FSTAB=$RO_FSTAB \
        /lib/systemd/system-generators/systemd-fstab-generator "$gen" "$gen" "$gen"
    unit=$gen/mnt.mount
    cat "$unit"
    remote=$(ls "$gen/remote-fs.target.requires/" 2>/dev/null | tr '\n' ' ')
    before=$(grep -c '^Before=.*remote-fs.target' "$unit" || true)
    netdev=$(grep -c '^Options=.*_netdev' "$unit" || true)
    detail "fstab '$(cat "$RO_FSTAB")': mount -a -O _netdev mounted $dev, $RO_FILES checksums match, nothing left after umount; systemd-fstab-generator: remote-fs.target requires '$remote', Before=remote-fs.target $before, Options=_netdev $netdev"
    [ "$remote" = "mnt.mount " ]
    [ "$before" -ge 1 ] && [ "$netdev" -ge 1 ]
}

ro_shared() {
    ro_clean
    pdio attach --shared "$RM_URI" > "$STATE/ro.dev1"
    pdio attach --shared "$RM_URI" > "$STATE/ro.dev2"
    d1=$(cat "$STATE/ro.dev1") d2=$(cat "$STATE/ro.dev2")
    pdio list | tee "$STATE/ro.list"
    [ "$d1" != "$d2" ]
    [ -f "/sys/block/${d1#/dev/}/pid" ] && [ -f "/sys/block/${d2#/dev/}/pid" ]
    # The same data through both (the server promised multi-conn).
    head -c 1048576 /dev/urandom > "$STATE/ro.shadow"
    dd if="$STATE/ro.shadow" of="$d1" bs=1M seek=200 oflag=direct conv=notrunc status=none
    dd if="$d2" bs=1M skip=200 count=1 iflag=direct status=none | cmp - "$STATE/ro.shadow"
    refused=yes
    if pdio attach "$RM_URI" > "$STATE/ro.third" 2> "$STATE/ro.third.err"; then
        refused=no
        echo "an attach without --shared beside two --shared ones went through: $(cat "$STATE/ro.third")"
    fi
    cat "$STATE/ro.third.err"
    # qemu-nbd, writable and for one client at a time (its default),
    # promises no multi-conn (nbdinfo says so).
    rm -f "$RM_OTHER"
    truncate -s "$RM_SIZE" "$RM_OTHER"
    serve_pid=$(cat "$STATE/rm.server")
    rm_in_bg "$LOGS/remote-ops-qemu-nbd.log" qemu-nbd -f raw \
        -b "$RM_S" -p 10810 -x disk -t "$RM_OTHER"
    mv "$STATE/rm.server" "$STATE/ro.qemu"
    echo "$serve_pid" > "$STATE/rm.server"
    wait_until 60 nbdinfo --size "nbd://$RM_S:10810/disk" > /dev/null
    mc=$(nbdinfo --json "nbd://$RM_S:10810/disk" | jq '.exports[0].can_multi_conn')
    mc_refused=yes
    if pdio attach --shared "nbd://$RM_S:10810/disk" > "$STATE/ro.q" 2> "$STATE/ro.q.err"; then
        mc_refused=no
        echo "--shared on an export without multi-conn went through: $(cat "$STATE/ro.q")"
    fi
    cat "$STATE/ro.q.err"
    detail "two --shared attaches of $RM_URI: $d1 and $d2, 1 MiB written through one read back through the other; a third without --shared refused: $refused; qemu-nbd (can_multi_conn $mc): --shared refused: $mc_refused"
    [ "$refused" = yes ]
    grep -q "already attached to /dev/nbd" "$STATE/ro.third.err"
    [ "$mc" = false ]
    [ "$mc_refused" = yes ]
    grep -q "does not advertise multi-conn" "$STATE/ro.q.err"
}

ro_detach_all() {
    # A device of the second export (qemu-nbd's) beside the two shared
    # ones, if the refusals left none.
    [ -s "$STATE/ro.q" ] || pdio attach "nbd://$RM_S:10810/disk" > "$STATE/ro.q"
    n=$(pdio list --json | jq '[.nbddevices[] | select(.remote)] | length')
    before=$(comm_pids pdio-supervise | tr '\n' ' ')
    pdio detach --all
    gone=yes
    ro_nothing_left || gone=no
    p=$(cat "$STATE/ro.qemu")
    kill -KILL "$p"
    wait_until 10 proc_gone "$p"
    detail "pdio detach --all: $n remote devices (supervisors $before); nothing left after: $gone"
    [ "$n" -ge 3 ]
    [ "$gone" = yes ]
}

ro_nbdkit() {
    rm_unserve
    rm -f "$RM_OTHER"
    truncate -s "$RM_SIZE" "$RM_OTHER"
    rm_in_bg "$LOGS/remote-nbdkit.log" nbdkit -f -i "$RM_S" -p 10812 \
        file "$RM_OTHER"
    wait_until 60 nbdinfo --size "nbd://$RM_S:10812/" > /dev/null
    RM_IMG=$RM_OTHER rm_interop nbdkit "nbd://$RM_S:10812/"
    p=$(cat "$STATE/rm.server")
    kill -TERM "$p"
    wait_until 10 proc_gone "$p"
    rm -f "$STATE/rm.server"
}

scenario_remote_ops() {
    step "remote_ops: two network namespaces, pdio serve on $RM_S of an ext4 image" ro_setup
    step "remote_ops: mount -t pdio $RM_URI $MNT, write, umount: nothing left" ro_mount
    step "remote_ops: fstab '$RM_URI $MNT pdio _netdev,...': mount -a -O _netdev, umount; systemd orders it after network-online" ro_fstab
    step "remote_ops: two attaches --shared; one without refused; --shared refused on an export without multi-conn" ro_shared
    step "remote_ops: pdio detach --all takes every remote device, supervisor and file" ro_detach_all
    step "remote_ops: nbdkit file plugin (plain): attach, raw region, mkfs, mount, fio verify, e2fsck" ro_nbdkit
    step "remote_ops: teardown: namespace gone, nothing left in the run directory" rm_teardown
}
