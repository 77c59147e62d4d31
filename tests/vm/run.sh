#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
# tests/vm/run.sh — the kernel nbd client against pdio, for real.
#
# This machine's kernel has no nbd driver, so boot Debian's own kernel under
# TCG with an initramfs made from this machine's binaries, give the guest a
# virtio-blk scratch disk, and run pdio's servers (pdio serve, or nbdkit
# with pdio.so), pdio(1) and nbd-client inside it.  The guest
# (tests/vm/guest-init.sh, running tests/vm/scenarios/NAME.sh on
# tests/lib) reports one TAP
# line per step on its second serial port; this script passes its results and
# figures on, as they are, to stdout, adds a failure for each step that
# never reported, and one last result of its own: the guest ran to
# completion and powered off, with no panic/oops, inside the hard timeout,
# and never fell silent for the stall limit.
# Both emit TAP with tests/lib/tap.sh.
#
# Usage: tests/vm/run.sh [options]
#   --keep              keep the work directory (console log, results, guest
#                       logs, scratch disk) and print where it is
#   --scenario LIST     comma-separated subset of: ext4,ioctl,xfs,fio,
#                       align4096,sector4k,reference,cli,recover,
#                       nbdkit-recover,handover,crash,mount,partitions,resize,ondemand,
#                       memory (or its parts memory_flags, memory_cgroup,
#                       memory_global, memory_swap; and memory_slice_none,
#                       on its own), and nbdkit-ext4,
#                       nbdkit-ioctl, nbdkit-xfs, nbdkit-fio,
#                       nbdkit-align4096, nbdkit-sector4k (the same with
#                       nbdkit and pdio.so as the server instead of pdio
#                       serve), tls (nbd-client -enable-tls
#                       against pdio serve on the guest's loopback),
#                       ktls (the same with the kernel's TLS in pdio
#                       serve, and a client's TLS 1.3 KeyUpdate), remote
#                       (pdio attach nbd://... across a veth pair between
#                       two network namespaces), stats (pdio stats: the
#                       counters across a hand-over and a SIGKILL, and
#                       --watch against fio), remote_ops (mount -t
#                       pdio nbd://..., fstab _netdev, --shared, detach
#                       --all, nbdkit), remote_faults (packets dropped,
#                       the server restarted, under fio verify), remote_tls (the same
#                       with nbds://: kTLS, and the relay), names
#                       (/dev/disk/by-pdio under systemd-udevd run as
#                       a daemon), deb (the Debian packages built from
#                       this tree, made here once per run, installed in
#                       the guest with dpkg, used and removed), and
#                       systemd (the guest execs
#                       systemd as init, so it always runs last)
#                       (default: all but nbdkit-ioctl, in that order, but
#                       memory, which takes about half an hour of its own
#                       and runs in a guest of its own as vm/memory.tap,
#                       and tls, ktls, remote, remote_ops, remote_faults
#                       and remote_tls, which vm/network.tap runs in
#                       another).
#                       Each scenario is tests/vm/scenarios/NAME.sh
#                       (memory.sh has the memory ones)
#   --plugin PATH       the pdio.so to test (default: $PDIO_PLUGIN, else the
#                       build tree's plugin/.libs/pdio.so)
#   --pdio PATH         the pdio(1) program to test (default: the build
#                       tree's src/cli/pdio)
#   --pdio-broken PATH  pdio(1) with its break points compiled in (default:
#                       the build tree's tests/vm/pdio-broken, which make
#                       check builds, or make -C tests vm/pdio-broken)
#   --timeout SEC       hard limit for the whole guest run (default 4800)
#   --stall SEC         the guest is stopped once it has printed nothing,
#                       on either serial port, for SEC (default 1500)
#   --workdir DIR       use DIR (created) instead of a fresh temporary one
#   --verbose           stream the guest console to stderr while it runs
#   --shell             no tests: boot to a busybox shell on this terminal
#   --bench DIR         no tests: run bench/kernel.sh's guest half,
#                       DIR/guest.sh (scenario_bench), with DIR as
#                       /pdio/bench in the guest; implies --keep
#   --accel tcg|kvm     qemu's accelerator (default tcg; kvm takes the
#                       host's CPU model)
#   --break LIST        run pdio-broken in place of pdio, with
#                       PDIO_TEST_BREAK=LIST in the guest (the break points
#                       are listed in tests/vm/breaks.c): the tests of the
#                       broken features must then fail
#
# Environment: PDIO_TEST_SERVER (native, the default, or nbdkit) is the
# server of the scenarios that run under either (those with an nbdkit-
# variant) when they are named without the prefix.  PDIO_VM_CACHE (default /var/cache/pdio-vm) holds the unpacked
# kernel and the cached part of the initramfs, outside the git tree so every
# clone on this machine reuses it.  PDIO_VM_FIO_SIZE (per fio job, default
# 24m) and PDIO_VM_FILES (files per filesystem round trip, default 300) size
# the workloads; PDIO_VM_MEM_CYCLES (default 10) is the memory scenarios'
# pressure cycles per variant (at least 10 for what the tests claim).
set -eu

here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)

keep=0 verbose=0 shell=0 workdir="" bench="" accel=tcg
scenarios="ext4,ioctl,xfs,fio,align4096,sector4k,reference,cli,recover,nbdkit-recover,handover,crash,mount,partitions,resize,ondemand,nbdkit-ext4,nbdkit-xfs,nbdkit-fio,nbdkit-align4096,nbdkit-sector4k,stats,names,deb,systemd"
break_list=""
plugin=${PDIO_PLUGIN:-}
pdio=""
pdio_broken=""
timeout=${PDIO_VM_TIMEOUT:-4800}
stall=${PDIO_VM_STALL:-1500}
cache=${PDIO_VM_CACHE:-/var/cache/pdio-vm}
fio_size=${PDIO_VM_FIO_SIZE:-24m}
files=${PDIO_VM_FILES:-300}
mem_cycles=${PDIO_VM_MEM_CYCLES:-10}

