# SPDX-License-Identifier: BSD-3-Clause
# bench/kernel-guest.sh — the guest's half of bench/kernel.sh: fio through
# the kernel on one image, behind loop and behind each NBD server.
#
# tests/vm/run.sh --bench DIR copies DIR (this file as guest.sh, the
# settings bench/kernel.sh wrote, the tree to untar) to /pdio/bench and
# runs scenario_bench with the guest library (tests/lib/guest.sh).  Each
# configuration is one step: set the device up, run every job on it, take
# it down.  Per job the raw figures go to $LOGS/bench/rows.tsv and fio's
# JSON next to it; the host reads them back off the scratch disk and makes
# the table (bench/pdio_bench/kernel.py).  Nothing here is a pass
# condition but the set-up itself: timings are figures.
#
# CPU is read twice inside fio's measured window (after the first I/O and
# the ramp), from /proc/stat for the whole guest and from
# /proc/PID/stat utime+stime for the server's processes, so fio's start
# and the connection set-up are left out.

KB_DIR=/pdio/bench
KB_IMG=/scratch/bench.img
KB_SOCK=$STATE/bench.sock
KB_NBD=/dev/nbd15       # nbd-client's device; pdio attach picks its own
# util-linux's, by its path: the guest's busybox sh runs its own applet,
# which has no --direct-io, for a bare "losetup".
KB_LOSETUP=/usr/sbin/losetup

kb_settings() {
    # shellcheck disable=SC1091 # written by bench/kernel.sh
    . "$KB_DIR/settings"
    KB_OUT=$LOGS/bench
}

# kb_busy: the guest's busy ticks (user nice system irq softirq).
kb_busy() { awk '$1 == "cpu" { print $2 + $3 + $4 + $7 + $8; exit }' /proc/stat; }

# kb_srv_ticks PID...: utime+stime of these processes, summed.
kb_srv_ticks() {
    t=0
    for p in "$@"; do
        s=$(sed 's/.*) //' "/proc/$p/stat" 2>/dev/null) || continue
        # shellcheck disable=SC2086 # fields
        set -- $s
        # After "pid (comm) ": state is field 1, utime 12, stime 13.
        t=$((t + ${12} + ${13}))
    done
    echo "$t"
}

# kb_srv_pids COMM...: the pids of every process with one of these names.
kb_srv_pids() {
    for d in /proc/[0-9]*; do
        c=$(cat "$d/comm" 2>/dev/null) || continue
        for n in "$@"; do
            [ "$c" = "$n" ] && echo "${d#/proc/}"
        done
    done | tr '\n' ' '
}

kb_centis() { awk '{ printf "%d\n", $1 * 100 }' /proc/uptime; }

# kb_dev_ios DEV: requests completed on the block device (reads + writes).
kb_dev_ios() { awk '{ print $1 + $5 }' "/sys/block/${1#/dev/}/stat"; }

# kb_net: the client's veth counters (bytes and packets each way), for
# the remote rows: "-" where there is no veth.
KB_VETH=/sys/class/net/veth-c/statistics
kb_net() {
    if [ -d "$KB_VETH" ]; then
        echo "$(cat "$KB_VETH/tx_bytes") $(cat "$KB_VETH/tx_packets") $(cat "$KB_VETH/rx_bytes") $(cat "$KB_VETH/rx_packets")"
    else
        echo "- - - -"
    fi
}

kb_snap() {
    # shellcheck disable=SC2086 # a list of pids
    echo "$(kb_centis) $(kb_busy) $(kb_srv_ticks $KB_PIDS) $(kb_dev_ios "$KB_DEV")"
}

# kb_fio NAME FIO-OPTION...: one time-based job on $KB_DEV, CPU taken over
# the middle of its measured window.
kb_fio() {
    name=$1; shift
    json=$KB_OUT/$KB_CONF-$name.json
    fio --name="$name" --filename="$KB_DEV" --ioengine=io_uring --direct=1 \
        --time_based --runtime="$KB_RUNTIME" --ramp_time="$KB_RAMP" \
        --norandommap --group_reporting --output-format=json \
        --output="$json" "$@" &
    fpid=$!
    i0=$(kb_dev_ios "$KB_DEV")
    n=0
    while [ "$(kb_dev_ios "$KB_DEV")" = "$i0" ] && [ $n -lt 300 ]; do
        sleep 0.1; n=$((n + 1))
    done
    sleep "$KB_RAMP"
    a=$(kb_snap) na="$(kb_net) $(kb_dev_ios "$KB_DEV")"
    sleep $((KB_RUNTIME - 1))
    b=$(kb_snap) nb="$(kb_net) $(kb_dev_ios "$KB_DEV")"
    wait "$fpid" || { echo "fio $name failed on $KB_DEV"; cat "$json"; return 1; }
    echo "$KB_CONF $name $a $b 0" >> "$KB_OUT/rows.tsv"
    case $na in "- "*) ;; *) echo "$KB_CONF $name $na $nb" >> "$KB_OUT/net.tsv" ;; esac
}

