#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# bench/syscalls.sh — what one I/O costs a server, in counts: context
# switches and system calls per I/O, counted with perf on the server's PID
# over a whole fio run (fio's I/O count is the divisor).  Counts do not
# move with the host's load the way IOPS and CPU time do, so this is the
# tool for before/after comparisons of the data path (docs/performance.md,
# "Where pdio's time goes").
#
# Usage: bench/syscalls.sh [--job rr|rw|rr4x8] [--seconds S] SERVER...
#   SERVER: pdio (pdio serve, one thread per CPU),
#           pdio-tN (pdio serve --threads N),
#           pdio-nbdkit, pdio-nbdkit-psync, pdio-nbdkit-tN (nbdkit with
#           pdio.so, --threads=N), null,
#           qemu-native, qemu-uring
#   --job   4k randread QD32 (rr, default), 4k randwrite QD32 (rw),
#           4k randread over 4 connections x QD8 (rr4x8)
# Uses the benchmark's image (BENCH_DIR, default /var/tmp/pdio-bench; run
# bench/run.sh once first), the build tree's plugin (PDIO_PLUGIN) and its
# pdio (PDIO_CLI).  Run as root.
#
# Besides system calls it counts io_uring:io_uring_queue_async_work (a
# request the kernel could not issue inline and handed to an io-wq worker
# thread: that is where an io_uring server's context switches come from)
# and, for pdio, prints the engine's stats from pdio serve's exit
# (bounced_bytes must be 0 for these aligned jobs).
set -eu

here=$(cd "$(dirname "$0")" && pwd)
plugin=${PDIO_PLUGIN:-$here/../plugin/.libs/pdio.so}
pdio=${PDIO_CLI:-$here/../src/cli/pdio}
dir=${BENCH_DIR:-/var/tmp/pdio-bench}
img=$dir/disk.img
job=rr seconds=6

while [ $# -gt 0 ]; do
    case $1 in
    --job) job=$2; shift ;;
    --seconds) seconds=$2; shift ;;
    -h|--help) sed -n '2,/^set -eu/{/^set -eu/d;s/^# \{0,1\}//p}' "$0"; exit 0 ;;
    -*) echo "syscalls.sh: unknown option $1" >&2; exit 2 ;;
    *) break ;;
    esac
    shift
done
[ $# -gt 0 ] || { echo "syscalls.sh: name at least one server" >&2; exit 2; }
[ -f "$img" ] || { echo "syscalls.sh: $img is missing: run bench/run.sh once" >&2; exit 1; }
command -v perf >/dev/null || { echo "syscalls.sh: perf is missing (apt-get install linux-perf)" >&2; exit 1; }

case $job in
rr) fio_job="--rw=randread --iodepth=32" ;;
rw) fio_job="--rw=randwrite --iodepth=32" ;;
rr4x8) fio_job="--rw=randread --iodepth=8 --numjobs=4 --group_reporting" ;;
*) echo "syscalls.sh: unknown job $job" >&2; exit 2 ;;
esac

work=$(mktemp -d /tmp/pdio-syscalls.XXXXXX)
pid=""
cleanup() {
    if [ -n "$pid" ]; then
        kill "$pid" 2>/dev/null || true
        while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
    fi
    rm -rf "$work"
}
trap cleanup EXIT

# Only the system calls these servers make on their data path.
calls="io_uring_enter futex read write sendto sendmsg recvfrom recvmsg
       ppoll poll epoll_wait epoll_pwait pread64 pwrite64 preadv2 pwritev2
       fdatasync fsync fallocate newfstatat newfstat"
events=context-switches
for c in $calls; do
    [ -d /sys/kernel/tracing/events/syscalls/sys_enter_$c ] &&
        events="$events,syscalls:sys_enter_$c"
done
[ -d /sys/kernel/tracing/events/io_uring/io_uring_queue_async_work ] &&
    events="$events,io_uring:io_uring_queue_async_work"