usage() { sed -n '2,/^set -eu/{/^set -eu/d;s/^# \{0,1\}//p}' "$0" >&2; exit 2; }

while [ $# -gt 0 ]; do
    case $1 in
    --keep) keep=1 ;;
    --verbose) verbose=1 ;;
    --shell) shell=1 keep=1 ;;
    --scenario) scenarios=${2:?}; shift ;;
    --scenario=*) scenarios=${1#*=} ;;
    --plugin) plugin=${2:?}; shift ;;
    --plugin=*) plugin=${1#*=} ;;
    --pdio) pdio=${2:?}; shift ;;
    --pdio=*) pdio=${1#*=} ;;
    --pdio-broken) pdio_broken=${2:?}; shift ;;
    --pdio-broken=*) pdio_broken=${1#*=} ;;
    --timeout) timeout=${2:?}; shift ;;
    --timeout=*) timeout=${1#*=} ;;
    --stall) stall=${2:?}; shift ;;
    --stall=*) stall=${1#*=} ;;
    --workdir) workdir=${2:?}; shift ;;
    --workdir=*) workdir=${1#*=} ;;
    --break) break_list=${2:?}; shift ;;
    --bench) bench=${2:?}; keep=1; shift ;;
    --accel) accel=${2:?}; shift ;;
    --break=*) break_list=${1#*=} ;;
    -h|--help) usage ;;
    *) echo "run.sh: unknown argument: $1" >&2; usage ;;
    esac
    shift
done

case $accel in
tcg) accel_args="-accel tcg,thread=multi -cpu ${PDIO_VM_CPU:-qemu64}" ;;
kvm) accel_args="-accel kvm -cpu host" ;;
*) echo "run.sh: --accel $accel: tcg or kvm" >&2; exit 2 ;;
esac
if [ -n "$bench" ]; then
    [ -f "$bench/guest.sh" ] || { echo "run.sh: --bench $bench: no guest.sh in it" >&2; exit 2; }
    scenarios=bench
fi
for s in $(echo "$scenarios" | tr ',' ' '); do
    case $s in
    bench) [ -n "$bench" ] || { echo "run.sh: scenario bench needs --bench DIR" >&2; exit 2; } ;;
    ext4|ioctl|xfs|fio|align4096|sector4k|reference|cli|recover|handover|mount|partitions) ;;
    resize|ondemand) ;;
    crash) ;;
    memory|memory_flags|memory_cgroup|memory_global|memory_swap|memory_slice_none) ;;
    nbdkit-ext4|nbdkit-ioctl|nbdkit-xfs|nbdkit-fio|nbdkit-align4096|nbdkit-sector4k|nbdkit-recover) ;;
    tls|ktls) ;;
    remote) ;;
    stats) ;;
    names|deb) ;;
    remote_tls) ;;
    remote_ops|remote_faults) ;;
    systemd) ;;
    *) echo "run.sh: unknown scenario: $s" >&2; exit 2 ;;
    esac
done
server=${PDIO_TEST_SERVER:-native}
case $server in
native|nbdkit) ;;
*) echo "run.sh: PDIO_TEST_SERVER=$server: native or nbdkit" >&2; exit 2 ;;
esac
# The systemd scenario ends with systemd as the guest's init: nothing can
# run after it, so it goes last.
case ",$scenarios," in
*,systemd,*)
    scenarios=$(echo "$scenarios" | tr ',' '\n' | grep -vx systemd | tr '\n' ',')systemd ;;
esac

. "$top/tests/lib/tap.sh"

# Anything that stops the harness before the guest has reported is a test
# failure in TAP form, never a skip: the scenario is not optional.
bail() {
    tap_result 1 "kernel nbd-client VM harness: $*"
    tap_plan
    echo "# $*" >&2
    exit 1
}

if [ -z "$plugin" ]; then
    plugin=${PDIO_BUILDDIR:-$top}/plugin/.libs/pdio.so
fi
[ -f "$plugin" ] || bail "plugin not found: $plugin (build first, or pass --plugin)"
plugin=$(cd "$(dirname "$plugin")" && pwd)/$(basename "$plugin")
if [ -z "$pdio" ]; then
    pdio=${PDIO_BUILDDIR:-$top}/src/cli/pdio
fi
[ -x "$pdio" ] || bail "pdio(1) not found: $pdio (build first, or pass --pdio)"
pdio=$(cd "$(dirname "$pdio")" && pwd)/$(basename "$pdio")
if [ -z "$pdio_broken" ]; then
    pdio_broken=${PDIO_BUILDDIR:-$top}/tests/vm/pdio-broken
fi
[ -x "$pdio_broken" ] || bail "pdio-broken not found: $pdio_broken (make -C tests vm/pdio-broken, or pass --pdio-broken)"
pdio_broken=$(cd "$(dirname "$pdio_broken")" && pwd)/$(basename "$pdio_broken")

for tool in qemu-system-x86_64 busybox cpio ldd modinfo apt-get apt-cache dpkg flock \
        nbdkit nbd-client nbdinfo fio mke2fs e2fsck debugfs mkfs.xfs xfs_repair xfs_io \
        fincore fstrim sfdisk losetup timeout systemctl udevadm dmsetup stress-ng cmp; do
    command -v "$tool" >/dev/null 2>&1 || bail "missing tool on the host: $tool (run scripts/bootstrap deps)"
