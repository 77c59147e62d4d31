# SPDX-License-Identifier: BSD-3-Clause
# --- pdio serve with the kernel's TLS (scenario ktls) ---------------------------
# The guest has the tls module (Debian's CONFIG_TLS=m; run.sh loads it at
# boot, the guest having no modprobe).  pdio serve hands each session to
# the kernel once the NBD handshake is over; its worker then sends and
# receives plaintext.  The client is nbd-client -enable-tls (TLS in its own
# user-space proxy), and server/tls_keyupdate for a TLS 1.3 KeyUpdate.
# Uses tls.sh's helpers and run.sh's certificates in /pdio/tls.
KTLS_SHADOW_MIB=8
KTLS_AT_MIB=64

# test_ktls on this kernel: every cipher and version handed over and
# checked against a GnuTLS client; a KeyUpdate read back as a record.
ktls_unit() {
    PDIO_TEST_KTLS=yes /pdio/bin/test_ktls > "$LOGS/test_ktls.txt" 2>&1
    rc=$?
    cat "$LOGS/test_ktls.txt"
    detail "$(grep -c ': 0: kTLS' "$LOGS/test_ktls.txt") of 6 cipher/version pairs in the kernel, exit $rc"
    [ "$rc" = 0 ]
}

ktls_serve() {
    tls_image
    PDIO_SERVER_DEBUG=1
    export PDIO_SERVER_DEBUG
    tls_serve ktls --tls=require --tls-certificates "$TLS_DIR/server"
    unset PDIO_SERVER_DEBUG
}

# The server's log names the TLS of each connection.
ktls_in_kernel() {
    wait_until 10 grep -q 'connection [0-9]*: TLS in' "$(srv_log)" || :
    line=$(grep 'connection [0-9]*: TLS in' "$(srv_log)" | tail -n 1)
    echo "$line"
    detail "${line#*: TLS}"
    echo "$line" | grep -q 'TLS in the kernel: kTLS '
}

tls_stat() { awk -v k="$1" '$1 == k { print $2 }' /proc/net/tls_stat; }

# Exactly the server's socket has TLS in the kernel, both ways: the
# client's TLS is nbd-client's proxy, in user space.
ktls_stat() {
    cat /proc/net/tls_stat
    detail "TlsCurrTxSw $(tls_stat TlsCurrTxSw), TlsCurrRxSw $(tls_stat TlsCurrRxSw), TlsTxSw $(tls_stat TlsTxSw), TlsRxSw $(tls_stat TlsRxSw)"
    [ "$(tls_stat TlsCurrTxSw)" = 1 ] && [ "$(tls_stat TlsCurrRxSw)" = 1 ]
}

# Random data through the device, read back past the page cache.
ktls_data() {
    head -c $((KTLS_SHADOW_MIB * 1048576)) /dev/urandom > "$STATE/ktls.shadow"
    dd if="$STATE/ktls.shadow" of="$DEV" bs=1M seek="$KTLS_AT_MIB" oflag=direct conv=notrunc,fsync 2>&1
    dd if="$DEV" bs=1M skip="$KTLS_AT_MIB" count="$KTLS_SHADOW_MIB" iflag=direct 2>/dev/null |
        cmp - "$STATE/ktls.shadow"
    detail "$KTLS_SHADOW_MIB MiB written at $KTLS_AT_MIB MiB and read back with O_DIRECT: equal to the shadow"
}

ktls_detach() {
    umount "$MNT" 2>/dev/null || :
    detach
    wait_until 10 tls_no_proxy
}

# TLS 1.3 after the switch: the server sends no session ticket
# (GNUTLS_NO_TICKETS: nothing of TLS's own is left to send once the kernel
# holds the keys); the client's KeyUpdate cannot be followed (the
# kernel's keys are set once), so the server ends the connection and says
# why.
ktls_keyupdate() {
    lines=$(wc -l < "$(srv_log)")
    rc=0
    /pdio/bin/tls_keyupdate 127.0.0.1 "$TLS_PORT" "$TLS_DIR/ca-cert.pem" \
        "$TLS_DIR/alice-cert.pem" "$TLS_DIR/alice-key.pem" > "$LOGS/keyupdate.txt" 2>&1 || rc=$?
    cat "$LOGS/keyupdate.txt"
    wait_until 10 grep -q 'KeyUpdate' "$(srv_log)" || :
    log_new=$(tail -n +$((lines + 1)) "$(srv_log)")
    echo "$log_new"
    detail "tls_keyupdate exit $rc; server: $(echo "$log_new" | grep -F 'KeyUpdate' | head -n 1 | sed 's/.*connection/connection/')"
    [ "$rc" = 3 ] && grep -q 'session tickets received: 0' "$LOGS/keyupdate.txt" &&
        echo "$log_new" | grep -q 'TLS in the kernel' &&
        echo "$log_new" | grep -q 'the client sent a TLS KeyUpdate'
}

