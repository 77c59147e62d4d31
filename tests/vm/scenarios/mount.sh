# SPDX-License-Identifier: BSD-3-Clause
# --- mount -t pdio and fstab ---------------------------------------------------------
MT_IMG=/scratch/mt.img
mt_helper() {
    rm -f "$MT_IMG"
    truncate -s 128M "$MT_IMG"
    mkfs.ext4 -F -q "$MT_IMG"
    # mkfs wrote through the page cache; what pdio leaves there is the test.
    sync
    echo 3 > /proc/sys/vm/drop_caches
    $MOUNT -t pdio "$MT_IMG" "$MNT"
    grep " $MNT " /proc/mounts
    dev=$(grep " $MNT " /proc/mounts | cut -d' ' -f1)
    mnt_write_files 20
    pdio list | tee "$STATE/mt.list"
    grep -q '^autoclear=1$' "$PDIO_RUN/${dev#/dev/}.rec"
    # umount(8) runs umount.pdio (helper=pdio in utab), which returns once
    # the supervisor has cleaned up: no state, no connection, at once.
    helper=$(grep -c "helper=pdio" /run/mount/utab || true)
    $UMOUNT "$MNT"
    at_once=yes
    srv_no_state || at_once=no
    if [ -f "/sys/block/${dev#/dev/}/pid" ]; then echo "$dev still connected after umount"; at_once=no; fi
    srv_all_gone "$MT_IMG"
    detail "mount -t pdio mounted $dev (ext4 detected, helper=pdio in utab: $helper), 20 files written; nothing left when umount returned: $at_once; then no server, supervisor, fincore $(cat "$STATE/all_gone.pages") pages"
    [ "$helper" = 1 ]
    [ "$at_once" = yes ]
}

mt_fstab() {
    echo "$MT_IMG $MNT pdio defaults 0 0" > /etc/fstab
    $MOUNT -a
    grep " $MNT " /proc/mounts
    mnt_verify_files 20
    $UMOUNT "$MNT"
    srv_all_gone "$MT_IMG"
    echo "$MT_IMG $MNT pdio ro,fstype=ext4 0 0" > /etc/fstab
    $MOUNT -a
    grep " $MNT " /proc/mounts | grep -q ' ro[ ,]'
    dev=$(grep " $MNT " /proc/mounts | cut -d' ' -f1)
    ro=$(cat "/sys/block/${dev#/dev/}/ro")
    mnt_verify_files 20
    $UMOUNT "$MNT"
    srv_all_gone "$MT_IMG"
    rm -f /etc/fstab
    detail "fstab 'IMAGE $MNT pdio defaults 0 0' mounted by mount -a, 20 checksums match; 'ro,fstype=ext4' mounts read-only (device ro=$ro); nothing left after each umount"
    [ "$ro" = 1 ]
}

scenario_mount() {
    step "mount: mount -t pdio IMAGE /mnt, write, umount: nothing left, fincore 0" mt_helper
    step "mount: fstab entries mounted by mount -a (rw, then ro with fstype=)" mt_fstab
}