# kb_untar: mkfs.ext4 on the device (no discard: the image keeps its
# blocks for the next configuration), then untar the tree and sync, timed.
kb_untar() {
    mkfs.ext4 -F -q -E nodiscard,lazy_itable_init=0,lazy_journal_init=0 "$KB_DEV" || return 1
    mount -t ext4 "$KB_DEV" "$MNT" || return 1
    sync
    a=$(kb_snap)
    tar -xf "$KB_DIR/tree.tar" -C "$MNT" || { umount "$MNT"; return 1; }
    sync
    b=$(kb_snap)
    umount "$MNT" || return 1
    echo "$KB_CONF untar $a $b $KB_TREE_BYTES" >> "$KB_OUT/rows.tsv"
}

kb_jobs() {
    for j in $KB_JOBS; do
        case $j in
        rr4k-qd1) kb_fio "$j" --rw=randread --bs=4k --iodepth=1 ;;
        rr4k-qd32) kb_fio "$j" --rw=randread --bs=4k --iodepth=32 ;;
        rw4k-qd32) kb_fio "$j" --rw=randwrite --bs=4k --iodepth=32 ;;
        sr1m-qd8) kb_fio "$j" --rw=read --bs=1M --iodepth=8 ;;
        sw1m-qd8) kb_fio "$j" --rw=write --bs=1M --iodepth=8 ;;
        untar) kb_untar ;;
        *) echo "unknown job $j"; return 1 ;;
        esac || return 1
    done
}

kb_wait_sock() { wait_until 30 test -S "$KB_SOCK"; }

