# SPDX-License-Identifier: BSD-3-Clause
# --- partitions ----------------------------------------------------------------------------
PT_IMG=/scratch/pt.img

pt_test() {
    rm -f "$PT_IMG"
    truncate -s 96M "$PT_IMG"
    printf 'label: gpt\nsize=24MiB\nsize=48MiB\n' | sfdisk -q "$PT_IMG"
    d=$(pdio attach "$PT_IMG")
    i=${d#/dev/nbd}
    wait_until 5 test -b "${d}p2" ||
        { ls /sys/block/nbd$i; echo "no ${d}p2"; pdio detach "$d"; return 1; }
    parts=$(ls "/sys/block/nbd$i" | grep "^nbd${i}p" | tr '\n' ' ')
    mkfs.ext4 -F -q "${d}p2"
    mount -t ext4 "${d}p2" "$MNT"
    echo hello > "$MNT/hello"
    umount "$MNT"
    pdio detach "$d"
    wait_until 5 no_partitions "$i" ||
        { echo "partitions left after detach: $(ls /sys/block/nbd$i)"; return 1; }
    srv_no_state
    detail "$d shows $parts; ${d}p2 mkfs/mount/write/umount; detach removed both"
    [ "$parts" = "nbd${i}p1 nbd${i}p2 " ]
}

no_partitions() {
    [ ! -e "/sys/block/nbd$1/nbd${1}p1" ] && [ ! -e "/sys/block/nbd$1/nbd${1}p2" ]
}

scenario_partitions() {
    step "partitions: a GPT image (sfdisk) shows nbdNp1 and nbdNp2, p2 mounts, detach removes both" pt_test
}
