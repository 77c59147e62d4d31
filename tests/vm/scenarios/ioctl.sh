# SPDX-License-Identifier: BSD-3-Clause
# tests/vm/scenarios/ioctl.sh: scenario ioctl (and nbdkit-ioctl) of the VM
# guest: the ext4 round trip with nbd-client's ioctl interface, as older
# setups and some containers attach: nbd-client stays behind as the
# process that runs NBD_DO_IT for the device.
attach_ioctl() {
    attach "$(cat "$STATE/dioblock")" 1 -nonetlink
    pid=$(cat /sys/block/nbd0/pid)
    detail "ioctl mode: the device is served by nbd-client pid $pid ($(cat "/proc/$pid/comm"))"
    [ "$(cat "/proc/$pid/comm")" = nbd-client ]
}

scenario_ioctl() {
    l=$SCENARIO
    step "$l: $(srv_name) serving disk.img on a unix socket" serve "$l" pdio /scratch/disk.img
    step "$l: nbd-client -nonetlink attaches /dev/nbd0 (-b advertised preferred)" attach_ioctl
    fs_round_trip "$l" ext4
    step "$l: unmount, nbd-client -d detaches" fs_umount_detach
    server_end "$l"
}
