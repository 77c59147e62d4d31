# SPDX-License-Identifier: BSD-3-Clause
# --- pdio stats: the counters outlive the server, and match fio ------------------
# A device attached with pdio's own server; 256 O_DIRECT writes of 4 KiB
# by dd (each one request: nothing merges a synchronous direct write) are
# counted exactly, by pdio stats and by the kernel, before and after a
# hand-over (pdio restart), and after a SIGKILL of the server: the counts
# go on from where they were, with the hand-over, the restart and the
# server starts counted.  Then fio reads at random while pdio stats
# --watch 5 prints rates: fio starts once the watch has printed its first
# interval and the watch stops once it printed one with no reads after
# fio's exit, so its intervals hold every read.  Those reads are counted
# exactly, by the kernel and by pdio stats --json (which also counts the
# supervisor's watchdog's probes, one block each: the bytes tell them
# apart), and they are fio's (with the kernel's merges).  Each r/s is
# the reads of an interval over its measured length, which is 5 s give or
# take the watch's wake-up delays (its schedule is fixed, so they do not
# add up): the sum of r/s times 5 s is within 10 % of the count unless a
# reading comes 0.45 s late, and half of it if the rates were over twice
# the interval.  Their mean against fio's IOPS would be a timing: TCG's
# rate varies from second to second (1073 to 4302 r/s in one run).
# detach removes the counters.
ST_WRITES=256
ST_WATCH=5          # --watch's interval in seconds

st_json() { pdio stats --json "$(rc_dev)"; }
# st_get JQ: one number from pdio stats --json's device.
st_get() { st_json | jq -r ".devices[0]$1"; }
st_kernel_writes() { awk '{ print $5 }' "/sys/block/nbd$(rc_idx)/stat"; }
# The kernel's reads completed, merged, and their sectors.
st_kernel_reads() { awk '{ print $1, $2, $3 }' "/sys/block/nbd$(rc_idx)/stat"; }

# st_writes LABEL: dd's writes are counted, by pdio and the kernel alike.
st_writes() {
    w0=$(st_get .operations.write.requests)
    b0=$(st_get .operations.write.bytes)
    k0=$(st_kernel_writes)
    dd if=/dev/urandom of="$(rc_dev)" bs=4096 count=$ST_WRITES oflag=direct \
        seek=$((${st_seek:=0} * ST_WRITES)) 2> /dev/null
    st_seek=$((st_seek + 1))
    w1=$(st_get .operations.write.requests)
    b1=$(st_get .operations.write.bytes)
    k1=$(st_kernel_writes)
    echo "$1: writes $w0 -> $w1, bytes $b0 -> $b1, kernel writes $k0 -> $k1"
    [ $((w1 - w0)) = $ST_WRITES ] && [ $((b1 - b0)) = $((ST_WRITES * 4096)) ] &&
        [ $((k1 - k0)) = $ST_WRITES ]
}

st_attach() {
    SERVER=native
    rm -f "$RC_IMG"
    truncate -s "$RC_SIZE" "$RC_IMG"
    echo "$RC_IMG" > "$STATE/img"
    pdio attach "$RC_IMG" > "$STATE/rc.dev"
    name=$(sed -n 's/^name=//p' "$PDIO_RUN/nbd$(rc_idx).rec")
    [ -f "$PDIO_RUN/$name.stats" ] || { echo "no $PDIO_RUN/$name.stats"; return 1; }
    echo "$PDIO_RUN/$name.stats" > "$STATE/st.file"
    pdio stats "$(rc_dev)"
    st_writes "attached"
    [ "$(st_get .server_starts)" = 1 ]
    detail "$(rc_dev): $(pdio stats "$(rc_dev)" | grep '^  write ' | tr -s ' ')"
}

st_handover() {
    old=$(rc_field server_pid)
    w0=$(st_get .operations.write.requests)
    pdio restart "$(rc_dev)"
    [ "$(rc_field server_pid)" != "$old" ]
    w1=$(st_get .operations.write.requests)
    [ "$w1" = "$w0" ] || { echo "writes $w0 before the hand-over, $w1 after"; return 1; }
    st_writes "after the hand-over"
    [ "$(st_get .handovers)" = 1 ] && [ "$(st_get .server_starts)" = 2 ]
    detail "hand-overs $(st_get .handovers), servers $(st_get .server_starts), writes $(st_get .operations.write.requests), pause bound $(st_get .last_pause_ns) ns"
}

st_kill() {
    old=$(rc_field server_pid)
    r0=$(rc_field restarts)
    w0=$(st_get .operations.write.requests)
    kill -KILL "$old"
    wait_until 60 rc_replaced $((r0 + 1)) "$old" ||
        { echo "no new server 60 s after SIGKILL"; return 1; }
    [ "$(st_get .operations.write.requests)" = "$w0" ]
    st_writes "after SIGKILL"
    [ "$(st_get .restarts)" = 1 ] && [ "$(st_get .server_starts)" = 3 ]
    [ "$(st_get .longest_pause_ns)" -gt 0 ]
    for op in read write flush; do
        [ "$(st_get ".operations.$op.in_flight")" = 0 ] ||
            { echo "$op: $(st_get ".operations.$op.in_flight") in flight at rest"; return 1; }
    done
    detail "restarts $(st_get .restarts), servers $(st_get .server_starts), writes $(st_get .operations.write.requests), longest pause $(($(st_get .longest_pause_ns) / 1000000)) ms (TCG)"
}