done
for f in /lib/systemd/systemd /lib/systemd/systemd-udevd /lib/systemd/system-generators/systemd-fstab-generator \
        /lib/udev/rules.d/99-systemd.rules /lib/udev/rules.d/60-persistent-storage.rules; do
    [ -e "$f" ] || bail "missing on the host: $f (run scripts/bootstrap deps: systemd, udev)"
done
busybox_bin=$(command -v busybox)
# The guest has no dynamic busybox libraries: it must be busybox-static.
if ldd "$busybox_bin" >/dev/null 2>&1; then
    bail "$busybox_bin is dynamically linked; install busybox-static"
fi

now() { date +%s; }
t_start=$(now)

mkdir -p "$cache" || bail "cannot create cache directory $cache"

# --- the kernel ---------------------------------------------------------------
# Resolve linux-image-amd64 to the current ABI package (the archive moves),
# download it once, unpack it with dpkg -x (never install it) into the cache.
resolve_kernel_pkg() {
    apt-cache depends linux-image-amd64 2>/dev/null |
        sed -n 's/^ *Depends: \(linux-image-[0-9][^ ]*-amd64\)$/\1/p' | head -n 1
}

fetch_kernel() {
    pkg=$(resolve_kernel_pkg)
    if [ -z "$pkg" ]; then
        # A fresh machine may have no package lists yet.
        apt-get update -qq >&2 || true
        pkg=$(resolve_kernel_pkg)
    fi
    if [ -z "$pkg" ]; then
        # No archive at all: fall back to whatever kernel is cached.
        pkg=$(find "$cache/kernels" -mindepth 2 -maxdepth 2 -name .complete 2>/dev/null |
            sed 's|/.complete$||; s|.*/||' | sort -V | tail -n 1)
        if [ -z "$pkg" ]; then
            bail "cannot resolve linux-image-amd64 and no cached kernel in $cache"
        fi
        echo "# apt cannot resolve linux-image-amd64; using cached $pkg" >&2
    fi
    kdir=$cache/kernels/$pkg
    [ -f "$kdir/.complete" ] && return 0

    dl=$cache/download.$$
    rm -rf "$dl" && mkdir -p "$dl"
    # apt-get download fails when the package lists are stale (the pool file
    # was replaced): update once and retry.
    if ! (cd "$dl" && apt-get download -q -o APT::Sandbox::User=root "$pkg" >&2); then
        apt-get update -qq >&2 || true
        (cd "$dl" && apt-get download -q -o APT::Sandbox::User=root "$pkg" >&2) ||
            { rm -rf "$dl"; bail "apt-get download $pkg failed"; }
    fi
    deb=$(ls "$dl"/*.deb)
    dpkg -x "$deb" "$dl/root" || { rm -rf "$dl"; bail "dpkg -x $deb failed"; }
    rm -rf "$kdir"
    mkdir -p "$cache/kernels"
    mv "$dl/root" "$kdir"
    basename "$deb" > "$kdir/.deb"
    touch "$kdir/.complete"
    rm -rf "$dl"
    # Older ABIs are dead weight once the archive has moved on.
    for old in "$cache/kernels"/*; do
        [ "$old" = "$kdir" ] || rm -rf "$old"
    done
}

# --- the initramfs ------------------------------------------------------------
# Two concatenated newc archives (the kernel unpacks them in turn): a cached
# base with busybox, the host binaries and their libraries, and the kernel
# modules; and a small per-run overlay with the guest script, the plugin under
# test and the fio jobs, so a rebuilt plugin is always the one tested.
# Uncompressed: TCG unpacks that faster than it inflates gzip.

# Programs the guest runs, from this machine (busybox covers the rest;
# stress-ng is the memory scenarios' hog, and diffutils' cmp compares what
# they read back several times faster than busybox's; ip (iproute2: netns,
# veth), qemu-nbd and nbd-server the remote scenario's; dpkg and the
# helpers it runs (dpkg-deb, dpkg-split, dpkg-query, GNU tar), with the
# ldconfig it wants on PATH, the deb scenario's; tc (netem) the
# remote_faults one's).
HOST_PROGRAMS="nbdkit nbd-client nbdinfo fio mkfs.ext4 e2fsck mkfs.xfs xfs_repair
  xfs_io fincore fstrim blockdev mount umount sfdisk systemctl udevadm jq losetup
  resize2fs xfs_growfs dmsetup stress-ng cmp ip qemu-nbd nbd-server
  dpkg dpkg-deb dpkg-split dpkg-query tar ldconfig ss tc"
# Modules to load; their dependencies are added from modinfo.  crc32c is
# needed by ext4 and xfs but is a soft dependency nobody declares.  loop:
# losetup is the ondemand scenario's comparison; dm_delay (with dmsetup):
# the crash scenario's slow storage; veth: the remote scenario's link;
# tls and the ciphers it asks the crypto API for (gcm, ctr and ghash for
# AES-GCM, chacha20poly1305 and its parts): the ktls scenario's kernel TLS
# (the guest has no modprobe, so the kernel cannot load them on demand as
# it does on Debian; the guest's qemu64 CPU has no AES-NI).
MODULES="virtio_pci virtio_blk nbd crc32c_generic ext4 xfs loop dm_mod dm_delay
  veth tls gcm ctr ghash_generic chacha20poly1305 chacha_generic
  poly1305_generic"
# inet_diag and tcp_diag: ss -tie shows a socket's TCP ULP (remote_tls)
# through them; without, ss reads /proc/net/tcp, which does not have it.
# sch_netem: remote_faults' lost packets.
MODULES="$MODULES inet_diag tcp_diag sch_netem"
# The systemd scenario boots systemd as init, as Debian does, with udev:
# the manager, systemctl, the fstab generator, udevd (udevadm under its
# other name) and the host's udev rules, and the unit files of the boot
# path it needs (everything else is left out: no getty, no journald).
SYSTEMD_FILES="/lib/systemd/systemd /lib/systemd/systemd-udevd
  /lib/systemd/system-generators/systemd-fstab-generator /usr/lib/os-release"
SYSTEMD_UNITS="multi-user.target basic.target sysinit.target sockets.target
  local-fs.target local-fs-pre.target slices.target timers.target
  paths.target swap.target umount.target shutdown.target
  systemd-udevd.service systemd-udev-trigger.service
  systemd-udevd-control.socket systemd-udevd-kernel.socket"
# Bump when the layout of the base archive changes.
BASE_FORMAT=4

nbdkit_plugindir=$(nbdkit --dump-config | sed -n 's/^plugindir=//p')

# Print "source destination" for every file the base archive holds.
base_files() {
    libs=$(mktemp)
    for p in $HOST_PROGRAMS; do
        path=$(command -v "$p") || { echo "missing program $p" >&2; return 1; }
        echo "$path $path"
        echo "$path" >> "$libs"
    done
    echo "$busybox_bin /usr/bin/busybox"
    # nbdkit's file plugin is the reference in the "reference" scenario.
    echo "$nbdkit_plugindir/nbdkit-file-plugin.so $nbdkit_plugindir/nbdkit-file-plugin.so"
    echo "$nbdkit_plugindir/nbdkit-file-plugin.so" >> "$libs"
    # The plugin under test goes in the overlay, but its libraries (liburing,
    # libc ...) belong here; pthread_cancel may dlopen libgcc_s.
    echo "$plugin" >> "$libs"
    # The same for pdio(1) (liburing, libnl-genl-3).
    echo "$pdio" >> "$libs"
    echo "$pdio_broken" >> "$libs"
    for f in $SYSTEMD_FILES; do
        echo "$f $f"
        case $f in *.so|*/systemd|*/systemd-*) echo "$f" >> "$libs" ;; esac
    done
    for u in $SYSTEMD_UNITS; do
        echo "/lib/systemd/system/$u /lib/systemd/system/$u"
    done
    for r in /lib/udev/rules.d/*.rules; do
        echo "$r $r"
    done
    # pdio serve dlopens GnuTLS for --tls (ldd cannot see it); its own
    # libraries come with nbd-client's, which links it.
    gnutls=$(ldconfig -p | awk '$1 == "libgnutls.so.30" && /x86-64/ { print $NF; exit }')
    [ -n "$gnutls" ] || { echo "missing libgnutls.so.30 (libgnutls30)" >&2; return 1; }
    echo "$gnutls $gnutls"
    echo "$gnutls" >> "$libs"
    # Under systemd, pdio's supervisor dlopens libsystemd (in a child) to
    # make its scope.
    libsystemd=$(ldconfig -p | awk '$1 == "libsystemd.so.0" && /x86-64/ { print $NF; exit }')
    [ -n "$libsystemd" ] || { echo "missing libsystemd.so.0 (libsystemd0)" >&2; return 1; }
    echo "$libsystemd $libsystemd"
    echo "$libsystemd" >> "$libs"
    for f in /usr/lib/x86_64-linux-gnu/libgcc_s.so.1 /etc/mke2fs.conf; do
        if [ -e "$f" ]; then echo "$f $f"; fi
    done
    while read -r bin; do
        ldd "$bin" | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }'
    done < "$libs" | sort -u | while read -r lib; do
        echo "$lib $lib"
    done
    rm -f "$libs"
}

# Print the .ko paths for $MODULES in load order (dependencies first), from
# each module's own "depends" field: Debian's package has no modules.dep.
module_order() {
    moddir=$1
    index=$(mktemp) graph=$(mktemp)
    find "$moddir/kernel" -name '*.ko*' |
        awk -F/ '{ n = $NF; sub(/\.ko.*$/, "", n); gsub(/-/, "_", n); print n, $0 }' > "$index"
    todo=$(echo "$MODULES" | tr '-' '_')
    visited=" "
    # shellcheck disable=SC2086 # $todo is a word list
    while set -- $todo && [ $# -gt 0 ]; do
        name=$1; shift; todo="$*"
        case $visited in *" $name "*) continue ;; esac
        visited="$visited$name "
        file=$(awk -v n="$name" '$1 == n { print $2; exit }' "$index")
        if [ -z "$file" ]; then
            # Built into the kernel: nothing to load.
            grep -q "/$name.ko" "$moddir/modules.builtin" 2>/dev/null ||
                { echo "module $name not found in $moddir" >&2; return 1; }
            continue
        fi
        deps=$(modinfo -F depends "$file" | tr ',-' ' _')
        echo "$name $file $deps" >> "$graph"
        todo="$todo $deps"
    done
    # Topological order: a module comes out once all its deps have.
    awk '{ file[$1] = $2; deps[$1] = ""; for (i = 3; i <= NF; i++) deps[$1] = deps[$1] " " $i; names[++n] = $1 }
        END {
            do {
                progress = 0
                for (i = 1; i <= n; i++) {
                    m = names[i]
                    if (m in out) continue
                    ready = 1
                    k = split(deps[m], ds, " ")
                    for (j = 1; j <= k; j++)
                        if ((ds[j] in file) && !(ds[j] in out)) ready = 0
                    if (ready) { print file[m]; out[m] = 1; progress = 1 }
                }
            } while (progress)
        }' "$graph"
    rm -f "$index" "$graph"
}

build_base() {
    out=$1 list=$2 mods=$3
    root=$(mktemp -d "$cache/base-root.XXXXXX")
    mkdir -p "$root/usr/bin" "$root/usr/sbin" "$root/usr/lib" "$root/usr/lib64" \
        "$root/proc" "$root/sys" "$root/dev" "$root/tmp" "$root/run" "$root/mnt" \
        "$root/scratch" "$root/etc" "$root/bb" "$root/modules" "$root/pdio"
    # Mirror the host's merged-/usr layout so ldd's paths resolve as they are.
    for d in bin sbin lib lib64; do
        if [ -L "/$d" ]; then
            ln -s "$(readlink "/$d")" "$root/$d"
        else
            mkdir -p "$root/$d"
        fi
    done
    while read -r src dst; do
        mkdir -p "$root$(dirname "$dst")"
        cp -L "$src" "$root$dst"
    done < "$list"
    # busybox applets in their own directory, last on the guest's PATH, so
    # the real programs above win.
    for a in $("$busybox_bin" --list); do
        ln -s /usr/bin/busybox "$root/bb/$a"
    done
    # /init is a "#!/bin/sh" script.
    ln -s busybox "$root/usr/bin/sh"
    n=0
    : > "$root/modules/order"
    while read -r ko; do
        n=$((n + 1))
        name=$(basename "$ko" | sed 's/\.ko.*$//')
        case $ko in
        *.ko) cp "$ko" "$root/modules/$name.ko" ;;
        *.ko.xz) xz -dc "$ko" > "$root/modules/$name.ko" ;;
        *.ko.zst) zstd -qdc "$ko" > "$root/modules/$name.ko" ;;
        *) echo "unsupported module file $ko" >&2; return 1 ;;
        esac
        echo "$name" >> "$root/modules/order"
    done < "$mods"
    (cd "$root" && find . | LC_ALL=C sort | cpio -o -H newc -R 0:0 --quiet) > "$out.tmp.$$"
    mv "$out.tmp.$$" "$out"
    rm -rf "$root"
}

# The tls scenario's credentials, made here (the guest has no certtool):
# a CA; the server's certificate for localhost and 127.0.0.1 in server/,
# as pdio serve --tls-certificates reads it; and two clients of that CA,
# alice (whose DN, in alice.dn, the scenario puts in --tls-authz) and bob.
make_tls_credentials() {
    d=$1
    mkdir -p "$d/server"
    (
        set -e
        cd "$d"
        umask 077
        certtool --generate-privkey --outfile ca-key.pem 2>/dev/null
        printf 'cn = pdio vm test CA\nca\ncert_signing_key\nexpiration_days = 2\n' > ca.info
        certtool --generate-self-signed --load-privkey ca-key.pem \
            --template ca.info --outfile ca-cert.pem 2>/dev/null
        for who in server alice bob; do
            certtool --generate-privkey --outfile "$who-key.pem" 2>/dev/null
            case $who in
            server) printf 'cn = localhost\ndns_name = localhost\nip_address = 127.0.0.1\ntls_www_server\n' ;;
            *) printf 'o = pdio tests\ncn = %s\ntls_www_client\n' "$who" ;;
            esac > "$who.info"
            printf 'encryption_key\nsigning_key\nexpiration_days = 2\n' >> "$who.info"
            certtool --generate-certificate --load-ca-certificate ca-cert.pem \
                --load-ca-privkey ca-key.pem --load-privkey "$who-key.pem" \
                --template "$who.info" --outfile "$who-cert.pem" 2>/dev/null
        done
        certtool -i --infile alice-cert.pem | sed -n 's/^[[:space:]]*Subject: //p' > alice.dn
        [ -s alice.dn ]
        cp ca-cert.pem server/ca-cert.pem
        mv server-cert.pem server-key.pem server/
        rm -f ca-key.pem ./*.info
    ) > /dev/null
}

# The deb scenario's packages, built as make deb builds them
# (dpkg-buildpackage on what make dist ships) into the cache, under the
# hash of that tree but its tests: once per run, and not again while the sources stay
# the same.  Prints "built|cached DIR", DIR holding the .debs.
build_debs() {
    # One builder of the cache at a time (this runs in a subshell: the
    # lock goes with it).
    exec 8>"$cache/.deb-lock"
    flock 8
    builddir=${PDIO_BUILDDIR:-$top}
    d=$work/deb-build
    rm -rf "$d" && mkdir -p "$d"
    name=pdio-vm-deb-$$
    make -s -C "$builddir" distdir distdir="$name" top_distdir="$name" > "$d/build.log" 2>&1 ||
        { cat "$d/build.log" >&2; return 1; }
    mv "$builddir/$name" "$d/src"
    # Not tests/: nothing of it is in the packages.
    key=$(cd "$d/src" && find . -type f ! -path './tests/*' | LC_ALL=C sort |
        xargs sha256sum | sha256sum | cut -c1-16)
    out=$cache/deb/$key
    if [ ! -f "$out/.complete" ]; then
        (cd "$d/src" && dpkg-buildpackage -us -uc -b) >> "$d/build.log" 2>&1 ||
            { tail -40 "$d/build.log" >&2; return 1; }
        rm -rf "$out" && mkdir -p "$out"
        mv "$d"/pdio_*.deb "$d"/nbdkit-plugin-pdio_*.deb "$out/"
        touch "$out/.complete"
        # Only the newest few trees' packages.
        ls -1td "$cache"/deb/*/ | tail -n +4 | xargs -r rm -rf
        deb_note=built
    else
        deb_note=cached
    fi
    rm -rf "$d"
    echo "$deb_note $out"
}

