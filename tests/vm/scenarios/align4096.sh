# SPDX-License-Identifier: BSD-3-Clause
# tests/vm/scenarios/align4096.sh: scenario align4096 (and
# nbdkit-align4096) of the VM guest.  The image's direct-I/O alignment is
# 4096 while /dev/nbd0 keeps 512-byte logical blocks: the case losetup
# --direct-io=on silently runs buffered.  pdio goes through
# read-modify-write: the ext4 round trip and the fio passes (libaio).
scenario_align4096() {
    l=$SCENARIO
    step "$l: $(srv_name) align=4096 serving disk.img" serve "$l" pdio /scratch/disk.img align=4096
    step "$l: the advertised preferred block size is 4096" advertised_preferred 4096
    step "$l: nbd-client attaches with 512-byte blocks anyway (-b 512 -C 2)" attach 512 2
    fs_round_trip "$l" ext4
    step "$l: unmount" umount "$MNT"
    fio_round_trip "$l" libaio
    step "$l: nbd-client -d detaches" detach
    server_end "$l"
}