ktls_image_check() {
    dd if="$TLS_IMG" bs=1M skip="$KTLS_AT_MIB" count="$KTLS_SHADOW_MIB" 2>/dev/null |
        cmp - "$STATE/ktls.shadow"
    detail "the image holds the shadow at $KTLS_AT_MIB MiB"
}

# ktls_measure_one LABEL [env...]: pdio serve (run as env ... pdio),
# nbd-client attaches, fio on /dev/nbd0 for 5 s each: 4 KiB random reads
# at QD32 and 1 MiB sequential reads at QD8; "LABEL IOPS MiB/s" lines.
ktls_measure_one() {
    label=$1; shift
    tls_image
    srv_spawn "measure-$label" env "$@" pdio serve --port "$TLS_PORT" --bind 127.0.0.1 \
        --tls=require --tls-certificates "$TLS_DIR/server" "$TLS_IMG"
    ready() { grep -q '^uri: ' "$(srv_log)"; }
    wait_until 60 serving
    tls_client alice
    wait_until 10 nbd0_sized
    for j in "rr4k --rw=randread --bs=4k --iodepth=32" "sr1m --rw=read --bs=1M --iodepth=8"; do
        set -- $j
        name=$1; shift
        fio --name="$name" --filename="$DEV" --ioengine=io_uring --direct=1 \
            --time_based --runtime=5 --size=256m --output-format=json "$@" > "$STATE/fio.json"
        echo "$label $name $(jq -r '.jobs[0].read | "\(.iops|floor) \(.bw*10/1024|floor/10)"' "$STATE/fio.json")"
    done
    detach
    wait_until 10 tls_no_proxy
    # Its log is kept in $LOGS, not among the figures.
    srv_term > /dev/null
}

# A figure, not a pass condition (TCG): the same client and server with
# TLS in the kernel and in GnuTLS (the test build's ktls-off), twice,
# interleaved.
ktls_measure() {
    : > "$STATE/measure.txt"
    for r in 1 2; do
        ktls_measure_one kernel >> "$STATE/measure.txt"
        if grep -q 'TLS stays in user space' "$LOGS/server-measure-kernel.log"; then
            echo "the kTLS run was in user space"
            return 1
        fi
        ktls_measure_one user PDIO_TEST_BREAK=ktls-off PATH=/pdio/broken:$PATH >> "$STATE/measure.txt"
        # Each ran the TLS it is labelled with.
        grep -q 'TLS stays in user space' "$LOGS/server-measure-user.log"
    done
    cat "$STATE/measure.txt"
    fig() { awk -v l="$1" -v j="$2" -v f="$3" '$1 == l && $2 == j { printf "%s%s", s, $f; s = "/" }' "$STATE/measure.txt"; }
    detail "TCG, nbd-client's TLS proxy as the client, two rounds: rr4k QD32 IOPS kTLS $(fig kernel rr4k 3), GnuTLS $(fig user rr4k 3); sr1m QD8 MiB/s kTLS $(fig kernel sr1m 4), GnuTLS $(fig user sr1m 4)"
    [ "$(grep -cE '^(kernel|user) (rr4k|sr1m) [0-9]+ [0-9.]+$' "$STATE/measure.txt")" = 8 ]
}

scenario_ktls() {
    step "ktls: loopback up in the guest (127.0.0.1, no other network)" tls_bring_up_lo
    step "ktls: test_ktls: 3 ciphers x TLS 1.2/1.3 in the kernel against GnuTLS, a KeyUpdate read back as a record" ktls_unit
    step "ktls: pdio serve --tls=require --tls-certificates on 127.0.0.1:$TLS_PORT" ktls_serve
    step "ktls: nbd-client -enable-tls attaches /dev/nbd0" tls_attach
    step "ktls: the server's log: the connection's TLS is in the kernel" ktls_in_kernel
    step "ktls: /proc/net/tls_stat: one socket with kTLS each way (TlsCurrTxSw, TlsCurrRxSw)" ktls_stat
    step "ktls: random data written through the device and read back: equal to its shadow" ktls_data
    step "ktls: nbd-client -d detaches" ktls_detach
    step "ktls: TLS 1.3: no session ticket sent; a client's KeyUpdate ends the connection, the server says why" ktls_keyupdate
    step "ktls: pdio serve exits cleanly after SIGTERM" tls_stop
    step "ktls: the image holds the shadow" ktls_image_check
    step "ktls: figures (TCG): fio through nbd-client, pdio serve with kTLS and with GnuTLS" ktls_measure
}