# The remote_tls scenario's: a CA, the certificate of 10.99.0.2 (the
# server's end of the veth pair) in server/ for pdio serve, the CA alone
# in client/ for pdio attach, another CA in other/, and PSK files (alice's
# key, and a wrong one of hers).  A bench run gets them too, for
# bench/kernel-guest.sh's remote rows.
make_remote_tls_credentials() {
    d=$1
    mkdir -p "$d/server" "$d/client" "$d/other"
    (
        set -e
        cd "$d"
        umask 077
        for ca in ca other-ca; do
            certtool --generate-privkey --outfile $ca-key.pem 2>/dev/null
            printf 'cn = pdio vm %s\nca\ncert_signing_key\nexpiration_days = 2\n' $ca > $ca.info
            certtool --generate-self-signed --load-privkey $ca-key.pem \
                --template $ca.info --outfile $ca-cert.pem 2>/dev/null
        done
        certtool --generate-privkey --outfile server/server-key.pem 2>/dev/null
        printf 'cn = storage1\ndns_name = storage1\nip_address = 10.99.0.2\ntls_www_server\nencryption_key\nsigning_key\nexpiration_days = 2\n' > server.info
        certtool --generate-certificate --load-ca-certificate ca-cert.pem \
            --load-ca-privkey ca-key.pem --load-privkey server/server-key.pem \
            --template server.info --outfile server/server-cert.pem 2>/dev/null
        cp ca-cert.pem server/ca-cert.pem
        cp ca-cert.pem client/ca-cert.pem
        cp other-ca-cert.pem other/ca-cert.pem
        psktool -u alice -p keys.psk > /dev/null
        psktool -u alice -p wrong.psk > /dev/null
        rm -f ./*-key.pem ./*.info ca-cert.pem other-ca-cert.pem
    ) > /dev/null
}

# --- set up the work directory --------------------------------------------------
if [ -n "$workdir" ]; then
    mkdir -p "$workdir"
    work=$(cd "$workdir" && pwd)
else
    work=$(mktemp -d "${TMPDIR:-/var/tmp}/pdio-vm.XXXXXX")
fi
qemu_pid=""
tail_pid=""
watch_pid=""
cleanup() {
    if [ -n "$tail_pid" ]; then kill "$tail_pid" 2>/dev/null || true; fi
    if [ -n "$watch_pid" ]; then kill "$watch_pid" 2>/dev/null || true; fi
    if [ -n "$qemu_pid" ]; then kill "$qemu_pid" 2>/dev/null || true; fi
    if [ "$keep" = 1 ]; then
        echo "# artefacts kept in $work" >&2
    elif [ "${failed:-1}" = 0 ]; then
        rm -rf "$work"
    else
        echo "# failed: artefacts kept in $work (console.log, results.log, guest-logs/)" >&2
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# The cache is shared by every clone on the machine: one builder at a time.
exec 9>"$cache/.lock"
flock 9

t0=$(now)
fetch_kernel
vmlinuz=$(ls "$kdir"/boot/vmlinuz-* | head -n 1)
moddir=$(ls -d "$kdir"/lib/modules/* | head -n 1)
kver=$(basename "$moddir")
t_kernel=$(($(now) - t0))

t0=$(now)
base_files > "$work/base.list" || bail "cannot collect the guest's binaries"
module_order "$moddir" > "$work/modules.list" || bail "cannot order modules"
[ -s "$work/modules.list" ] || bail "no modules found in $moddir"
key=$({
    echo "format=$BASE_FORMAT kernel=$kver harness=$(sha256sum < "$0")"
    cat "$work/modules.list"
    while read -r src dst; do
        echo "$dst $(stat -L -c '%s %Y' "$src")"
    done < "$work/base.list"
} | sha256sum | cut -c1-16)
base=$cache/initramfs/base-$key.cpio
if [ ! -f "$base" ]; then
    mkdir -p "$cache/initramfs"
    build_base "$base" "$work/base.list" "$work/modules.list" || bail "building the base initramfs failed"
    # Keep the few newest bases (other clones may be on other builds).
    ls -1t "$cache"/initramfs/base-*.cpio | tail -n +5 | xargs -r rm -f
    base_note="built"
else
    base_note="cached"
fi
cp "$base" "$work/initrd.cpio"
exec 9>&-

# The overlay: guest script, its scenarios and library (tests/lib), plugin
# under test, fio jobs, settings.
ov=$work/overlay
rm -rf "$ov" && mkdir -p "$ov/pdio/fio"
cp "$here/guest-init.sh" "$ov/init"
chmod 755 "$ov/init"
mkdir -p "$ov/pdio/scenarios" "$ov/pdio/lib"
cp "$here/scenarios/"*.sh "$ov/pdio/scenarios/"
if [ -n "$bench" ]; then
    cp -R "$bench" "$ov/pdio/bench"
    cp "$bench/guest.sh" "$ov/pdio/scenarios/bench.sh"
fi
cp "$top/tests/lib/"* "$ov/pdio/lib/"
cp "$plugin" "$ov/pdio/pdio.so"
mkdir -p "$ov/usr/bin" "$ov/pdio/broken"
# The test build is named pdio too: pdio knows its servers and itself by
# that name (comm), and mount.pdio runs it.
cp "$pdio_broken" "$ov/pdio/broken/pdio"
if [ -n "$break_list" ]; then
    cp "$pdio_broken" "$ov/usr/bin/pdio"
else
    cp "$pdio" "$ov/usr/bin/pdio"
fi
# mount(8) and umount(8) find the helpers in /sbin (/usr/sbin here,
# merged /usr).
mkdir -p "$ov/usr/sbin"
ln -s /usr/bin/pdio "$ov/usr/sbin/mount.pdio"
ln -s /usr/bin/pdio "$ov/usr/sbin/umount.pdio"
cp "$top/tests/fio/"*.fio "$ov/pdio/fio/"
# pdio's udev rule and the program it runs, where make install puts them
# (udev's directory, /lib/udev: /usr/lib/udev here, merged /usr).
mkdir -p "$ov/usr/lib/udev/rules.d"
cp "$top/src/cli/60-pdio.rules" "$ov/usr/lib/udev/rules.d/"
cp "$top/src/cli/pdio-name" "$ov/usr/lib/udev/"
deb_note=""
case ",$scenarios," in
*,deb,*)
    t1=$(now)
    debs=$(build_debs) || bail "cannot build the Debian packages for the deb scenario (make deb)"
    mkdir -p "$ov/pdio/deb"
    cp "${debs#* }"/*.deb "$ov/pdio/deb/"
    deb_note="$(cd "$ov/pdio/deb" && echo *.deb) (${debs%% *}, $(($(now) - t1))s)"
    ;;
esac
# The ktls scenario's test programs (GnuTLS, linked: in the base with
# nbd-client's libraries).
mkdir -p "$ov/pdio/bin"
case ",$scenarios," in
*,ktls,*)
    for t in protocol/test_ktls server/tls_keyupdate; do
        f=${PDIO_BUILDDIR:-$top}/tests/$t
        [ -x "$f" ] || bail "$f not found (make -C tests ${t})"
        cp "$f" "$ov/pdio/bin/"
    done ;;
esac
case ",$scenarios," in
*,tls,*|*,ktls,*) make_tls_credentials "$ov/pdio/tls" || bail "cannot make the tls scenario's certificates (certtool, package gnutls-bin)" ;;
esac
case ",$scenarios," in
*,remote_tls,*|,bench,) make_remote_tls_credentials "$ov/pdio/rtls" || bail "cannot make the remote_tls scenario's credentials (certtool, psktool: package gnutls-bin)" ;;
esac
{
    echo "SCENARIOS='$(echo "$scenarios" | tr ',' ' ')'"
    echo "FIO_SIZE='$fio_size'"
    echo "FILES='$files'"
    echo "MEM_CYCLES='$mem_cycles'"
    echo "SHELL_ONLY='$shell'"
    echo "PDIO_TEST_SERVER='$server'"
    echo "PDIO_TEST_BREAK='$break_list'"
    echo "HOST_NBDKIT_VERSION='$(nbdkit --version | awk '{print $2}')'"
} > "$ov/pdio/settings"
(cd "$ov" && find . | LC_ALL=C sort | cpio -o -H newc -R 0:0 --quiet) >> "$work/initrd.cpio"
t_initramfs=$(($(now) - t0))
tap_diag "kernel $kver ($(cat "$kdir/.deb" 2>/dev/null)), ${t_kernel}s to fetch/resolve"
tap_diag "initramfs $(($(stat -c %s "$work/initrd.cpio") / 1048576)) MiB (base $base_note), ${t_initramfs}s"
[ -z "$deb_note" ] || tap_diag "packages for the deb scenario: $deb_note"
if [ -n "$break_list" ]; then
    tap_diag "plugin under test: $plugin; pdio(1): $pdio_broken, breaking $break_list"
else
    tap_diag "plugin under test: $plugin; pdio(1): $pdio"
fi

# --- boot --------------------------------------------------------------------------
# A sparse scratch disk; the guest formats it and keeps its images on it, so
# the guest's O_DIRECT goes to a real (virtio) block device, not tmpfs.
# A second one with 4096-byte sectors for the sector4k scenario.
rm -f "$work/scratch.img" "$work/scratch4k.img"
truncate -s 8G "$work/scratch.img"
truncate -s 4G "$work/scratch4k.img"
: > "$work/console.log"
: > "$work/results.log"

# nowatchdog and the stall/hung-task knobs: TCG on a busy 2-core host is slow
# enough to trip lockup detectors, which say nothing about nbd; a real oops
# panics (oops=panic) and ends the run at once.  A larger kernel log: the
# memory scenarios read the OOM killer's reports from it.
append="console=ttyS0 panic=-1 oops=panic nowatchdog rcupdate.rcu_cpu_stall_suppress=1 random.trust_cpu=on log_buf_len=1M"
set -- qemu-system-x86_64 -nodefaults -no-user-config -machine pc \
    $accel_args -smp 2 -m 2048 \
    -kernel "$vmlinuz" -initrd "$work/initrd.cpio" -append "$append" \
    -display none -no-reboot \
    -drive "file=$work/scratch.img,if=none,id=scratch,format=raw,cache=unsafe" \
    -device virtio-blk-pci,drive=scratch,serial=pdio-scratch \
    -drive "file=$work/scratch4k.img,if=none,id=scratch4k,format=raw,cache=unsafe" \
    -device virtio-blk-pci,drive=scratch4k,serial=pdio-scratch4k,logical_block_size=4096,physical_block_size=4096

if [ "$shell" = 1 ]; then
    echo "# booting to a shell (scratch disk $work/scratch.img); poweroff -f to leave" >&2
    "$@" -serial stdio -serial "file:$work/results.log" -monitor none
    failed=0
    exit 0
fi

t0=$(now)
timeout -k 10 "$timeout" "$@" -monitor none \
    -serial "file:$work/console.log" -serial "file:$work/results.log" &
qemu_pid=$!
# What stops a hung guest is silence, not length: every step prints as it
# starts and bounds its own waits (the longest, memory-swap's, by 1200 s),
# and a loaded host stretches a TCG run by 2x or more, so a run that still
# reports is left to finish and one that has said nothing for $stall s is
# stopped.  --timeout is the cap beyond that.
(
    _w_last=-1 _w_quiet=0
    while kill -0 "$qemu_pid" 2>/dev/null; do
        sleep 10
        _w_size=$(($(stat -c %s "$work/console.log") + $(stat -c %s "$work/results.log")))
        if [ "$_w_size" = "$_w_last" ]; then _w_quiet=$((_w_quiet + 10)); else _w_quiet=0 _w_last=$_w_size; fi
        if [ "$_w_quiet" -ge "$stall" ]; then
            echo "$_w_quiet" > "$work/stalled"
            kill "$qemu_pid" 2>/dev/null || true
            exit 0
        fi
    done
) &
watch_pid=$!
if [ "$verbose" = 1 ]; then
    tail -n +1 -F "$work/console.log" >&2 2>/dev/null &
    tail_pid=$!
fi
qemu_rc=0
wait "$qemu_pid" || qemu_rc=$?
qemu_pid=""
kill "$watch_pid" 2>/dev/null || true
wait "$watch_pid" 2>/dev/null || true
watch_pid=""
stalled=""
[ ! -f "$work/stalled" ] || stalled="no output from the guest for $(cat "$work/stalled") s"
if [ -n "$tail_pid" ]; then kill "$tail_pid" 2>/dev/null || true; tail_pid=""; fi
t_guest=$(($(now) - t0))

# Pull the guest's own logs (nbdkit stderr, fio output, ...) off the scratch
# disk; debugfs reads the ext4 image without mounting it.
rm -rf "$work/guest-logs" && mkdir -p "$work/guest-logs"
debugfs -R "rdump /logs $work/guest-logs" "$work/scratch.img" >/dev/null 2>&1 || true

# --- judge the report ------------------------------------------------------------------
# The guest's results and figures pass through as they are, numbered as it
# numbered them; the plan comes last (the guest's plus this script's one).
res=$work/results.txt
tr -d '\r' < "$work/results.log" > "$res"
plan=$(sed -n 's/^1\.\.\([0-9][0-9]*\)$/\1/p' "$res" | head -n 1)
if [ -z "$plan" ]; then
    grep '^#' "$res" || true
    timed_out=""
    [ "$qemu_rc" != 124 ] || timed_out=": timeout after ${timeout}s"
    [ -z "$stalled" ] || timed_out=": $stalled"
    tap_result 1 "guest reported nothing (qemu exit $qemu_rc$timed_out)"
    tap_plan
    failed=1
else
    grep -E '^((not )?ok [0-9]+( |$)|#)' "$res" || true
    tap_n=$(sed -n 's/^\(not \)\{0,1\}ok \([0-9][0-9]*\).*/\2/p' "$res" | tail -n 1)
    tap_n=${tap_n:-0}
    tap_pass=$(grep -c '^ok [0-9]' "$res" || true)
    tap_fail=$(grep -c '^not ok [0-9]' "$res" || true)
    while [ "$tap_n" -lt "$plan" ]; do
        tap_result 1 "no result from the guest for step $((tap_n + 1))"
    done
    # What else must hold, as "; "-separated problems.
    problems=$(awk -v qemu_rc="$qemu_rc" -v timeout="$timeout" -v stalled="$stalled" \
        -v console="$work/console.log" '
function fail(msg) { problems = problems "; " msg }
/^1\.\.[0-9]+$/ { if (plan == "") plan = substr($0, 4) + 0; else fail("second plan line"); next }
/^(not )?ok [0-9]+( |$)/ {
    num = ($1 == "not") ? $3 : $2
    if (plan == "") fail("result before plan")
    if (num != last + 1) fail("result " num " out of order after " last)
    last = num
    if ($1 == "not") nfail++; else npass++
    next
}
/^#/ { next }
/^[0-9]+ passed, [0-9]+ failed$/ { summary = $0; sp = $1 + 0; sf = $3 + 0; next }
/^$/ { next }
{ fail("unexpected line from guest: " $0) }
END {
    # Kernel trouble on the console fails the run even if every step passed.
    while ((getline l < console) > 0) {
        if (l ~ /Kernel panic|Oops|BUG:|WARNING:|general protection fault|Call Trace:/ && !bad_console)
            bad_console = l
        if (l ~ /^pdio-guest: done/) done = 1
    }
    if (last > plan) fail("guest reported " last " results for a plan of " plan)
    if (stalled != "") fail(stalled)
    else if (qemu_rc == 124) fail("hard timeout after " timeout "s")
    else if (qemu_rc != 0) fail("qemu exited with status " qemu_rc)
    if (summary == "") fail("no final \"N passed, M failed\" line")
    else if (sp != npass || sf != nfail) fail("summary \"" summary "\" does not match the results")
    if (!done) fail("guest did not reach its clean poweroff")
    if (bad_console != "") fail("kernel trouble on the console: " bad_console)
    print substr(problems, 3)
}' "$res")
    summary=$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$res" | tail -n 1)
    if [ -z "$problems" ]; then
        tap_result 0 "guest ran to completion in ${t_guest}s: $summary, clean poweroff, no kernel errors"
    else
        tap_result 1 "guest run: $problems"
    fi
    tap_plan
    failed=0
    [ "$tap_fail" = 0 ] || failed=1
fi

tap_diag "wall time: kernel ${t_kernel}s, initramfs ${t_initramfs}s, guest ${t_guest}s, total $(($(now) - t_start))s"
if [ "$failed" = 1 ]; then
    # Enough context in the test log to diagnose without the artefacts.
    tap_diag "--- last 60 lines of the guest console ($work/console.log)"
    tail -n 60 "$work/console.log" | tr -d '\r' | sed 's/^/#   /'
fi
exit "$failed"
