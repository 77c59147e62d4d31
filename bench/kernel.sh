#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
# bench/kernel.sh — the kernel path as users run it: fio on /dev/loopN
# (losetup --direct-io=on) and on /dev/nbdN behind pdio attach, qemu-nbd
# and nbdkit (both through nbd-client), one image, in a guest booted by
# tests/vm/run.sh (KVM when it can boot the kernel, else TCG; the table
# says which).  Run by hand, as root; never part of "make check".
#
#   bench/kernel.sh                       one run: every configuration and job
#   bench/kernel.sh --reverse             the configurations in reverse order
#   bench/kernel.sh --report DIR[,DIR]    the table again from finished runs
#
# Options:
#   --configs LIST   configurations, in order (default: loop,pdio,pdio-c2,
#                    pdio-c4,qemu-nbd,nbdkit-file,pdio-ms128,pdio-msmax):
#                    loop; pdio (pdio attach's defaults); pdio-cN (-C N);
#                    pdio-msK (the defaults, then max_sectors_kb K, or max
#                    = max_hw_sectors_kb; sequential jobs only); qemu-nbd
#                    (--cache=none --aio=native) and nbdkit-file
#                    (cache=none), each through nbd-client -b 512 -C 1;
#                    not by default, the remote rows, all against one pdio
#                    serve --tls-certificates on the image across a veth
#                    pair: remote-ktls (pdio attach nbds://, kTLS),
#                    remote-relay (tls.ko removed: pdio's relay) and
#                    nbd-client-tls (nbd-client -enable-tls), each
#                    checked to have the TLS path it names
#   --jobs LIST      default rr4k-qd1,rr4k-qd32,rw4k-qd32,sr1m-qd8,sw1m-qd8,untar
#   --runtime S      fio's measured seconds per job (default 6; at least 3)
#   --ramp S         fio's ramp seconds (default 1)
#   --size SIZE      the image (default 512m)
#   --accel A        auto (default), kvm or tcg
#   --out DIR        where the run goes (default bench/results/kernel-TIME)
#
# Needs what tests/vm/run.sh needs (scripts/bootstrap deps) and the build
# (scripts/bootstrap build; make -C tests vm/pdio-broken).  The table:
# bench/pdio_bench/kernel.py, also written to DIR/summary.md.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/.." && pwd)

configs=loop,pdio,pdio-c2,pdio-c4,qemu-nbd,nbdkit-file,pdio-ms128,pdio-msmax
jobs=rr4k-qd1,rr4k-qd32,rw4k-qd32,sr1m-qd8,sw1m-qd8,untar
runtime=6 ramp=1 size=512m accel=auto out="" reverse=0 report=""

usage() { sed -n '2,/^set -eu/{/^set -eu/d;s/^# \{0,1\}//p}' "$0" >&2; exit 2; }
while [ $# -gt 0 ]; do
    case $1 in
    --configs) configs=${2:?}; shift ;;
    --jobs) jobs=${2:?}; shift ;;
    --runtime) runtime=${2:?}; shift ;;
    --ramp) ramp=${2:?}; shift ;;
    --size) size=${2:?}; shift ;;
    --accel) accel=${2:?}; shift ;;
    --out) out=${2:?}; shift ;;
    --reverse) reverse=1 ;;
    --report) report=${2:?}; shift ;;
    -h|--help) usage ;;
    *) echo "kernel.sh: unknown argument: $1" >&2; usage ;;
    esac
    shift
done

py=python3
[ -x /usr/bin/python3 ] && py=/usr/bin/python3
PYTHONPATH=$here${PYTHONPATH:+:$PYTHONPATH}
export PYTHONPATH
if [ -n "$report" ]; then
    exec "$py" -m pdio_bench.kernel "$(echo "$report" | tr ',' ' ')"
fi

[ "$runtime" -ge 3 ] || { echo "kernel.sh: --runtime $runtime: at least 3" >&2; exit 2; }
if [ "$reverse" = 1 ]; then
    configs=$(echo "$configs" | tr ',' '\n' | sed -n '1!G;h;$p' | tr '\n' ',' | sed 's/,$//')
fi

# KVM only if it boots Debian's kernel: /dev/kvm may open and still not
# run it (nested set-ups without the CPU features the kernel wants).
accel_reason=""
if [ "$accel" = auto ]; then
    accel=tcg
    kernel=$(ls "${PDIO_VM_CACHE:-/var/cache/pdio-vm}"/kernels/*/boot/vmlinuz-* 2>/dev/null | head -n 1 || true)
    if [ ! -w /dev/kvm ]; then
        accel_reason="no usable /dev/kvm"
    elif [ -z "$kernel" ]; then
        accel_reason="no cached kernel to probe KVM with"
    elif (timeout 20 qemu-system-x86_64 -accel kvm -cpu host -machine pc -nodefaults \
            -display none -monitor none -serial stdio -m 256 -no-reboot \
            -kernel "$kernel" -append "console=ttyS0 panic=-1" |
            grep -q -m 1 'Linux version') 2>/dev/null; then
        accel=kvm
    else
        accel_reason="/dev/kvm exists but does not boot the guest kernel"
    fi
fi

[ -n "$out" ] || out=$here/results/kernel-$(date +%Y%m%d-%H%M%S)
mkdir -p "$out"
out=$(cd "$out" && pwd)
payload=$out/payload
rm -rf "$payload" && mkdir -p "$payload"
cp "$here/kernel-guest.sh" "$payload/guest.sh"
# The filesystem job's tree: this checkout's sources, as git has them.
git -C "$top" archive --format=tar HEAD src tests docs plugin > "$payload/tree.tar"
tree_bytes=$(tar -tvf "$payload/tree.tar" | awk '{ s += $3 } END { print s }')
{
    echo "KB_CONFIGS='$(echo "$configs" | tr ',' ' ')'"
    echo "KB_JOBS='$(echo "$jobs" | tr ',' ' ')'"
    echo "KB_RUNTIME=$runtime"
    echo "KB_RAMP=$ramp"
    echo "KB_SIZE=$size"
    echo "KB_TREE_BYTES=$tree_bytes"
} > "$payload/settings"
{
    echo "accel $accel${accel_reason:+ ($accel_reason)}"
    echo "host $(uname -r), $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg) at start"
    echo "pdio $(git -C "$top" rev-parse --short HEAD) ($(git -C "$top" rev-parse --abbrev-ref HEAD))"
    echo "started $(date -u +%Y-%m-%dT%H:%M:%SZ)"
} > "$out/host.txt"
echo "# kernel.sh: $accel${accel_reason:+ ($accel_reason)}; configs $configs; results in $out" >&2

rc=0
sh "$top/tests/vm/run.sh" --bench "$payload" --accel "$accel" --workdir "$out/vm" \
    --timeout 3600 > "$out/tap.txt" || rc=$?
echo "load $(cut -d' ' -f1-3 /proc/loadavg) at end" >> "$out/host.txt"
cat "$out/tap.txt"
# run.sh pulls the scratch disk's /logs into guest-logs/logs.
[ -d "$out/vm/guest-logs/logs/bench" ] || { echo "kernel.sh: the guest left no results" >&2; exit 1; }
rm -rf "$out/guest"
cp -R "$out/vm/guest-logs/logs/bench" "$out/guest"
rm -f "$out/vm/scratch.img" "$out/vm/scratch4k.img" "$out/vm/initrd.cpio"
"$py" -m pdio_bench.kernel "$out" | tee "$out/summary.md"
exit "$rc"
