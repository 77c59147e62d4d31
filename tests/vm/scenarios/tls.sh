# SPDX-License-Identifier: BSD-3-Clause
# --- nbd-client's TLS against pdio serve over TCP (scenario tls) -------------------
# nbd-client -enable-tls does the TLS in a proxy it forks, handing the kernel
# the plain side of a socketpair; so TLS is nbd-client's and GnuTLS's on both
# ends here, over the guest's own loopback (no other network).  run.sh made
# the certificates on the host with certtool, into /pdio/tls: server/ is
# what --tls-certificates reads; alice and bob are clients of the same CA,
# alice.dn alice's distinguished name.
TLS_DIR=/pdio/tls
TLS_PORT=10809
TLS_IMG=/scratch/tls.img
TLS_IMG_MIB=512
# The device's layout: ext4 in the first 256 MiB, fio's regions after it,
# then a raw region written from a shadow file and compared in the image.
TLS_FS_MIB=256
TLS_FIO_MIB=288
TLS_RAW_MIB=384
TLS_RAW_LEN_MIB=8

# tls_serve TAG [pdio serve options...]: pdio serve on 127.0.0.1:$TLS_PORT
# serving $TLS_IMG (made fresh by tls_image), under srv_spawn.
tls_serve() {
    echo "$TLS_IMG" > "$STATE/img"
    tag=tls-$1; shift
    srv_spawn "$tag" pdio serve --port "$TLS_PORT" --bind 127.0.0.1 "$@" "$TLS_IMG"
    ready() { grep -q '^uri: ' "$(srv_log)"; }
    wait_until 60 serving
    grep '^uri: ' "$(srv_log)"
}

tls_image() {
    rm -f "$TLS_IMG"
    truncate -s $((TLS_IMG_MIB * 1048576)) "$TLS_IMG"
}

tls_bring_up_lo() {
    ip link set lo up
    ip addr show lo
    ip addr show lo | grep -q 'inet 127\.0\.0\.1/'
}

tls_serve_required() {
    tls_image
    tls_serve required --tls=require --tls-certificates "$TLS_DIR/server"
}

# tls_client CERT-NAME [nbd-client options...]: nbd-client to the server
# over TLS with CERT-NAME's client certificate (netlink mode).
tls_client() {
    who=$1; shift
    nbd-client 127.0.0.1 "$TLS_PORT" "$DEV" -b 512 "$@" -enable-tls \
        -cacertfile "$TLS_DIR/ca-cert.pem" -tlshostname localhost \
        -certfile "$TLS_DIR/$who-cert.pem" -keyfile "$TLS_DIR/$who-key.pem"
}

tls_attach() {
    tls_client alice
    wait_until 10 nbd0_sized
    size=$(($(cat /sys/block/nbd0/size) * 512))
    nbd-client -c "$DEV"
    # The kernel's socket is the plain end of nbd-client's TLS proxy.
    proxies=$(comm_pids nbd-client | wc -w)
    detail "/dev/nbd0 $((size / 1048576)) MiB over TLS, $proxies nbd-client TLS proxy process(es)"
    [ "$size" = $((TLS_IMG_MIB * 1048576)) ] && [ "$proxies" -ge 1 ]
}

tls_fs_make() {
    mkfs.ext4 -F -q "$DEV" "${TLS_FS_MIB}M"
    mount -t ext4 -o noinit_itable "$DEV" "$MNT"
}

tls_fs_remount_verify() {
    umount "$MNT"
    blockdev --flushbufs "$DEV"
    mount -t ext4 "$DEV" "$MNT"
    mnt_verify_files "$TLS_FILES"
}

tls_fio() {
    FIO_JOBS=2 FIO_SIZE=8m
    export FIO_JOBS FIO_SIZE
    fio_pass "$1" "$LOGS/fio-tls-$1.txt" "verify.fio, io_uring, 2 jobs x 8m at ${TLS_FIO_MIB} MiB" \
        --ioengine=io_uring --filename="$DEV" --offset="${TLS_FIO_MIB}m" /pdio/fio/verify.fio
}

# The raw region: random data written through the device past the
# filesystem, kept in a shadow file to compare with the image afterwards.
tls_raw_write() {
    head -c $((TLS_RAW_LEN_MIB * 1048576)) /dev/urandom > "$STATE/tls.shadow"
    dd if="$STATE/tls.shadow" of="$DEV" bs=1M seek="$TLS_RAW_MIB" conv=notrunc,fsync
}

tls_umount_detach() {
    umount "$MNT"
    detach
    # The TLS proxy goes with the kernel's end of its socketpair.
    wait_until 10 tls_no_proxy
}
tls_no_proxy() { [ -z "$(comm_pids nbd-client)" ]; }