# kb_describe: what the device is, for the table's notes.
kb_describe() {
    q=/sys/block/${KB_DEV#/dev/}/queue
    hw=$(ls "/sys/block/${KB_DEV#/dev/}/mq" 2>/dev/null | wc -l)
    echo "$KB_CONF $KB_DEV max_sectors_kb=$(cat "$q/max_sectors_kb") max_hw_sectors_kb=$(cat "$q/max_hw_sectors_kb") hw_queues=$hw logical_block=$(cat "$q/logical_block_size") $*" >> "$KB_OUT/configs.tsv"
    detail "$KB_CONF: $KB_DEV max_sectors_kb $(cat "$q/max_sectors_kb"), $hw hardware queue(s) $*"
}

# The remote rows, all against one pdio serve --tls-certificates on the
# image, in remote.sh's namespace across its veth pair (guest-init.sh
# sources every scenario's file, remote.sh and remote_tls.sh among them;
# run.sh makes remote_tls's credentials for a bench run too):
# remote-ktls (pdio attach nbds://, kTLS), remote-relay (the same with
# tls.ko removed: the supervisor's relay) and nbd-client-tls
# (nbd-client -enable-tls: its own user-space proxy).  Each row checks
# the path it got, since a silent fallback would measure the wrong one.
# The server's CPU is counted with the client's user-space end
# (supervisor, nbd-client), where the relay and the proxy spend theirs.
KB_RSRV=$STATE/bench.rserver

# kb_rserve: that server, started by the first remote row; the later
# ones check that it is still the same process.
kb_rserve() {
    if [ -f "$KB_RSRV" ]; then
        p=$(cat "$KB_RSRV")
        if proc_gone "$p"; then
            echo "pdio serve $p, the remote rows' server, has exited"
            tail -n 20 "$LOGS/remote-tls-serve.log"
            return 1
        fi
        return 0
    fi
    rm_net
    [ -d /sys/module/tls ] || insmod /modules/tls.ko
    rt_serve_x509 "$KB_IMG"
    cp "$STATE/rm.server" "$KB_RSRV"
}

# kb_srv_tls: the server's side of the row's connection, from the kTLS
# sessions its namespace counts.
kb_srv_tls() {
    n=$(rm_in awk '$1 == "TlsCurrTxSw" { print $2 }' /proc/net/tls_stat 2>/dev/null || true)
    if [ "${n:-0}" -gt 0 ]; then echo "server kTLS"; else echo "server GnuTLS"; fi
}

kb_tls_gone() { test "$(rt_stat TlsCurrRxSw)" = 0; }

# kb_remote NAME: attach the remote row NAME, and check its TLS path.
kb_remote() {
    kb_rserve
    srv=$(cat "$KB_RSRV")
    case $1 in
    remote-ktls) [ -d /sys/module/tls ] || insmod /modules/tls.ko ;;
    remote-relay)
        # No kTLS in the kernel at all: not for the server either.
        wait_until 30 kb_tls_gone
        [ ! -d /sys/module/tls ] || wait_until 30 rmmod tls
        ;;
    esac
    tx0=$(rt_stat TlsCurrTxSw)
    case $1 in
    remote-*)
        KB_DEV=$(pdio attach --tls-certificates "$RT_DIR/client" "$RT_URI")
        echo "$KB_DEV" > "$STATE/rm.dev"
        sup=$(rm_field supervisor_pid)
        KB_PIDS="$srv $sup"
        got=$(pdio list --json | jq -r --arg d "$KB_DEV" '.nbddevices[] | select(.name == $d) | "\(.link) \(.tls)"')
        relays=$(rt_relay_threads)
        want="connected ${1#remote-}"
        said=$(grep 'TLS' "$PDIO_RUN/nbd$(rm_idx).supervisor.log" | tail -n 1 | sed 's/^.*]: //')
        path="pdio list --json: $got, relay threads $relays, the supervisor: $said"
        ok=no
        case $1 in
        remote-ktls) [ "$got" = "$want" ] && [ "$relays" = 0 ] && ok=yes ;;
        remote-relay) [ "$got" = "$want" ] && [ "$relays" = 1 ] && ok=yes ;;
        esac
        ;;
    nbd-client-tls)
        nbd-client "$RM_S" "$RM_PORT" "$KB_NBD" -b 512 -enable-tls \
            -cacertfile "$RT_DIR/client/ca-cert.pem" -tlshostname "$RM_S"
        KB_DEV=$KB_NBD
        proxy=$(kb_srv_pids nbd-client)
        KB_PIDS="$srv $proxy"
        path="nbd-client pid(s) ${proxy:-none}"
        ok=no
        [ -n "$proxy" ] && ok=yes
        ;;
    esac
    tx=$(rt_stat TlsCurrTxSw)
    case $1 in
    remote-ktls) [ $((tx - tx0)) = 1 ] || ok=no ;;
    *) [ "$tx" = "$tx0" ] || ok=no ;;
    esac
    path="$path; client kTLS TX sessions $tx0 -> $tx; $(kb_srv_tls)"
    kb_describe "pids=$KB_PIDS server=$srv $path"
    [ "$ok" = yes ] || { echo "$1: not the TLS path the row is for: $path"; kb_remote_down "$1"; return 1; }
}

kb_remote_down() {
    case $1 in
    remote-*)
        sup=$(rm_field supervisor_pid)
        pdio detach "$KB_DEV"
        wait_until 30 proc_gone "$sup"
        ;;
    nbd-client-tls)
        nbd-client -d "$KB_NBD"
        for p in $(kb_srv_pids nbd-client); do wait_until 30 proc_gone "$p"; done
        ;;
    esac
    [ -d /sys/module/tls ] || insmod /modules/tls.ko
}

