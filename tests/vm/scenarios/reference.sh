# SPDX-License-Identifier: BSD-3-Clause
# tests/vm/scenarios/reference.sh: scenario reference of the VM guest: the
# ext4 and fio workloads through nbdkit's own file plugin, for the
# page-cache comparison (how much of its image it leaves cached is a
# figure, not a pass condition).
scenario_reference() {
    step "reference: nbdkit file plugin serving disk-ref.img" serve reference file /scratch/disk-ref.img
    step "reference: nbd-client attaches /dev/nbd0 (-b 512)" attach 512 1
    fs_round_trip reference ext4
    step "reference: unmount" umount "$MNT"
    fio_round_trip reference io_uring
    step "reference: nbd-client -d detaches" detach
    step "reference: fincore on the file plugin's image" fincore_reference
    step "reference: nbdkit exits cleanly after SIGTERM" serve_stop
}