# tls_refused WHAT LOGGED CMD [ARGS...]: the nbd-client CMD runs must not
# be served (non-zero exit, no device), and the server logs LOGGED (a
# fixed string) once the client has gone; its TLS proxy exits.
tls_refused() {
    what=$1 logged=$2; shift 2
    lines=$(wc -l < "$(srv_log)")
    rc=0
    "$@" || rc=$?
    wait_until 10 grep -qF "$logged" "$(srv_log)" || :
    log_new=$(tail -n +$((lines + 1)) "$(srv_log)")
    echo "$log_new"
    if [ -f /sys/block/nbd0/pid ]; then
        nbd-client -d "$DEV"
        wait_until 10 nbd0_unsized
        echo "$what was served"
        return 1
    fi
    wait_until 10 tls_no_proxy
    detail "nbd-client exit status $rc; server: $(echo "$log_new" | grep -F "$logged" | head -n 1)"
    [ "$rc" != 0 ] && [ "$(cat /sys/block/nbd0/size)" = 0 ]
    echo "$log_new" | grep -qF "$logged"
}

# nbd-client without -enable-tls: the server must not serve it.
tls_plain_refused() {
    tls_refused "a plain nbd-client" 'refused: a client asked for the export without TLS'         nbd-client 127.0.0.1 "$TLS_PORT" "$DEV" -b 512
}

# The image after the run, with the server stopped: the raw region is the
# shadow, and the filesystem is clean.
tls_image_check() {
    dd if="$TLS_IMG" bs=1M skip="$TLS_RAW_MIB" count="$TLS_RAW_LEN_MIB" 2>/dev/null |
        cmp - "$STATE/tls.shadow"
    e2fsck -fn "$TLS_IMG"
    detail "raw region ($TLS_RAW_LEN_MIB MiB at $TLS_RAW_MIB MiB) matches its shadow, e2fsck -fn clean"
}

# The server exits 0; its log may name refused clients, but no crash.
tls_stop() {
    srv_term
    crashes=$(grep -ciE 'assert|abort|segmentation|corrupt' "$(srv_log)" || :)
    detail "exit status $rc, $crashes crash lines in its log"
    [ "$rc" = 0 ] && [ "$crashes" = 0 ]
}

tls_serve_authz() {
    tls_image
    tls_serve authz --tls-certificates "$TLS_DIR/server" --tls-verify-peer \
        --tls-authz "$(cat "$TLS_DIR/alice.dn")"
}

# bob's certificate is from the server's CA but not in --tls-authz.
tls_authz_refused() {
    tls_refused "bob's certificate" 'is not in --tls-authz' tls_client bob
}

# And alice's is: what refused bob was the list.
tls_authz_accepted() {
    tls_attach
    detach
    wait_until 10 tls_no_proxy
}

scenario_tls() {
    TLS_FILES=40
    step "tls: loopback up in the guest (127.0.0.1, no other network)" tls_bring_up_lo
    step "tls: pdio serve --tls=require --tls-certificates on 127.0.0.1:$TLS_PORT" tls_serve_required
    step "tls: nbd-client -enable-tls (CA, client certificate) attaches /dev/nbd0 (netlink)" tls_attach
    step "tls: mkfs.ext4 on /dev/nbd0 and mount" tls_fs_make
    step "tls: write files of random data, record checksums" mnt_write_files "$TLS_FILES"
    step "tls: unmount, remount, every checksum verified" tls_fs_remount_verify
    step "tls: fio random writes, verify=crc32c, zero errors" tls_fio write
    step "tls: fio read-only verify pass (--verify_only), zero errors" tls_fio verify
    step "tls: raw region written through the device from a shadow file" tls_raw_write
    step "tls: unmount, nbd-client -d detaches, the TLS proxy exits" tls_umount_detach
    step "tls: fincore on the image after the run: 0 pages resident" served_fincore_zero
    step "tls: nbd-client without -enable-tls is refused (TLS required), server says why" tls_plain_refused
    step "tls: pdio serve exits cleanly after SIGTERM" tls_stop
    step "tls: the image's raw region matches the shadow, e2fsck -fn clean" tls_image_check
    step "tls: pdio serve --tls-verify-peer --tls-authz alice's DN" tls_serve_authz
    step "tls: bob's certificate (same CA, not in --tls-authz) refused, server says why" tls_authz_refused
    step "tls: alice's certificate attaches and detaches" tls_authz_accepted
    step "tls: pdio serve exits cleanly after SIGTERM" tls_stop
}