# kb_conf NAME: one configuration through the job list.  NAME: loop,
# pdio, pdio-cN (-C N), pdio-msK (max_sectors_kb K after attach, or "max":
# max_hw_sectors_kb), qemu-nbd, nbdkit-file, remote-ktls, remote-relay,
# nbd-client-tls.
kb_conf() {
    KB_CONF=$1
    KB_PIDS=""
    jobs=$KB_JOBS
    case $1 in
    loop)
        KB_DEV=$("$KB_LOSETUP" --direct-io=on -f --show "$KB_IMG")
        dio=$(cat "/sys/block/${KB_DEV#/dev/}/loop/dio")
        [ "$dio" = 1 ] || { echo "$KB_DEV: direct I/O is off"; "$KB_LOSETUP" -d "$KB_DEV"; return 1; }
        kb_describe "dio=$dio"
        ;;
    pdio|pdio-c*|pdio-ms*)
        opts=""
        case $1 in pdio-c*) opts="-C ${1#pdio-c}" ;; esac
        # shellcheck disable=SC2086
        KB_DEV=$(pdio attach $opts "$KB_IMG")
        case $1 in
        pdio-ms*)
            q=/sys/block/${KB_DEV#/dev/}/queue
            ms=${1#pdio-ms}
            [ "$ms" != max ] || ms=$(cat "$q/max_hw_sectors_kb")
            echo "$ms" > "$q/max_sectors_kb"
            # Only the sequential jobs say anything about request size.
            jobs=$(echo "$KB_JOBS" | tr ' ' '\n' | grep -E '^s[rw]1m' | tr '\n' ' ')
            ;;
        esac
        KB_PIDS=$(kb_srv_pids pdio)
        kb_describe "pids=$KB_PIDS $(pdio list 2>/dev/null | tail -n +2 | head -n 1)"
        ;;
    qemu-nbd)
        rm -f "$KB_SOCK"
        qemu-nbd -f raw --cache=none --aio=native -t -e 16 -k "$KB_SOCK" "$KB_IMG" \
            > "$LOGS/bench-qemu-nbd.log" 2>&1 &
        kb_wait_sock
        nbd-client -unix "$KB_SOCK" "$KB_NBD" -b 512 -C 1
        KB_DEV=$KB_NBD
        KB_PIDS=$(kb_srv_pids qemu-nbd)
        kb_describe "pids=$KB_PIDS qemu-nbd --cache=none --aio=native"
        ;;
    nbdkit-file)
        rm -f "$KB_SOCK"
        nbdkit -f -U "$KB_SOCK" file "$KB_IMG" cache=none \
            > "$LOGS/bench-nbdkit.log" 2>&1 &
        kb_wait_sock
        nbd-client -unix "$KB_SOCK" "$KB_NBD" -b 512 -C 1
        KB_DEV=$KB_NBD
        KB_PIDS=$(kb_srv_pids nbdkit)
        kb_describe "pids=$KB_PIDS nbdkit file cache=none"
        ;;
    remote-ktls|remote-relay|nbd-client-tls) kb_remote "$1" ;;
    *) echo "unknown configuration $1"; return 1 ;;
    esac
    rc=0
    KB_JOBS=$jobs kb_jobs || rc=$?
    case $1 in
    loop) "$KB_LOSETUP" -d "$KB_DEV" ;;
    pdio*) pdio detach "$KB_DEV" ;;
    qemu-nbd|nbdkit-file)
        nbd-client -d "$KB_NBD"
        # shellcheck disable=SC2086
        kill $KB_PIDS
        for p in $KB_PIDS; do wait_until 30 sh -c "! test -d /proc/$p"; done
        ;;
    remote-*|nbd-client-tls) kb_remote_down "$1" ;;
    esac
    return $rc
}

# kb_image: the image, written end to end once (fio's random data), so
# every read hits written blocks.
kb_image() {
    mkdir -p "$KB_OUT"
    : > "$KB_OUT/rows.tsv"
    : > "$KB_OUT/configs.tsv"
    : > "$KB_OUT/net.tsv"
    fio --name=fill --filename="$KB_IMG" --size="$KB_SIZE" --rw=write --bs=1M \
        --ioengine=io_uring --direct=1 --iodepth=8 --output=/dev/null
    {
        echo "kernel $(uname -r)"
        echo "cpus $(nproc)"
        echo "image $KB_IMG $(stat -c %s "$KB_IMG") bytes on $(awk '$2 == "/scratch" { print $1, $3 }' /proc/mounts)"
        echo "tree $(tar -tf "$KB_DIR/tree.tar" | wc -l) entries, $(stat -c %s "$KB_DIR/tree.tar") bytes"
        echo "fio $(fio --version)"
        echo "qemu-nbd $(qemu-nbd --version | head -n 1)"
        echo "nbdkit $(nbdkit --version)"
        echo "nbd-client $(nbd-client -V 2>&1 | head -n 1)"
    } > "$KB_OUT/guest.txt"
    detail "image $KB_SIZE, tree $(stat -c %s "$KB_DIR/tree.tar") bytes"
}

scenario_bench() {
    kb_settings
    step "bench: the image, written once" kb_image
    for c in $KB_CONFIGS; do
        step "bench: $c" kb_conf "$c"
    done
    case " $KB_CONFIGS " in
    *" remote-"*|*" nbd-client-tls "*)
        step "bench: the remote rows' server stopped, the namespace gone" rm_teardown ;;
    esac
}