# st_watch_idle N: the watch printed, after its first N lines, an interval
# with no reads.
st_watch_idle() {
    awk -v n="$1" 'NR > n && $1 ~ /^\/dev\/nbd/ && $2 == 0 { f = 1 } END { exit !f }' \
        "$STATE/st.watch"
}

st_fio() {
    r0=$(st_get .operations.read.requests)
    rb0=$(st_get .operations.read.bytes)
    k0=$(st_kernel_reads)
    pdio stats --watch $ST_WATCH "$(rc_dev)" > "$STATE/st.watch" &
    wpid=$!
    # fio starts once the watch has taken its first reading (and printed
    # the interval after it), so no read comes before the intervals.
    wait_until 120 grep -q '^/dev/nbd' "$STATE/st.watch" ||
        { kill "$wpid"; echo "pdio stats --watch printed nothing in 120 s"; return 1; }
    fio --name=st --filename="$(rc_dev)" --rw=randread --bs=4k --direct=1 \
        --ioengine=libaio --iodepth=16 --time_based --runtime=12 \
        --size=64m --output-format=json > "$STATE/st.fio.json"
    # ... and the watch stops once an interval after fio's exit had no
    # reads: none comes after the intervals either.
    seen=$(wc -l < "$STATE/st.watch")
    wait_until 120 st_watch_idle "$seen" ||
        { kill "$wpid"; cat "$STATE/st.watch"; echo "no interval without reads 120 s after fio"; return 1; }
    kill "$wpid"
    wait "$wpid" 2> /dev/null || true
    r1=$(st_get .operations.read.requests)
    rb1=$(st_get .operations.read.bytes)
    k1=$(st_kernel_reads)
    fio_ios=$(jq '.jobs[0].read.total_ios' "$STATE/st.fio.json")
    fio_iops=$(jq '.jobs[0].read.iops' "$STATE/st.fio.json")
    cat "$STATE/st.watch"
    # shellcheck disable=SC2086 # the three counts, split
    set -- $k0 $k1
    reads=$((r1 - r0)) kreads=$(($4 - $1)) kmerged=$(($5 - $2)) kbytes=$((($6 - $3) * 512))
    # The server also counts the watchdog's probes: one block each.
    probes=$((reads - kreads)) bs=$(rc_field block_size)
    awk '$1 ~ /^\/dev\/nbd/ && $2 > 0 { print $2 }' "$STATE/st.watch" > "$STATE/st.rates"
    n=$(wc -l < "$STATE/st.rates")
    sum=$(awk -v s="$ST_WATCH" '{ t += $1 * s } END { printf "%.0f", t }' "$STATE/st.rates")
    tap_diag "stats --watch $ST_WATCH during fio randread 4k qd16 (TCG): fio $fio_ios reads ($fio_iops IOPS); the kernel $kreads requests ($kmerged merged); pdio stats --json $reads ($probes the watchdog's probes); --watch's r/s times $ST_WATCH s: $sum over $n intervals, from $(sort -n "$STATE/st.rates" | head -n 1) to $(sort -n "$STATE/st.rates" | tail -n 1) r/s"
    detail "fio $fio_ios reads = kernel $kreads + $kmerged merged; pdio stats $reads = kernel + $probes probes; --watch $sum (the sum of its r/s times $ST_WATCH s)"
    [ "$probes" -ge 0 ] && [ $((rb1 - rb0 - kbytes)) = $((probes * bs)) ] ||
        { echo "pdio stats counted $reads reads of $((rb1 - rb0)) bytes, the kernel $kreads of $kbytes, probes of $bs bytes"; return 1; }
    [ "$fio_ios" = $((kreads + kmerged)) ] ||
        { echo "fio made $fio_ios reads, the kernel saw $kreads + $kmerged merged"; return 1; }
    [ "$n" -gt 0 ] && awk -v a="$sum" -v b="$reads" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(b > 0 && d <= 0.10 * b) }'
}

st_detach() {
    f=$(cat "$STATE/st.file")
    pdio detach "$(rc_dev)"
    srv_no_state
    srv_no_server
    [ ! -e "$f" ] || { echo "$f left behind"; return 1; }
}

scenario_stats() {
    step "stats: pdio attach; $ST_WRITES direct writes counted exactly by pdio stats and the kernel" st_attach
    step "stats: pdio restart (hand-over): the counters carry on, the hand-over counted" st_handover
    step "stats: SIGKILL of the server: the counters carry on, the restart and its pause counted, nothing in flight" st_kill
    step "stats: pdio stats --watch $ST_WATCH during fio randread: reads counted exactly; the rates times the interval add up to them, within 10 %" st_fio
    step "stats: pdio detach removes the counters with the rest" st_detach
}
