# SPDX-License-Identifier: BSD-3-Clause
# tests/vm/scenarios/xfs.sh: scenario xfs (and nbdkit-xfs) of the VM
# guest: the ext4 scenario's round trip with xfs and two connections
# (multi-conn), xfs_repair -n for the check.
scenario_xfs() {
    l=$SCENARIO
    serve_attach "$l" 2 "with 2 connections (-C 2, multi-conn)"
    fs_round_trip "$l" xfs
    step "$l: fstrim after deleting the files punches holes in the image" fs_trim
    step "$l: unmount, nbd-client -d detaches" fs_umount_detach
    server_end "$l"
}
