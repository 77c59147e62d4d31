#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# bench/counters.sh — what the device's counters (pdio serve --stats) cost
# per I/O, in instructions: the server runs under callgrind, once without
# and once with --stats, for two fio runs of different lengths on the
# same job; the difference of the two lengths is the cost of the extra
# I/Os alone (start-up and exit cancel out).  Instruction counts do not
# move with the host's load or the disk's noise, which at rr4k-qd32 is
# larger than the 2 % the counters may cost (bench/run.sh --servers
# stats gives the IOPS side).  A plain run of the same job then gives the
# server's user and system CPU time per I/O, so the extra instructions
# can be set against the whole CPU cost of an I/O.
#
# Usage: bench/counters.sh [--repeat N] [--ios N]
# Uses the benchmark's image (BENCH_DIR, default /var/tmp/pdio-bench; run
# bench/run.sh once first) and this tree's pdio (PDIO_CLI).  Run as root.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
pdio=${PDIO_CLI:-$here/../src/cli/pdio}
dir=${BENCH_DIR:-/var/tmp/pdio-bench}
img=$dir/disk.img
repeat=3 ios=200000

while [ $# -gt 0 ]; do
    case $1 in
    --repeat) repeat=$2; shift ;;
    --ios) ios=$2; shift ;;
    -h|--help) sed -n '2,/^set -eu/{/^set -eu/d;s/^# \{0,1\}//p}' "$0"; exit 0 ;;
    *) echo "bench/counters.sh: unknown argument: $1" >&2; exit 2 ;;
    esac
    shift
done
for t in valgrind fio; do
    command -v $t >/dev/null || { echo "bench/counters.sh: $t is missing" >&2; exit 2; }
done
[ -f "$img" ] || { echo "bench/counters.sh: no image $img (run bench/run.sh once)" >&2; exit 2; }
[ -x "$pdio" ] || { echo "bench/counters.sh: no pdio at $pdio (build first)" >&2; exit 2; }

work=$(mktemp -d /tmp/pdio-counters.XXXXXX)
trap 'rm -rf "$work"' EXIT
short=$((ios / 10))

# fio against the server on $1: 4k random reads at QD32, $2 I/Os.
run_fio() {
    fio --name=rr4k-qd32 --ioengine=nbd --uri="nbd+unix:///?socket=$1" \
        --rw=randread --bs=4k --iodepth=32 --number_ios="$2" \
        --size="$(stat -c %s "$img")" --output-format=terse >"$work/fio.out" 2>&1 ||
        { cat "$work/fio.out" >&2; return 1; }
}

# Starts pdio serve (under $wrap, if set) with extra arguments; sets pid.
start_serve() {
    sock=$work/s.sock
    rm -f "$sock" "$work/stats"
    $wrap "$pdio" serve --threads 1 --backend io_uring -s "$sock" "$@" "$img" \
        >"$work/serve.log" 2>&1 &
    pid=$!
    for _ in $(seq 150); do
        [ -S "$sock" ] && return 0
        kill -0 $pid 2>/dev/null || break
        sleep 0.2
    done
    cat "$work/serve.log" >&2
    return 1
}

stop_serve() {
    kill -TERM $pid
    wait $pid || { cat "$work/serve.log" >&2; return 1; }
}

# Instructions of one server run under callgrind, for $1 I/Os; $2.. are
# serve's extra arguments.
instructions() {
    local n=$1; shift
    wrap="valgrind --tool=callgrind --callgrind-out-file=$work/cg.out"
    start_serve "$@"
    run_fio "$sock" "$n"
    stop_serve
    sed -n 's/^summary: //p' "$work/cg.out"
}

# Instructions per I/O of the extra ios - short I/Os.
per_io() {
    local a b
    a=$(instructions $short "$@")
    b=$(instructions $ios "$@")
    echo $(( (b - a) / (ios - short) ))
}

echo "pdio: $pdio"
echo "job: 4k random reads, QD32, one connection, serve --threads 1;" \
     "$short and $ios I/Os per run"
printf '%-4s %12s %12s %8s\n' rep "plain Ir/IO" "stats Ir/IO" extra
total=0
for r in $(seq "$repeat"); do
    p=$(per_io)
    s=$(per_io --stats "$work/stats")
    printf '%-4s %12d %12d %8d\n' "$r" "$p" "$s" $((s - p))
    total=$((total + s - p))
done
extra=$((total / repeat))

# CPU time of a plain server over the same job (outside valgrind).
wrap=
hz=$(getconf CLK_TCK)
start_serve
read -r u0 s0 < <(awk '{print $14, $15}' /proc/$pid/stat)
run_fio "$sock" "$ios"
read -r u1 s1 < <(awk '{print $14, $15}' /proc/$pid/stat)
stop_serve
awk -v u=$((u1 - u0)) -v s=$((s1 - s0)) -v hz="$hz" -v n="$ios" \
    -v p="$p" -v x="$extra" 'BEGIN {
    us = u * 1e6 / hz / n; ss = s * 1e6 / hz / n;
    printf "plain server CPU per I/O: %.2f us user + %.2f us system\n", us, ss;
    # The user time per instruction of the plain server prices the extra ones.
    cost = x * (us / p);
    printf "counters: %d instructions per I/O = %.3f us = %.2f%% of the CPU per I/O\n",
           x, cost, 100 * cost / (us + ss);
}'
