# SPDX-License-Identifier: BSD-3-Clause
# tests/vm/scenarios/ext4.sh: scenario ext4 (and nbdkit-ext4) of the VM
# guest (tests/vm/guest-init.sh), on tests/lib/guest.sh's round trips.
# One server serves disk.img, nbd-client attaches it with the advertised
# preferred block size (pdio's direct-I/O alignment): ext4, files of random
# data verified after a remount, fstrim's holes in the image, no page of
# the image cached, a clean exit.
scenario_ext4() {
    l=$SCENARIO
    serve_attach "$l" 1 "(netlink, -b advertised preferred)"
    fs_round_trip "$l" ext4
    step "$l: fstrim after deleting the files punches holes in the image" fs_trim
    step "$l: unmount, nbd-client -d detaches" fs_umount_detach
    server_end "$l"
}
