# SPDX-License-Identifier: BSD-3-Clause
# tests/vm/scenarios/sector4k.sh: scenario sector4k (and nbdkit-sector4k)
# of the VM guest.  A 4096-byte-sector (4Kn) disk: pdio must find the
# 4096-byte direct-I/O alignment by itself (no align=) and still serve
# 512-byte nbd blocks.
sector4k_setup() {
    wait_until 30 test -b /dev/vdb
    lbs=$(cat /sys/block/vdb/queue/logical_block_size)
    mkfs.ext4 -F -q /dev/vdb
    mkdir -p /scratch4k
    mount -t ext4 /dev/vdb /scratch4k
    detail "/dev/vdb logical block $lbs, ext4 on /scratch4k"
    [ "$lbs" = 4096 ]
}

sector4k_check() {
    sync
    umount /scratch4k
    e2fsck -fn /dev/vdb
}

# pdio(1) takes the kernel's block size from the preferred size the server
# advertises: on the 4Kn disk that is 4096, never less.
sector4k_pdio_attach() {
    d=$(pdio attach /scratch4k/disk.img)
    i=${d#/dev/nbd}
    lbs=$(cat "/sys/block/nbd$i/queue/logical_block_size")
    pdio list
    row=$(pdio list | sed -n 2p)
    set -- $row
    pdio detach "$d"
    detail "pdio attach chose $lbs-byte blocks on the 4Kn disk; list: block size $5, DIO-ALIGN $6"
    [ "$lbs" = 4096 ] && [ "$5" = 4096 ] && [ "$6" = 4096 ]
}

scenario_sector4k() {
    l=$SCENARIO
    step "$l: 4096-byte-sector virtio disk formatted and mounted" sector4k_setup
    step "$l: $(srv_name) (no align=) serving disk.img on the 4Kn disk" serve "$l" pdio /scratch4k/disk.img
    step "$l: the advertised preferred block size is 4096, found by pdio" advertised_preferred 4096
    step "$l: nbd-client attaches with 512-byte blocks (-b 512 -C 2)" attach 512 2
    fio_round_trip "$l" io_uring
    step "$l: nbd-client -d detaches" detach
    server_end "$l"
    step "$l: pdio attach gives the kernel 4096-byte blocks, pdio list shows DIO-ALIGN 4096" sector4k_pdio_attach
    step "$l: the 4Kn scratch filesystem unmounts and e2fsck -fn is clean" sector4k_check
}