# nbdkit writes its pid file from the daemon it forks, which may be after
# the command returns: wait for it (one file per server, never a stale one).
pidfile() {
    for _ in $(seq 100); do
        [ -s "$1" ] && { cat "$1"; return 0; }
        sleep 0.05
    done
    echo "syscalls.sh: no pid in $1" >&2
    return 1
}

start_server() {  # start_server NAME SOCKET: sets pid
    local name=$1 sock=$2
    case $name in
    qemu-native|qemu-uring)
        local aio=native
        [ "$name" = qemu-uring ] && aio=io_uring
        qemu-nbd -f raw --cache=none --aio=$aio -t -e 16 -k "$sock" "$img" &
        pid=$! ;;
    null)
        nbdkit -U "$sock" -P "$work/$name.pid" null size=$(stat -c %s "$img")
        pid=$(pidfile "$work/$name.pid") ;;
    pdio-nbdkit|pdio-nbdkit-psync|pdio-nbdkit-t*)
        local args="" backend=io_uring
        [ "$name" = pdio-nbdkit-psync ] && backend=psync
        case $name in pdio-nbdkit-t[0-9]*) args="--threads=${name#pdio-nbdkit-t}" ;; esac
        nbdkit $args -U "$sock" -P "$work/$name.pid" "$plugin" file="$img" backend=$backend
        pid=$(pidfile "$work/$name.pid") ;;
    pdio|pdio-t[0-9]*)
        [ -x "$pdio" ] || { echo "syscalls.sh: $pdio is missing (PDIO_CLI)" >&2; exit 1; }
        local threads=""
        case $name in pdio-t*) threads="--threads ${name#pdio-t}" ;; esac
        # Foreground; the engine's stats go to stderr when it exits.
        "$pdio" serve --socket "$sock" --exit-with-parent --backend io_uring \
            $threads "$img" >"$work/$name.log" 2>&1 &
        pid=$! ;;
    *) echo "syscalls.sh: unknown server $name" >&2; exit 2 ;;
    esac
    for _ in $(seq 50); do
        nbdinfo --size "nbd+unix:///?socket=$sock" >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    echo "syscalls.sh: $name did not answer on $sock" >&2
    exit 1
}

for server in "$@"; do
    sock=$work/$server.sock
    start_server "$server" "$sock"
    # perf counts the server for exactly as long as fio runs, and fio's
    # total I/O count (no ramp) is the divisor.
    perf stat -x, -e "$events" -p "$pid" -- \
        fio --name=x --ioengine=nbd --uri="nbd+unix:///?socket=$sock" --bs=4k \
        $fio_job --time_based --runtime="$seconds" --norandommap \
        --output-format=json --output="$work/fio.json" >/dev/null 2>"$work/perf.txt"
    kill "$pid"
    status=0
    case $server in
    pdio|pdio-t[0-9]*) wait "$pid" || status=$? ;;
    *) while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done ;;
    esac
    pid=""
    python3 - "$server" "$job" "$seconds" "$work/fio.json" "$work/perf.txt" <<'EOF'
import json, sys
server, job, seconds, fio_json, perf_txt = sys.argv[1:]
text = open(fio_json).read()
j = json.loads(text[text.index("{"):])["jobs"][0]
n = j["read"]["total_ios"] + j["write"]["total_ios"]
iops = n / float(seconds)
cells = []
for line in open(perf_txt):
    f = line.strip().split(",")
    if len(f) > 2 and f[0].isdigit() and int(f[0]) > 0:
        cells.append("%s %.2f" % (f[2].replace("syscalls:sys_enter_", "")
                                  .replace("io_uring:io_uring_queue_async_work",
                                           "io-wq-punt"),
                                  int(f[0]) / n))
print("%-12s %-6s %7.0f IOPS  per I/O: %s" % (server, job, iops,
                                             ", ".join(cells)))
EOF
    case $server in
    pdio|pdio-t[0-9]*)
        # The engine's counts over the whole session (nbdinfo's probe
        # included), and the exit status SIGTERM gave.
        st=$(sed -n 's/^pdio serve: stats: //p' "$work/$server.log" | tail -1)
        echo "             pdio serve exit $status; engine: ${st:-no stats printed}" ;;
    esac
done
