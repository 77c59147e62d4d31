#!/bin/sh
# tests/vm/guest-init.sh — /init of the TCG guest booted by tests/vm/run.sh.
#
# Runs nbdkit (pdio.so, and nbdkit's file plugin as a reference) and the
# kernel nbd client inside the guest, on a unix socket, with the images on a
# virtio-blk scratch disk.  Prints TAP to /dev/ttyS1 (the host passes it
# on) with the emitter of tests/lib/tap.sh (/pdio/tap.sh here): a plan, one
# "ok N - ..." / "not ok N - ..." per step, "# ..." figures, and a final
# "N passed, M failed".  Everything else (commands and their output, kernel
# messages, and a copy of the TAP lines) goes to the console, /dev/ttyS0,
# and the scratch disk's /logs directory.
#
# Steps run one after another even when one fails (a failed attach makes the
# steps that need the device fail too), so a run always reports every step:
# hence set -u only at this level, and set -e inside each step.
set -u

export PATH=/usr/sbin:/usr/bin:/bb
export HOME=/root LC_ALL=C
# pdio(1) finds the plugin under test here.
export PDIO_PLUGIN=/pdio/pdio.so

# The systemd scenario execs systemd as init, which runs this script again
# from a unit (pdio-boot-check.service) with PDIO_GUEST_PHASE=systemd to
# finish the run: the machine is set up already then.
PHASE=${PDIO_GUEST_PHASE:-boot}
if [ "$PHASE" = boot ]; then
    mount -t proc proc /proc
    mount -t sysfs sysfs /sys
    mount -t devtmpfs devtmpfs /dev
    mount -t tmpfs tmpfs /tmp
    mount -t tmpfs tmpfs /run
    mkdir -p /dev/shm && mount -t tmpfs tmpfs /dev/shm
    exec < /dev/console > /dev/console 2>&1
fi

. /pdio/settings
. /pdio/tap.sh
# run.sh --break: /usr/bin/pdio is the test build (tests/vm/breaks.c),
# and this says what it breaks (see scenario_recover).
if [ -n "${PDIO_TEST_BREAK:-}" ]; then export PDIO_TEST_BREAK; fi
TAP_OUT=/dev/ttyS1
stty -F "$TAP_OUT" raw -echo 2>/dev/null

IMG_SIZE=$((1024 * 1024 * 1024))     # xfs wants at least 300 MiB
FRONT=nbdkit        # or native: see serve() and main()
RC_ATTACH_FLAGS=""  # pdio attach's front end in the recover scenarios
DEV=/dev/nbd0
MNT=/mnt
LOGS=/scratch/logs
# The tests' own state (tmpfs), kept apart from pdio's run directory, which
# they only read (pdio's records, nbdN.*).
STATE=/run/pdio-test
PDIO_RUN=/run/pdio
mkdir -p "$STATE"
# shellcheck disable=SC2034 # for tap.sh
TAP_DIR=$STATE
SOCK=$STATE/nbd.sock

log() { echo "pdio-guest: $*"; }
uptime_s() { cut -d' ' -f1 /proc/uptime | cut -d. -f1; }

poweroff_now() {
    sync
    log "done"
    poweroff -f
    sleep 60
}

# Load the modules run.sh put in dependency order (no depmod in the guest);
# the first step reports any that failed.  nbd with max_part so that
# partitions show (as modprobe nbd max_part=N would).
if [ "$PHASE" = boot ]; then
    : > "$STATE/insmod.failed"
    while read -r m; do
        args=""
        [ "$m" = nbd ] && args="max_part=15"
        # shellcheck disable=SC2086
        insmod "/modules/$m.ko" $args || echo "$m" >> "$STATE/insmod.failed"
    done < /modules/order

    # Neither soft lockups nor slow TCG I/O are what this test is about.
    echo 0 > /proc/sys/kernel/hung_task_timeout_secs 2>/dev/null
fi

if [ "$SHELL_ONLY" = 1 ]; then
    log "shell: scratch disks /dev/vda (512-byte sectors) and /dev/vdb (4096), unformatted; plugin /pdio/pdio.so, fio jobs /pdio/fio"
    setsid cttyhack sh
    poweroff_now
fi

# --- steps -------------------------------------------------------------------------
# main() is run twice: a dry pass (TAP_DRY=1) that only counts steps (for the
# plan), then the real one.  Each step body runs in a subshell with set -e
# (tap_case), so any failing command fails the step; state that outlives a
# step lives in $STATE.
step() {
    desc=$1; shift
    # The scenarios name nbdkit; under FRONT=native the server is pdio's own.
    if [ "$FRONT" = native ]; then
        desc="native: $(echo "$desc" | sed 's/nbdkit pdio\.so/pdio serve/; s/nbdkit exits/pdio serve exits/')"
    fi
    tap_case "$desc" "$@"
}

# --- helpers used inside step bodies ------------------------------------------------

# Resolve the plugin to test ("pdio" or "file") to what nbdkit takes.
plugin_path() {
    case $1 in
    pdio) echo /pdio/pdio.so ;;
    file) echo file ;;
    esac
}

# serve TAG PLUGIN IMAGE [ARGS...]: a fresh sparse image and a server in
# the foreground under a wrapper that records its exit status: nbdkit with
# PLUGIN, or, for PLUGIN pdio with FRONT=native, pdio's own server (pdio
# serve) with the plugin's parameters as its options.  (The wrapper's files
# keep their nbdkit.* names for either.)
serve() {
    tag=$1 plugin=$2 img=$3; shift 3
    [ "$FRONT" = native ] && [ "$plugin" = pdio ] && tag=native-$tag
    rm -f "$img" "$SOCK" "$STATE/nbdkit.rc" "$STATE/nbdkit.pid"
    truncate -s "$IMG_SIZE" "$img"
    echo "$tag" > "$STATE/tag"
    echo "$img" > "$STATE/img"
    if [ "$FRONT" = native ] && [ "$plugin" = pdio ]; then
        opts=""
        for a in "$@"; do
            case $a in
            align=*) opts="$opts --align ${a#align=}" ;;
            backend=*) opts="$opts --backend ${a#backend=}" ;;
            *) echo "pdio serve has no equivalent of $a"; return 1 ;;
            esac
        done
        log "pdio serve --socket $SOCK$opts $img"
        # shellcheck disable=SC2086
        sh -c 'sock=$1 pidfile=$2 rcfile=$3 img=$4; shift 4
               pdio serve --socket "$sock" "$@" "$img" & echo $! > "$pidfile"
               wait $!; echo $? > "$rcfile"' \
            pdio-wrapper "$SOCK" "$STATE/nbdkit.pid" "$STATE/nbdkit.rc" "$img" $opts \
            > "$LOGS/nbdkit-$tag.log" 2>&1 &
        ready() { grep -q '^uri: ' "$LOGS/nbdkit-$tag.log"; }
    else
        log "nbdkit -f -U $SOCK $(plugin_path "$plugin") file=$img $*"
        # shellcheck disable=SC2086
        sh -c 'sock=$1 pidfile=$2 rcfile=$3; shift 3
               nbdkit -f -U "$sock" -P "$pidfile" "$@"; echo $? > "$rcfile"' \
            nbdkit-wrapper "$SOCK" "$STATE/nbdkit.pid" "$STATE/nbdkit.rc" \
            "$(plugin_path "$plugin")" "file=$img" "$@" \
            2> "$LOGS/nbdkit-$tag.log" &
        ready() { [ -S "$SOCK" ]; }
    fi
    wait_until 30 serving
    nbdinfo --no-content --json "nbd+unix:///?socket=$SOCK" > "$STATE/info.json"
    cat "$STATE/info.json"
    min=$(sed -n 's/.*"block_size_minimum": *\([0-9]*\).*/\1/p' "$STATE/info.json")
    pref=$(sed -n 's/.*"block_size_preferred": *\([0-9]*\).*/\1/p' "$STATE/info.json")
    mc=$(sed -n 's/.*"can_multi_conn": *\([a-z]*\).*/\1/p' "$STATE/info.json")
    trim=$(sed -n 's/.*"can_trim": *\([a-z]*\).*/\1/p' "$STATE/info.json")
    if [ -z "$pref" ]; then
        # pdio must advertise it; nbdkit's file plugin does not.
        [ "$plugin" = pdio ] && { echo "no block_size_preferred advertised"; return 1; }
        pref=512
    fi
    # The preferred size is pdio's direct-I/O alignment: the smallest
    # logical block the kernel may use.
    echo "$pref" > "$STATE/dioblock"
    detail "advertises block sizes minimum ${min:-none}, preferred $pref, multi-conn $mc, trim $trim"
    if [ "$plugin" = pdio ]; then
        # The contract: pdio advertises minimum 1 (any offset), multi-conn
        # and trim.
        [ "$min" = 1 ] && [ "$mc" = true ] && [ "$trim" = true ]
    fi
}

# For wait_until: the server is ready; the step fails if it has exited.
serving() {
    ready && return 0
    [ -f "$STATE/nbdkit.rc" ] || return 1
    cat "$LOGS/nbdkit-$tag.log"
    exit 1
}

# attach BLOCKSIZE CONNECTIONS [FLAG...]: the kernel client, netlink mode
# (the default) unless a FLAG says -nonetlink.
attach() {
    bs=$1 conns=$2
    shift 2
    nbd-client -unix "$SOCK" "$DEV" -b "$bs" -C "$conns" "$@"
    wait_until 10 nbd0_sized
    size=$(($(cat /sys/block/nbd0/size) * 512))
    lbs=$(cat /sys/block/nbd0/queue/logical_block_size)
    nbd-client -c "$DEV"
    detail "/dev/nbd0 $((size / 1048576)) MiB, logical block $lbs, $conns connection(s)"
    [ "$size" = "$IMG_SIZE" ] && [ "$lbs" = "$bs" ]
}

detach() {
    # nbd-client -d succeeds on an idle device too: insist on a connection.
    [ -f /sys/block/nbd0/pid ] || { echo "/dev/nbd0 is not connected"; return 1; }
    nbd-client -d "$DEV"
    wait_until 10 nbd0_unsized
}
nbd0_sized() { [ "$(cat /sys/block/nbd0/size)" != 0 ]; }
nbd0_unsized() { [ "$(cat /sys/block/nbd0/size)" = 0 ]; }

mounted() { grep -q " $MNT " /proc/mounts; }

# mnt_write_files COUNT, mnt_verify_files COUNT: tap.sh's, on $MNT.
mnt_write_files() {
    mounted
    write_files "$MNT" "$1" "$STATE/sums"
    echo "$files_kib" > "$STATE/files_kib"
}

mnt_verify_files() { verify_files "$MNT" "$1" "$STATE/sums"; }

fs_make() {
    fs=$1
    case $fs in
    ext4) mkfs.ext4 -F -q "$DEV" ;;
    xfs) mkfs.xfs -f -q "$DEV" ;;
    esac
    # noinit_itable: no background inode-table zeroing racing the test.
    case $fs in
    ext4) mount -t ext4 -o noinit_itable "$DEV" "$MNT" ;;
    xfs) mount -t xfs "$DEV" "$MNT" ;;
    esac
}

fs_check() {
    fs=$1
    umount "$MNT"
    case $fs in
    ext4) e2fsck -fn "$DEV" ;;
    xfs) xfs_repair -n "$DEV" ;;
    esac
    # Drop /dev/nbd0's own cache so what follows reads through the server.
    blockdev --flushbufs "$DEV"
}

fs_remount_verify() {
    fs=$1
    mount -t "$fs" "$DEV" "$MNT"
    mnt_verify_files "$FILES"
}

# Delete the files, fstrim, and see the image's allocation shrink: the trims
# reached the image as holes.
fs_trim() {
    mounted
    img=$(cat "$STATE/img")
    before=$(du -k "$img" | cut -f1)
    rm -rf "${MNT:?}"/*
    sync
    fstrim -v "$MNT"
    sync
    after=$(du -k "$img" | cut -f1)
    files_kib=$(cat "$STATE/files_kib")
    holes=$(xfs_io -r -c 'seek -a -r 0' "$img" | grep -c HOLE || true)
    detail "image allocation $before KiB -> $after KiB, $holes holes"
    # At least half of the deleted file data must have left the image.
    [ $((before - after)) -ge $((files_kib / 2)) ]
}

fs_umount_detach() {
    umount "$MNT"
    detach
}

# dev_fio_pass ENGINE MODE: tap.sh's fio_pass with tests/fio/verify.fio on
# /dev/nbd0.
dev_fio_pass() {
    engine=$1 mode=$2 tag=$(cat "$STATE/tag")
    fio_pass "$mode" "$LOGS/fio-$tag-$mode.txt" \
        "verify.fio, $engine, $FIO_JOBS jobs x $FIO_SIZE, iodepth 16" \
        --ioengine="$engine" --filename="$DEV" /pdio/fio/verify.fio
}

# The image a server has been serving: only that one's figure means
# anything.  (No "a && b" mid-function: set -e ignores a failure on its
# left.)
served_img() {
    img=$(cat "$STATE/img")
    [ -f "$STATE/nbdkit.pid" ] || { echo "no server has served $img"; return 1; }
    echo "$img"
}

# pdio must leave no page of the image in the page cache.
served_fincore_zero() {
    img=$(served_img)
    fincore_pages "$img" > "$STATE/fincore.pdio.$(cat "$STATE/tag")"
    fincore_zero "$img"
}

# The file plugin reference: a figure, not a pass condition.
fincore_reference() {
    img=$(served_img)
    pages=$(fincore_pages "$img")
    detail "fincore: $pages pages ($((pages * 4 / 1024)) MiB) of $img resident [reference figure, not a pass condition]"
}

stop_server() {
    tag=$(cat "$STATE/tag")
    log="$LOGS/nbdkit-$tag.log"
    kill -TERM "$(cat "$STATE/nbdkit.pid")"
    wait_until 30 test -f "$STATE/nbdkit.rc" || { echo "nbdkit did not exit"; return 1; }
    rc=$(cat "$STATE/nbdkit.rc")
    cat "$log"
    # Debian 12's nbdkit 1.32.5 can abort when a client hangs up with replies
    # queued (fixed upstream in 1.33.10); say so precisely, still a failure.
    if nbdkit_send_abort "$log" "$HOST_NBDKIT_VERSION"; then
        detail "nbdkit $HOST_NBDKIT_VERSION aborted in raw_send_socket (known nbdkit 1.32.4-1.33.9 server bug)"
        return 1
    fi
    server_log_clean "$rc" "$log"
}

# --- scenario building blocks ------------------------------------------------------

attach_advertised() { attach "$(cat "$STATE/dioblock")" "$1"; }

fs_round_trip() {   # fs_round_trip LABEL FS
    label=$1 fs=$2
    step "$label: mkfs.$fs on /dev/nbd0 and mount" fs_make "$fs"
    step "$label: write files of random data, record checksums" mnt_write_files "$FILES"
    case $fs in
    ext4) step "$label: unmount, e2fsck -fn clean" fs_check ext4 ;;
    xfs) step "$label: unmount, xfs_repair -n clean" fs_check xfs ;;
    esac
    step "$label: remount, every checksum verified" fs_remount_verify "$fs"
}

fio_round_trip() {  # fio_round_trip LABEL ENGINE
    step "$1: fio random writes, verify=crc32c with verify_backlog, zero errors" dev_fio_pass "$2" write
    step "$1: fio read-only verify pass (--verify_only), zero errors" dev_fio_pass "$2" verify
}

server_end() {      # server_end LABEL (after detach)
    step "$1: fincore on the image after the run: 0 pages resident" served_fincore_zero
    step "$1: nbdkit exits cleanly after SIGTERM, no errors logged" stop_server
}

scenario_ext4() {
    step "ext4: nbdkit pdio.so serving disk.img on a unix socket" serve ext4 pdio /scratch/disk.img
    step "ext4: nbd-client attaches /dev/nbd0 (netlink, -b advertised preferred)" attach_advertised 1
    fs_round_trip ext4 ext4
    step "ext4: fstrim after deleting the files punches holes in the image" fs_trim
    step "ext4: unmount, nbd-client -d detaches" fs_umount_detach
    server_end ext4
}

# The ioctl interface, as older setups and some containers attach: nbd-client
# stays behind as the process that runs NBD_DO_IT for the device.
attach_ioctl() {
    attach "$(cat "$STATE/dioblock")" 1 -nonetlink
    pid=$(cat /sys/block/nbd0/pid)
    detail "ioctl mode: the device is served by nbd-client pid $pid ($(cat "/proc/$pid/comm"))"
    [ "$(cat "/proc/$pid/comm")" = nbd-client ]
}

scenario_ioctl() {
    step "ioctl: nbdkit pdio.so serving disk.img on a unix socket" serve ioctl pdio /scratch/disk.img
    step "ioctl: nbd-client -nonetlink attaches /dev/nbd0 (-b advertised preferred)" attach_ioctl
    fs_round_trip ioctl ext4
    step "ioctl: unmount, nbd-client -d detaches" fs_umount_detach
    server_end ioctl
}

scenario_xfs() {
    step "xfs: nbdkit pdio.so serving disk.img on a unix socket" serve xfs pdio /scratch/disk.img
    step "xfs: nbd-client attaches /dev/nbd0 with 2 connections (-C 2, multi-conn)" attach_advertised 2
    fs_round_trip xfs xfs
    step "xfs: fstrim after deleting the files punches holes in the image" fs_trim
    step "xfs: unmount, nbd-client -d detaches" fs_umount_detach
    server_end xfs
}

scenario_fio() {
    step "fio: nbdkit pdio.so serving disk.img on a unix socket" serve fio pdio /scratch/disk.img
    step "fio: nbd-client attaches /dev/nbd0 with 2 connections (-C 2)" attach_advertised 2
    fio_round_trip fio io_uring
    step "fio: nbd-client -d detaches" detach
    server_end fio
}

# The image's direct-I/O alignment is 4096 while /dev/nbd0 keeps 512-byte
# logical blocks: the case losetup --direct-io=on silently runs buffered.
scenario_align4096() {
    step "align4096: nbdkit pdio.so align=4096 serving disk.img" serve align4096 pdio /scratch/disk.img align=4096
    step "align4096: the advertised preferred block size is 4096" sh -c '[ "$(cat '"$STATE"'/dioblock)" = 4096 ]'
    step "align4096: nbd-client attaches with 512-byte blocks anyway (-b 512 -C 2)" attach 512 2
    fs_round_trip align4096 ext4
    step "align4096: unmount" umount "$MNT"
    fio_round_trip align4096 libaio
    step "align4096: nbd-client -d detaches" detach
    server_end align4096
}

# A 4096-byte-sector (4Kn) disk: pdio.so must find the 4096-byte direct-I/O
# alignment by itself (no align=) and still serve 512-byte nbd blocks.
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
fe_attach_4kn() {
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
    step "sector4k: 4096-byte-sector virtio disk formatted and mounted" sector4k_setup
    step "sector4k: nbdkit pdio.so (no align=) serving disk.img on the 4Kn disk" serve sector4k pdio /scratch4k/disk.img
    step "sector4k: the advertised preferred block size is 4096, found by pdio" sh -c '[ "$(cat '"$STATE"'/dioblock)" = 4096 ]'
    step "sector4k: nbd-client attaches with 512-byte blocks (-b 512 -C 2)" attach 512 2
    fio_round_trip sector4k io_uring
    step "sector4k: nbd-client -d detaches" detach
    server_end sector4k
    step "sector4k: pdio attach gives the kernel 4096-byte blocks, pdio list shows DIO-ALIGN 4096" fe_attach_4kn
    step "sector4k: the 4Kn scratch filesystem unmounts and e2fsck -fn is clean" sector4k_check
}

# The same ext4 and fio workload through nbdkit's own file plugin, for the
# page-cache comparison.
scenario_reference() {
    step "reference: nbdkit file plugin serving disk-ref.img" serve reference file /scratch/disk-ref.img
    step "reference: nbd-client attaches /dev/nbd0 (-b 512)" attach 512 1
    fs_round_trip reference ext4
    step "reference: unmount" umount "$MNT"
    fio_round_trip reference io_uring
    step "reference: nbd-client -d detaches" detach
    step "reference: fincore on the file plugin's image" fincore_reference
    step "reference: nbdkit exits cleanly after SIGTERM" stop_server
}

# --- pdio(1), the command-line interface ----------------------------------------------
# pdio attach/list/detach as a user runs them: the plugin from $PDIO_PLUGIN,
# state in pdio's own run directory, $PDIO_RUN (nbdN.*: read here, never
# written).  The image is a fresh sparse file.
FE_IMG=/scratch/fe.img
FE_IMG2=/scratch/fe2.img
FE_SIZE=$((256 * 1024 * 1024))
FE_FILES=60

fe_dev() { cat "$STATE/fe.dev"; }
fe_idx() { d=$(fe_dev); echo "${d#/dev/nbd}"; }
# The pid of the server pdio's record names.
fe_pid() { sed -n 's/^server_pid=//p' "$PDIO_RUN/nbd$(fe_idx).rec"; }
# No pdio state (nbdN.sock/.pid/.rec/.log) left in $PDIO_RUN.
fe_no_state() {
    left=$(ls "$PDIO_RUN" | grep '^nbd[0-9]' || true)
    [ -z "$left" ] || { echo "left in $PDIO_RUN: $left"; return 1; }
}
# Process $1 has exited: gone, or a zombie.  A server whose parent died
# (an interrupted attach's) is this shell's child, and the shell (PID 1)
# reaps it only at its next wait, after pdio has already seen it exit.
proc_gone() {
    st=$(sed -n 's/^.*) \(.\).*/\1/p' "/proc/$1/stat" 2>/dev/null || true)
    [ -z "$st" ] || [ "$st" = Z ]
}
# The pids of servers: nbdkit, or pdio's own (comm "pdio": pdio serve is
# the only pdio process that outlives a command; the guest's busybox has
# no pgrep).  Zombies are not servers.
server_pids() {
    for c in /proc/[0-9]*/comm; do
        case $(cat "$c" 2>/dev/null) in
        nbdkit|pdio) p=${c%/comm}; p=${p#/proc/}; proc_gone "$p" || echo "$p" ;;
        esac
    done
}
# The pids of (live) processes whose comm is $1.
comm_pids() {
    for c in /proc/[0-9]*/comm; do
        if [ "$(cat "$c" 2>/dev/null)" = "$1" ]; then
            p=${c%/comm}; p=${p#/proc/}; proc_gone "$p" || echo "$p"
        fi
    done
}
# No server process at all, and no supervisor either.
fe_no_server() {
    left=$(server_pids)
    [ -z "$left" ] || { echo "a server is still running: $left"; return 1; }
    left=$(comm_pids pdio-supervise)
    [ -z "$left" ] || { echo "pdio-supervise still running: $left"; return 1; }
}
fe_connected() { [ -f "/sys/block/nbd$1/pid" ]; }
fe_disconnected() { ! fe_connected "$1"; }
# Nothing of pdio left: no state, no server, no supervisor.
fe_nothing_left() {
    [ -z "$(ls "$PDIO_RUN" | grep '^nbd[0-9]' || true)" ] &&
        [ -z "$(server_pids)" ] && [ -z "$(comm_pids pdio-supervise)" ]
}

fe_attach() {
    rm -f "$FE_IMG" "$FE_IMG2"
    truncate -s "$FE_SIZE" "$FE_IMG"
    truncate -s "$FE_SIZE" "$FE_IMG2"
    echo "$FE_IMG" > "$STATE/img"
    echo fe > "$STATE/tag"
    pdio attach "$FE_IMG" > "$STATE/fe.dev"
    cat "$STATE/fe.dev"
    i=$(fe_idx)
    fe_connected "$i"
    size=$(($(cat "/sys/block/nbd$i/size") * 512))
    lbs=$(cat "/sys/block/nbd$i/queue/logical_block_size")
    queues=$(ls "/sys/block/nbd$i/mq" | wc -l)
    pid=$(fe_pid)
    detail "$(fe_dev), $((size / 1048576)) MiB, pdio attach chose logical block $lbs, $queues connection(s), server pid $pid"
    case $(fe_dev) in /dev/nbd[0-9]*) ;; *) return 1 ;; esac
    [ "$size" = "$FE_SIZE" ]
    [ "$lbs" = 512 ]
    [ "$queues" = 1 ]                          # one connection by default
    [ "$(cat "/proc/$pid/comm")" = pdio ]      # pdio's own server by default
}

# The columns of the text and the fields of the JSON, against the facts.
fe_list() {
    pdio list > "$STATE/fe.list"
    cat "$STATE/fe.list"
    pid=$(fe_pid)
    head -n 1 "$STATE/fe.list" | grep -q '^NAME  *IMAGE  *RO  *CONNS  *BLOCK-SIZE  *DIO-ALIGN  *PID  *RESTARTS  *CACHED  *SIZE  *STATUS$'
    [ "$(wc -l < "$STATE/fe.list")" = 2 ]
    set -- $(sed -n 2p "$STATE/fe.list")
    [ "$1 $2 $3 $4 $5 $6 $7 $8 $9 ${10} ${11}" = "$(fe_dev) $FE_IMG 0 1 512 512 $pid 0 0 $FE_SIZE ok" ]
    pdio list --json > "$STATE/fe.json"
    cat "$STATE/fe.json"
    for kv in "\"name\": \"$(fe_dev)\"" "\"back-file\": \"$FE_IMG\"" '"ro": false' \
              '"connections": 1' '"timeout": 0' '"block-size": 512' '"dio-align": 512' \
              "\"size\": $FE_SIZE" "\"pid\": $pid" '"cached": 0' '"status": "ok"' \
              '"restarts": 0' '"reason": null'; do
        grep -qF "$kv" "$STATE/fe.json" || { echo "JSON lacks $kv"; return 1; }
    done
    head -n 2 "$STATE/fe.json" | tr -d ' \n' | grep -q '^{"nbddevices":\[$'
    # It parses (jq), with the front end and the memory of a live server
    # and supervisor (null where pdio list could not read them).
    jq -e --arg dev "$(fe_dev)" --arg img "$FE_IMG" --argjson pid "$pid" '
        .nbddevices | length == 1 and (.[0] |
            .name == $dev and ."back-file" == $img and .pid == $pid and
            ."front-end" == "pdio" and .supervisor > 0 and
            ."server-rss" > 0 and ."server-pss" > 0 and
            ."supervisor-rss" > 0 and ."supervisor-pss" > 0)' \
        "$STATE/fe.json" > /dev/null || { echo "jq: not the device's JSON"; return 1; }
    detail "text and JSON rows match the device, image, pid and 0 bytes cached; the JSON parses and gives the server's and supervisor's memory"
}

# What an idle device costs, as pdio list --json reports it: once the
# filesystem work is over, its server and supervisor hold at most 4 MiB
# of PSS together, and the server pins its reserve and nothing more: its
# one worker's 2 MiB pool chunk, registered (VmPin) and locked with the
# chunk's two pages of allocator bookkeeping (VmLck), so that the first
# write after idle allocates nothing.  A bound, polled until it holds (the
# server gives the rest of its pool back 5 s after its last request;
# ext4 may still write for a while after mount), never a timing.  Fails
# with run.sh --break no-reserve (VmPin 0 kB until the deadline).
FE_RESERVE_PIN_KB=2048
FE_RESERVE_LCK_KB=$((FE_RESERVE_PIN_KB + 8))
fe_idle_memory() {
    pid=$(fe_pid)
    end=$(($(uptime_s) + 300))
    while :; do
        pdio list --json > "$STATE/fe-mem.json"
        set -- $(jq -r '.nbddevices[0] | [."server-pss", ."supervisor-pss",
                        ."server-rss", ."supervisor-rss"] | map(tostring) |
                        join(" ")' "$STATE/fe-mem.json")
        for v in "$@"; do
            case $v in
            ''|*[!0-9]*) echo "not a byte count: $v"; cat "$STATE/fe-mem.json"; return 1 ;;
            esac
        done
        pin=$(awk '/^VmPin:/ { print $2 }' "/proc/$pid/status")
        lck=$(awk '/^VmLck:/ { print $2 }' "/proc/$pid/status")
        total=$(($1 + $2))
        [ "$total" -gt $((4 << 20)) ] || [ "$pin" != $FE_RESERVE_PIN_KB ] ||
            [ "$lck" != $FE_RESERVE_LCK_KB ] || break
        if [ "$(uptime_s)" -ge "$end" ]; then
            echo "after 300 s: PSS server $1 + supervisor $2 = $total bytes, VmPin $pin kB (want $FE_RESERVE_PIN_KB), VmLck $lck kB (want $FE_RESERVE_LCK_KB)"
            return 1
        fi
        sleep 2
    done
    detail "idle device: PSS server $1 + supervisor $2 = $total bytes (RSS $3, $4), server VmPin $pin kB and VmLck $lck kB: its reserve"
}

# Attaching the same image again is refused by the image's claim, by its
# path and through a hard link (another path, same file), naming the
# device and the supervisor that holds it; nbdkit pdio on it directly by
# the engine's lock, which names the server.  Nothing is left over.
fe_double() {
    pid=$(fe_pid)
    rc=0; pdio attach "$FE_IMG" 2> "$STATE/fe.err" || rc=$?
    cat "$STATE/fe.err"
    [ "$rc" = 1 ]
    grep -q "already attached to $(fe_dev)" "$STATE/fe.err"
    # A hard link is the same image (its identity, not its path): the
    # image's claim refuses it, naming the device and the supervisor.
    sup=$(sed -n 's/^supervisor_pid=//p' "$PDIO_RUN/nbd$(fe_idx).rec")
    ln -f "$FE_IMG" /scratch/fe-link.img
    rc=0; pdio attach /scratch/fe-link.img 2> "$STATE/fe.err" || rc=$?
    cat "$STATE/fe.err"
    [ "$rc" = 1 ]
    grep -qF "already attached to $(fe_dev) by pid $sup" "$STATE/fe.err"
    rm -f /scratch/fe-link.img
    rc=0; nbdkit -U /tmp/fe-direct.sock /pdio/pdio.so file="$FE_IMG" --run true \
        2> "$STATE/fe.err" || rc=$?
    cat "$STATE/fe.err"
    [ "$rc" != 0 ]
    grep -q "is in use: pid $pid (pdio)" "$STATE/fe.err"
    # Still exactly one server and one device; no second record.
    [ "$(server_pids)" = "$pid" ]
    [ "$(ls "$PDIO_RUN"/*.rec | wc -l)" = 1 ]
    detail "refused: again and via a hard link (the image's claim, naming supervisor $sup), and by nbdkit pdio (naming server $pid)"
}

fe_fs() {
    mkfs.ext4 -F -q "$(fe_dev)"
    mount -t ext4 -o noinit_itable "$(fe_dev)" "$MNT"
    mnt_write_files "$FE_FILES"
    umount "$MNT"
    blockdev --flushbufs "$(fe_dev)"
    mount -t ext4 "$(fe_dev)" "$MNT"
    mnt_verify_files "$FE_FILES"
}

fe_detach_mounted() {
    rc=0; pdio detach "$(fe_dev)" 2> "$STATE/fe.err" || rc=$?
    cat "$STATE/fe.err"
    [ "$rc" = 1 ]
    grep -q "is mounted on $MNT" "$STATE/fe.err"
    fe_connected "$(fe_idx)"
    mounted
    detail "refused with: $(cat "$STATE/fe.err")"
}

fe_detach() {
    pid=$(fe_pid)
    umount "$MNT"
    pdio detach "$(fe_dev)"
    # (No "! cmd" here: set -e ignores it.)
    if fe_connected "$(fe_idx)"; then echo "still connected"; return 1; fi
    proc_gone "$pid"
    fe_no_state
    fe_no_server
    pages=$(fincore_pages "$FE_IMG")
    detail "server $pid gone, no state left, fincore: $pages pages of $FE_IMG resident"
    [ "$pages" = 0 ]
}

# Reattach at once (the lock of the server just stopped must be gone),
# plus a second image read-only with one connection; then --all.
fe_detach_all() {
    d1=$(pdio attach "$FE_IMG")
    d2=$(pdio attach --nbdkit --read-only --connections 1 "$FE_IMG2")
    pdio list
    i1=${d1#/dev/nbd} i2=${d2#/dev/nbd}
    p2=$(sed -n 's/^server_pid=//p' "$PDIO_RUN/nbd$i2.rec")
    [ "$(cat "/proc/$p2/comm")" = nbdkit ]
    [ "$(cat "/sys/block/nbd$i2/ro")" = 1 ]
    [ "$(ls "/sys/block/nbd$i2/mq" | wc -l)" = 1 ]
    pdio list | grep -q "^$d2  *$FE_IMG2  *1  *1 "
    pdio detach --all
    if fe_connected "$i1" || fe_connected "$i2"; then echo "still connected"; return 1; fi
    fe_no_state
    fe_no_server
    detail "$d1 (pdio's server) and $d2 (--nbdkit, read-only, 1 connection) attached and detached with --all"
}

# --force detaches a mounted device (read-only here, so unmounting it
# afterwards writes nothing): server and state go at once, the kernel
# lets go of the device when it is unmounted.
fe_detach_force() {
    d=$(pdio attach "$FE_IMG")
    i=${d#/dev/nbd}
    mount -t ext4 -o ro "$d" "$MNT"
    pid=$(sed -n 's/^server_pid=//p' "$PDIO_RUN/nbd$i.rec")
    pdio detach --force "$d"
    proc_gone "$pid"
    fe_no_state
    fe_no_server
    umount "$MNT"
    wait_until 10 fe_disconnected "$i" || { echo "$d still connected after umount"; return 1; }
    detail "$d detached while mounted; released after umount"
}

# The device is connected, then attach fails (the test build's break
# point fail-after-connect, tests/vm/breaks.c): attach must disconnect the
# device and stop the server it started, and leave no supervisor.
fe_failed_attach() {
    rc=0
    PDIO_TEST_BREAK=fail-after-connect /pdio/broken/pdio attach "$FE_IMG" 2> "$STATE/fe.err" || rc=$?
    cat "$STATE/fe.err"
    [ "$rc" = 1 ]
    grep -q "injected failure" "$STATE/fe.err"
    for b in /sys/block/nbd*; do
        [ ! -f "$b/pid" ] || { echo "$b still connected"; return 1; }
    done
    fe_no_state
    fe_no_server
    detail "exit status 1, no device connected, no nbdkit, no state left"
}

# A connection that dies while attach is still at work (the test build's
# link-dead-at-attach shuts the first one down right before attach
# becomes the supervisor): the kernel sends its LINK_DEAD once, so the
# supervisor must have been listening since before the connect, and hands
# the device a fresh connection.  A write and its read-back then work,
# with no I/O error.  Shown to fail with events-late added (the
# supervisor subscribing once it runs, as it used to): the event is
# missed and the write fails when the default 60 s dead-connection
# timeout ends (run.sh --break events-late: the global break list is
# added here).
FE_LD_IMG=/scratch/ld.img
fe_link_dead() {
    rm -f "$FE_LD_IMG"
    truncate -s 64M "$FE_LD_IMG"
    kmsg_reset
    d=$(PDIO_TEST_BREAK=link-dead-at-attach${PDIO_TEST_BREAK:+,$PDIO_TEST_BREAK} /pdio/broken/pdio attach "$FE_LD_IMG") ||
        { echo "attach failed"; return 1; }
    head -c 1048576 /dev/urandom > "$STATE/fe.ld"
    rc=0
    dd if="$STATE/fe.ld" of="$d" bs=1M seek=3 oflag=direct conv=fsync status=none || rc=$?
    dd if="$d" of="$STATE/fe.ld.back" bs=1M skip=3 count=1 iflag=direct status=none || rc=$?
    cp "$PDIO_RUN/${d#/dev/}.supervisor.log" "$STATE/fe.ld.log"
    grep "a connection of\|died" "$STATE/fe.ld.log" || true
    dmesg | grep nbd || true
    errs=$(nbd_io_errors)
    fresh=$(grep -c "a connection of $d died with the server alive: handed it a fresh one" "$STATE/fe.ld.log" || true)
    pdio detach "$d"
    detail "$d: dd exit $rc; supervisor: $fresh fresh connection(s); kernel I/O errors $errs"
    [ "$rc" = 0 ]
    cmp "$STATE/fe.ld" "$STATE/fe.ld.back"
    cmp -n 1048576 "$STATE/fe.ld" "$FE_LD_IMG" 0 3145728
    [ "$fresh" -ge 1 ]
    [ "$errs" = 0 ]
    fe_no_state
    fe_no_server
    rm -f "$FE_LD_IMG"
}

# attach killed between NBD_CMD_CONNECT and its record (the test build's
# break point die-after-connect: SIGKILL, as from the OOM killer) leaves
# the device connected with its server and no record: an orphan.  pdio
# list must show it with the way out, an attach of the image be refused
# naming it (the orphan's server holds the image), pdio restart and
# resize be refused saying what to do, and pdio detach clean
# it up like a recorded device -- by device, by image and with --all:
# device disconnected, server gone, no supervisor, nothing in the run
# directory, fincore 0.
fe_make_orphan() {
    rc=0
    PDIO_TEST_BREAK=die-after-connect /pdio/broken/pdio attach "$FE_IMG" 2> "$STATE/fe.err" || rc=$?
    cat "$STATE/fe.err"
    [ "$rc" = 1 ] || { echo "attach exited with $rc"; return 1; }
    d=
    for b in /sys/block/nbd*; do
        [ ! -f "$b/pid" ] || d=/dev/${b##*/}
    done
    [ -n "$d" ] || { echo "no device left connected"; return 1; }
    grep -q "^pdio:[0-9]*:[0-9]*:[0-9]*:$FE_IMG\$" "/sys/block/${d#/dev/}/backend"
    [ ! -e "$PDIO_RUN/${d#/dev/}.rec" ] || { echo "$d has a record"; return 1; }
    [ -z "$(comm_pids pdio-supervise)" ] || { echo "a supervisor runs"; return 1; }
    echo "$d" > "$STATE/fe.orphan"
}
fe_orphan_gone() {
    d=$1 pid=$2
    if fe_connected "${d#/dev/nbd}"; then echo "$d still connected"; return 1; fi
    proc_gone "$pid" || { echo "server $pid still runs"; return 1; }
    fe_no_state
    fe_no_server
    left=$(ls "$PDIO_RUN" | grep -v '^lock$' || true)
    [ -z "$left" ] || { echo "left in $PDIO_RUN: $left"; return 1; }
    [ "$(fincore_pages "$FE_IMG")" = 0 ]
}
fe_orphan() {
    fe_make_orphan
    d=$(cat "$STATE/fe.orphan")
    pid=$(server_pids)
    [ -n "$pid" ] || { echo "no server left by the killed attach"; return 1; }
    want="no record: attach was interrupted; pdio detach $d"
    pdio list | tee "$STATE/fe.list"
    grep -q "^$d  *$FE_IMG  .* $pid  .* $want\$" "$STATE/fe.list"
    pdio list --json > "$STATE/fe.json"
    [ "$(jq -r --arg d "$d" '.nbddevices[] | select(.name == $d) | .status' "$STATE/fe.json")" = "$want" ]
    [ "$(jq -r --arg d "$d" '.nbddevices[] | select(.name == $d) | .pid' "$STATE/fe.json")" = "$pid" ]
    rc=0; pdio attach "$FE_IMG" 2> "$STATE/fe.err" || rc=$?
    cat "$STATE/fe.err"
    [ "$rc" = 1 ]
    grep -qF "$FE_IMG: already connected to $d by an attach that was interrupted before it recorded it (pdio detach $d)" "$STATE/fe.err"
    # restart and resize need a record: refused, saying what to do.
    for c in restart resize; do
        rc=0; pdio $c "$d" 2> "$STATE/fe.err" || rc=$?
        cat "$STATE/fe.err"
        [ "$rc" = 1 ] || { echo "pdio $c exited with $rc"; return 1; }
        grep -qF "pdio $c: $d: connected by an attach that was interrupted before it recorded it; pdio detach $d, then attach again" "$STATE/fe.err"
    done
    [ "$(server_pids)" = "$pid" ] || { echo "servers: $(server_pids), expected $pid alone"; return 1; }
    pdio detach "$d"
    fe_orphan_gone "$d" "$pid"
    # By the image, and with --all.
    fe_make_orphan
    d2=$(cat "$STATE/fe.orphan") pid2=$(server_pids)
    pdio detach "$FE_IMG"
    fe_orphan_gone "$d2" "$pid2"
    fe_make_orphan
    d3=$(cat "$STATE/fe.orphan") pid3=$(server_pids)
    pdio detach --all
    fe_orphan_gone "$d3" "$pid3"
    detail "$d (server $pid) listed, attach, restart and resize refused, detached by device; again by image ($d2) and --all ($d3): nothing left, fincore 0"
}

# --- what keeps a device's processes going under memory pressure ----------------
# The supervisor sets PR_SET_IO_FLUSHER and oom_score_adj -1000 before it
# starts a server, which inherits both (and sets the flag again itself);
# both live in a cgroup of their own, /pdio.slice/pdio-SUPERVISOR, with
# memory.min 4 MiB (the slice's the sum).  Checked from /proc and
# against pdio list --json, after attach, after pdio restart and after a
# SIGKILL (the supervisor's restart), with either server; the test build
# without them (no-io-flusher, no-oom-adjust) must be caught by the same
# check.  A program the supervisor runs has neither
# (child-keeps-protection must be caught).
FP_IMG=/scratch/fp.img
FP_BIN=/tmp/fp-bin

# PR_SET_IO_FLUSHER's flags on every thread of process $1 (field 9 of
# /proc/PID/task/TID/stat: PF_MEMALLOC_NOIO 0x80000, PF_LOCAL_THROTTLE
# 0x100000): all, none or some.
flusher_of() {
    all=1 none=1
    for t in /proc/"$1"/task/*/stat; do
        f=$(sed 's/^.*) //' "$t" 2>/dev/null | cut -d' ' -f7)
        [ -n "$f" ] || continue
        case $((f & 0x180000)) in
        $((0x180000))) none=0 ;;
        0) all=0 ;;
        *) all=0 none=0 ;;
        esac
    done
    if [ $all = 1 ]; then echo all; elif [ $none = 1 ]; then echo none; else echo some; fi
}

cgroup_of() { sed -n 's/^0:://p' "/proc/$1/cgroup" 2>/dev/null; }

# The server pid the record of device index $1 names.
fp_server() { sed -n 's/^server_pid=//p' "$PDIO_RUN/nbd$1.rec"; }

# cgroup v2 at /sys/fs/cgroup, as on the machines pdio runs on (this
# guest's init mounts none): placement needs it.
fp_cgroup2() {
    grep -q ' /sys/fs/cgroup cgroup2 ' /proc/mounts ||
        mount -t cgroup2 none /sys/fs/cgroup
}

# Device index $1: its server and supervisor have every protection and
# live in cgroup $2 ("own": /pdio.slice/pdio-SUPERVISOR, with memory.min
# 4 MiB), and pdio list --json says so.  What was seen goes to
# $STATE/fp.seen.
fp_check() {
    rec=$PDIO_RUN/nbd$1.rec
    server=$(sed -n 's/^server_pid=//p' "$rec")
    sup=$(sed -n 's/^supervisor_pid=//p' "$rec")
    want=$2
    [ "$want" != own ] || want=/pdio.slice/pdio-$sup
    sf=$(flusher_of "$server") pf=$(flusher_of "$sup")
    so=$(cat "/proc/$server/oom_score_adj") po=$(cat "/proc/$sup/oom_score_adj")
    scg=$(cgroup_of "$server") pcg=$(cgroup_of "$sup")
    min=$(cat "/sys/fs/cgroup$scg/memory.min" 2>/dev/null || echo none)
    smin=$(cat /sys/fs/cgroup/pdio.slice/memory.min 2>/dev/null || echo 0)
    pdio list --json > "$STATE/fp.json"
    js=$(jq -c --arg dev "/dev/nbd$1" '.nbddevices[] | select(.name == $dev) |
        [.io_flusher, .oom_score_adj, .cgroup, .status]' "$STATE/fp.json")
    echo "server $server ($(cat "/proc/$server/comm"), $(ls "/proc/$server/task" | wc -l) threads): IO_FLUSHER on $sf, oom_score_adj $so, cgroup $scg (memory.min $min); supervisor $sup: $pf, $po, $pcg; pdio.slice memory.min $smin; pdio list: $js" > "$STATE/fp.seen"
    cat "$STATE/fp.seen"
    [ "$sf" = all ] && [ "$pf" = all ] && [ "$so" = -1000 ] && [ "$po" = -1000 ] &&
        [ "$scg" = "$want" ] && [ "$pcg" = "$want" ] &&
        [ "$js" = "[true,-1000,\"$want\",\"ok\"]" ] &&
        { [ "$2" != own ] || { [ "$min" = 4194304 ] && [ "$smin" -ge 4194304 ]; }; }
}

# The record of device index $1 names a live server other than pid $2.
fp_new_server() {
    p=$(fp_server "$1")
    [ -n "$p" ] && [ "$p" != 0 ] && [ "$p" != "$2" ] && [ -d "/proc/$p/task" ] &&
        ! proc_gone "$p"
}

fe_protect() {
    fp_cgroup2
    rm -f "$FP_IMG"
    truncate -s 64M "$FP_IMG"
    seen=""
    for fe in pdio nbdkit; do
        flags=""
        [ $fe = pdio ] || flags=--nbdkit
        # shellcheck disable=SC2086
        d=$(pdio attach $flags "$FP_IMG")
        i=${d#/dev/nbd}
        sup=$(sed -n 's/^supervisor_pid=//p' "$PDIO_RUN/nbd$i.rec")
        fp_check "$i" own
        seen="$seen $fe: $(cat "$STATE/fp.seen")."
        s=$(fp_server "$i")
        pdio restart "$d"
        fp_check "$i" own
        s2=$(fp_server "$i")
        kill -KILL "$s2"
        wait_until 60 fp_new_server "$i" "$s2" || { echo "no new server after SIGKILL"; return 1; }
        fp_check "$i" own
        seen="$seen After pdio restart ($s -> $s2) and a SIGKILL ($s2 -> $(fp_server "$i")): the same."
        pdio detach "$d"
        [ ! -d "/sys/fs/cgroup/pdio.slice/pdio-$sup" ] ||
            { echo "pdio.slice/pdio-$sup left after detach"; return 1; }
    done
    # (fp_check sets smin too: the broken attach below would clobber it.)
    left_min=$(cat /sys/fs/cgroup/pdio.slice/memory.min)
    # The same check must catch the test build without the protections.
    d=$(PDIO_TEST_BREAK=no-io-flusher,no-oom-adjust /pdio/broken/pdio attach "$FP_IMG")
    i=${d#/dev/nbd}
    caught=no
    fp_check "$i" own > /dev/null || caught=yes
    broken=$(cat "$STATE/fp.seen")
    pdio detach "$d"
    fe_no_state
    fe_no_server
    detail "$seen Detached: cgroups removed, pdio.slice memory.min $left_min. Test build with no-io-flusher,no-oom-adjust: caught: $caught ($broken)"
    [ "$left_min" = 0 ]
    [ "$caught" = yes ]
}

# --slice none: the caller's cgroup, the protections all the same.
fe_slice_none() {
    d=$(pdio attach --slice none "$FP_IMG")
    i=${d#/dev/nbd}
    mine=$(cgroup_of $$)
    fp_check "$i" "$mine"
    pdio detach "$d"
    fe_no_state
    detail "$(cat "$STATE/fp.seen"); this shell's cgroup: $mine"
}

# A program the supervisor runs is no part of the I/O path: it has
# neither the flag nor -1000.  The supervisor runs udevadm settle for
# --autoclear where udev runs (/run/udev/control): a stand-in, first in
# PATH, records its own field 9 and oom_score_adj and its parent's (the
# supervisor, before it starts a server).  $@: the pdio to run (and
# how).
fp_udevadm() {
    rm -f "$STATE/udevadm.seen"
    d=$(PATH=$FP_BIN:$PATH "$@" attach --autoclear "$FP_IMG")
    pdio detach "$d" >&2
    cat "$STATE/udevadm.seen"
}

fe_child_unprotected() {
    mkdir -p "$FP_BIN" /run/udev
    {
        echo '#!/bin/sh'
        echo 'f() { sed "s/^.*) //" "/proc/$1/stat" | cut -d" " -f7; }'
        echo "echo \"\$(f \$\$) \$(cat /proc/\$\$/oom_score_adj) \$(f \$PPID) \$(cat /proc/\$PPID/oom_score_adj)\" > $STATE/udevadm.seen"
    } > "$FP_BIN/udevadm"
    chmod 755 "$FP_BIN/udevadm"
    cat "$FP_BIN/udevadm"
    fake=no
    [ -e /run/udev/control ] || { : > /run/udev/control; fake=yes; }
    # shellcheck disable=SC2046
    set -- $(fp_udevadm pdio)
    good="udevadm: flags $(printf %#x "$1"), oom_score_adj $2; its parent, the supervisor: flags $(printf %#x "$3"), oom_score_adj $4"
    ok=no
    if [ $(($1 & 0x180000)) = 0 ] && [ "$2" = 0 ] &&
        [ $(($3 & 0x180000)) = $((0x180000)) ] && [ "$4" = -1000 ]; then ok=yes; fi
    # shellcheck disable=SC2046
    set -- $(fp_udevadm env PDIO_TEST_BREAK=child-keeps-protection /pdio/broken/pdio)
    bad="udevadm: flags $(printf %#x "$1"), oom_score_adj $2"
    caught=yes
    if [ $(($1 & 0x180000)) = 0 ] && [ "$2" = 0 ]; then caught=no; fi
    [ $fake = no ] || rm -f /run/udev/control
    rm -rf "$FP_BIN"
    fe_no_state
    detail "$good; test build with child-keeps-protection: $bad, caught: $caught"
    [ $ok = yes ]
    [ $caught = yes ]
}

scenario_cli() {
    step "cli: pdio attach prints the device, 512-byte blocks, 1 connection" fe_attach
    step "cli: pdio list and list --json show it" fe_list
    step "cli: a second attach of the image is refused, by any path, naming the holder" fe_double
    step "cli: mkfs.ext4, mount, write files, remount, every checksum verified" fe_fs
    step "cli: idle, server + supervisor within 4 MiB PSS, the server's reserve pinned and nothing more (pdio list --json)" fe_idle_memory
    step "cli: pdio detach of the mounted device is refused" fe_detach_mounted
    step "cli: unmount, pdio detach: device, server and state gone, fincore 0" fe_detach
    step "cli: reattach at once plus a read-only image, pdio detach --all" fe_detach_all
    step "cli: pdio detach --force of a mounted device" fe_detach_force
    step "cli: a failed attach leaves no device, no server, no supervisor, no state" fe_failed_attach
    step "cli: a connection that dies during attach gets a fresh one from the supervisor: write and read back, no I/O error" fe_link_dead
    step "cli: an attach killed after the connect: list shows the device, attach refused naming it, detach (device, image, --all) leaves nothing; restart and resize refused" fe_orphan
    step "cli: server and supervisor (pdio's, nbdkit) with PR_SET_IO_FLUSHER on every thread, oom_score_adj -1000, in /pdio.slice/pdio-SUP (memory.min 4 MiB), after attach, pdio restart and a SIGKILL; the test build without them is caught" fe_protect
    step "cli: pdio attach --slice none: the caller's cgroup, the protections all the same" fe_slice_none
    step "cli: a program the supervisor runs (udevadm) has neither PR_SET_IO_FLUSHER nor -1000; the test build's that keeps them is caught" fe_child_unprotected
}

# --- the device outlives its server ------------------------------------------------
# pdio attach leaves a supervisor that restarts a dead server and hands the
# device fresh connections (NBD_CMD_RECONFIGURE); requests in flight are
# resent once the request timeout (--timeout) expires, so the filesystem
# sees a pause of about that long, not an error.  A short --timeout keeps
# the pauses (and this scenario) short.
#
# Each test was shown to fail against a deliberately broken pdio:
# run.sh --break LIST runs the test build with PDIO_TEST_BREAK=LIST
# (tests/vm/breaks.c):
#   no-restart            the supervisor records a death but starts no new
#                         server: the SIGKILL, SIGABRT and restart tests
#                         fail (fio errors, no new server, pdio restart
#                         times out)
#   no-give-up            the supervisor never gives up: "cannot come back"
#                         fails (pdio list never says failed)
#   server-exits-with-supervisor  the server runs as nbdkit -f
#                         --exit-with-parent under the supervisor, so it
#                         dies with it: "supervisor killed" fails (fio
#                         errors, then the device fails)
#   no-autoclear          mount.pdio does not arm autoclear: the mount
#                         helper test fails (device, server left after
#                         umount)
#   no-partscan           attach does not read the partition table: the
#                         partitions test fails (no nbdNp1)
#   no-take-over          pdio restart refuses a device whose supervisor
#                         is gone: "supervisor killed" fails (no new
#                         supervisor, the killed server stays dead)
#   no-udev-settle        pdio attach --autoclear arms autoclear without
#                         waiting for udev's probe: the systemd scenario's
#                         autoclear test fails (the probe detaches it)
#   no-umount-helper      mount.pdio does not mark its mounts helper=pdio,
#                         so umount(8) does not wait for the cleanup: the
#                         mount helper test and the systemd scenario's
#                         shutdown-order test fail
RC_IMG=/scratch/rc.img
RC_SIZE=$((256 * 1024 * 1024))
RC_TIMEOUT=8        # kernel request timeout: the pause at a restart
RC_DEAD=40          # dead-connection timeout
RC_FIO_SIZE=${RC_FIO_SIZE:-4m}

rc_dev() { cat "$STATE/rc.dev"; }
rc_idx() { d=$(rc_dev); echo "${d#/dev/nbd}"; }
# rc_field KEY: the value in the device's pdio record.
rc_field() { sed -n "s/^$1=//p" "$PDIO_RUN/nbd$(rc_idx).rec"; }
# I/O errors the kernel logged for nbd devices since kmsg_reset (which
# empties the ring buffer, so that a full buffer cannot hide new lines; the
# console keeps everything).
nbd_io_errors() { dmesg | grep -c 'I/O error.*nbd\|nbd.*I/O error' || true; }
kmsg_reset() { dmesg -c > /dev/null; }

rc_attach() {
    rm -f "$RC_IMG"
    truncate -s "$RC_SIZE" "$RC_IMG"
    echo "$RC_IMG" > "$STATE/img"
    # shellcheck disable=SC2086
    pdio attach $RC_ATTACH_FLAGS --timeout "$RC_TIMEOUT" --dead-timeout "$RC_DEAD" "$RC_IMG" > "$STATE/rc.dev"
    mkfs.ext4 -F -q "$(rc_dev)"
    mount -t ext4 -o noinit_itable "$(rc_dev)" "$MNT"
    mkdir -p "$MNT/fio"
    sup=$(rc_field supervisor_pid)
    detail "$(rc_dev), server pid $(rc_field server_pid), supervisor pid $sup ($(cat "/proc/$sup/comm")), timeout $RC_TIMEOUT s, dead-connection timeout $RC_DEAD s"
    [ "$(cat "/proc/$sup/comm")" = pdio-supervise ]
    # The front end asked for: pdio's own server, or nbdkit with --nbdkit.
    want=pdio; [ "$RC_ATTACH_FLAGS" = --nbdkit ] && want=nbdkit
    [ "$(cat "/proc/$(rc_field server_pid)/comm")" = "$want" ]
}

# fio in a loop (each run writes and verifies its own files) until
# $STATE/rc.stop exists; one JSON output per run, failures in rc.fiofail.
rc_fio_loop() {
    tag=$1
    rm -f "$STATE/rc.stop" "$STATE/rc.fiofail" "$STATE/rc.fioruns"
    (
        i=0
        while [ ! -f "$STATE/rc.stop" ]; do
            i=$((i + 1))
            FIO_DIR=$MNT/fio FIO_SIZE=$RC_FIO_SIZE fio --output-format=json \
                --output="$LOGS/fio-rc-$tag-$i.json" /pdio/fio/recover.fio ||
                echo "run $i: exit $?" >> "$STATE/rc.fiofail"
        done
        echo "$i" > "$STATE/rc.fioruns"
    ) &
    echo $! > "$STATE/rc.fiopid"
}

# The largest completion latency (ms) and the error count over the runs'
# JSON outputs of tag.
rc_fio_figures() {
    tag=$1
    cat "$LOGS"/fio-rc-$tag-*.json | awk '
        /"clat_ns"/ { inclat = 1 }
        inclat && /"max"/ { gsub(/[^0-9]/, "", $3); if ($3 + 0 > max) max = $3 + 0; inclat = 0 }
        /"error" *:/ { v = $3; gsub(/[^0-9]/, "", v); errs += v }
        /"total_err"/ { v = $3; gsub(/[^0-9]/, "", v); errs += v }
        END { printf "%d %d\n", max / 1000000, errs }'
}

# A probe beside fio: one 4 KiB O_DIRECT write to a file on the mounted
# filesystem every 0.1 s, each logged as "start end" (uptime, 10 ms
# resolution).  The longest write spanning a replacement is the pause the
# filesystem saw at it.
rc_probe() {
    rm -f "$STATE/rc.probe" "$STATE/rc.kills"
    dd if=/dev/zero of="$MNT/probe" bs=4096 count=1 oflag=direct 2>/dev/null
    (
        while [ ! -f "$STATE/rc.stop" ]; do
            a=$(cut -d' ' -f1 /proc/uptime)
            dd if=/dev/zero of="$MNT/probe" bs=4096 count=1 oflag=direct conv=notrunc 2>/dev/null ||
                echo "probe write failed" >> "$STATE/rc.fiofail"
            b=$(cut -d' ' -f1 /proc/uptime)
            echo "$a $b" >> "$STATE/rc.probe"
            sleep 0.1
        done
    ) &
    echo $! > "$STATE/rc.probepid"
}

# The pause at each replacement (uptime in rc.kills): the longest probe
# write that ended after it and began at most 1 s after it (the next
# replacement is at least 2 s later), in ms.  Requests already in flight
# at the death wait longer, until the request timeout resends them: fio's
# largest completion latency shows that.
rc_pauses() {
    awk 'NR == FNR { k[++n] = $1; next }
         { for (i = 1; i <= n; i++) if ($2 >= k[i] && $1 <= k[i] + 1 && $2 - $1 > p[i]) p[i] = $2 - $1 }
         END { for (i = 1; i <= n; i++) printf "%d ", p[i] * 1000 }' \
        "$STATE/rc.kills" "$STATE/rc.probe"
}

# For wait_until: the record counts RESTARTS and names a live server other
# than OLD, $new.
rc_replaced() {
    new=$(rc_field server_pid)
    [ "$(rc_field restarts)" = "$1" ] && [ -n "$new" ] && [ "$new" != 0 ] &&
        [ "$new" != "$2" ] && [ -d "/proc/$new" ]
}

# rc_replace HOW N: replace the server N times at random moments (2..5 s
# apart) while fio runs; each time wait for the supervisor's new server.
rc_replace() {
    how=$1 count=$2
    kmsg_reset; errs0=0
    r0=$(rc_field restarts)
    rc_fio_loop "$how"
    rc_probe
    k=0
    while [ $k -lt "$count" ]; do
        sleep $(($(od -An -N1 -tu1 /dev/urandom) % 4 + 2))
        old=$(rc_field server_pid)
        # (kill 0 would signal this test's own process group.)
        case $old in ''|0) echo "no server to replace (server_pid=$old)"; touch "$STATE/rc.stop"; return 1 ;; esac
        t0=$(date +%s)
        cut -d' ' -f1 /proc/uptime >> "$STATE/rc.kills"
        case $how in
        kill) kill -KILL "$old" ;;
        abort) kill -ABRT "$old" ;;
        restart) pdio restart "$(rc_dev)" ;;
        esac
        k=$((k + 1))
        wait_until 60 rc_replaced $((r0 + k)) "$old" ||
            { echo "no new server 60 s after $how $k"; touch "$STATE/rc.stop"; return 1; }
        log "$how $k: server $old -> $new in $(($(date +%s) - t0)) s"
    done
    # Let fio run on the last new server a little, then end the loop.
    sleep 3
    touch "$STATE/rc.stop"
    wait "$(cat "$STATE/rc.fiopid")" 2>/dev/null || true
    wait "$(cat "$STATE/rc.probepid")" 2>/dev/null || true
    wait_until 300 test -f "$STATE/rc.fioruns" || { echo "fio loop did not end"; return 1; }
    pdio list
    pdio list --json > "$STATE/rc.json"
    cat "$STATE/rc.json"
    grep "pdio-supervise" "$PDIO_RUN/nbd$(rc_idx).supervisor.log" | tail -n "$count" || true
    handed=$(grep -o 'died\|[0-9]* ms after' "$PDIO_RUN/nbd$(rc_idx).supervisor.log" |
        grep ms | tail -n "$count" | sed 's/ ms after//' | tr '\n' ' ')
    set -- $(rc_fio_figures "$how")
    maxlat=$1 fioerrs=$2
    errs=$(($(nbd_io_errors) - errs0))
    restarts=$(rc_field restarts)
    reason=$(rc_field reason)
    runs=$(cat "$STATE/rc.fioruns")
    pauses=$(rc_pauses)
    tap_diag "$how x$count: filesystem paused ${pauses}ms at the replacements (probe writes); supervisor handed over new connections ${handed}ms after each death; fio $runs runs, $fioerrs errors, max completion latency ${maxlat} ms; kernel I/O errors: $errs"
    detail "restarts $r0 -> $restarts (last: $reason); pauses ${pauses}ms; new connections after ${handed}ms; fio: $runs runs, $fioerrs errors, max latency $maxlat ms; kernel I/O errors $errs"
    [ ! -s "$STATE/rc.fiofail" ] || { cat "$STATE/rc.fiofail"; return 1; }
    [ "$fioerrs" = 0 ]
    [ "$errs" = 0 ]
    [ "$restarts" = $((r0 + count)) ]
    grep -q "\"restarts\": $restarts" "$STATE/rc.json"
    case $how in
    kill) [ "$reason" = "server killed by SIGKILL" ] ;;
    abort) case $reason in "server killed by SIGABRT"*) ;; *) return 1 ;; esac ;;
    # pdio's own server hands its connections over (scenario handover);
    # nbdkit is killed and replaced.
    restart) if [ "$RC_ATTACH_FLAGS" = --nbdkit ]; then
                 [ "$reason" = "pdio restart" ]
             else
                 [ "$reason" = "pdio restart: live connections handed over" ]
             fi ;;
    esac
}

rc_fsck() {
    umount "$MNT"
    e2fsck -fn "$(rc_dev)"
    mount -t ext4 "$(rc_dev)" "$MNT"
}

# The supervisor is killed: the device keeps working (a fio run), list
# says so; pdio restart starts a new supervisor, which replaces the server
# and then restarts it when it is killed; pdio detach still cleans up
# everything.
rc_supervisor_killed() {
    sup=$(rc_field supervisor_pid)
    server=$(rc_field server_pid)
    kill -KILL "$sup"
    sleep 1
    kmsg_reset; errs0=0
    FIO_DIR=$MNT/fio FIO_SIZE=$RC_FIO_SIZE fio --output-format=json \
        --output="$LOGS/fio-rc-unsupervised-1.json" /pdio/fio/recover.fio
    set -- $(rc_fio_figures unsupervised)
    fioerrs=$2
    pdio list | tee "$STATE/rc.list"
    grep -q "ok, unsupervised" "$STATE/rc.list"
    # A new supervisor, and a server of its own.
    r0=$(rc_field restarts)
    pdio restart "$(rc_dev)"
    sup2=$(rc_field supervisor_pid) server2=$(rc_field server_pid)
    [ "$(cat "/proc/$sup2/comm")" = pdio-supervise ]
    [ "$sup2" != "$sup" ]
    [ "$server2" != "$server" ]
    [ -d "/proc/$server2" ]
    [ "$(rc_field restarts)" = $((r0 + 1)) ]
    [ "$(rc_field reason)" = "pdio restart (its supervisor was gone)" ]
    pdio list | tee "$STATE/rc.list"
    grep -q " ok" "$STATE/rc.list"
    if grep -q unsupervised "$STATE/rc.list"; then return 1; fi
    # ... which it supervises: killed, it comes back, and I/O goes on.
    kill -KILL "$server2"
    wait_until 30 rc_replaced $((r0 + 2)) "$server2" ||
        { echo "the new supervisor did not restart its server"; return 1; }
    server3=$new
    dd if=/dev/urandom of="$MNT/after-take-over" bs=64k count=16 2>/dev/null
    sync
    sum=$(md5sum < "$MNT/after-take-over")
    umount "$MNT"
    e2fsck -fn "$(rc_dev)"
    mount -t ext4 "$(rc_dev)" "$MNT"
    [ "$(md5sum < "$MNT/after-take-over")" = "$sum" ]
    umount "$MNT"
    pdio detach "$(rc_dev)"
    if fe_connected "$(rc_idx)"; then echo "still connected"; return 1; fi
    proc_gone "$server"
    proc_gone "$server3"
    proc_gone "$sup2"
    fe_no_state
    fe_no_server
    detail "supervisor $sup killed: fio $fioerrs errors; pdio restart: supervisor $sup2, server $server -> $server2, killed -> $server3 (restarts $r0 -> $(($r0 + 2))); kernel I/O errors $(($(nbd_io_errors) - errs0)); detach left no server, no supervisor, no state"
    [ "$fioerrs" = 0 ] && [ "$(nbd_io_errors)" = "$errs0" ]
}

# The image is removed, then the server killed: the supervisor cannot
# bring it back, gives up and says why; reads fail within the timeouts
# instead of hanging; pdio detach cleans up.
rc_cannot_come_back() {
    img=/scratch/gone.img
    rm -f "$img"
    truncate -s 64M "$img"
    d=$(pdio attach --timeout 4 --dead-timeout 15 "$img")
    i=${d#/dev/nbd}
    dd if="$d" of=/dev/null bs=4096 count=16 iflag=direct
    server=$(sed -n 's/^server_pid=//p' "$PDIO_RUN/nbd$i.rec")
    rm -f "$img"
    t0=$(date +%s)
    kill -KILL "$server"
    rc=0
    timeout 90 dd if="$d" of=/dev/null bs=4096 count=16 skip=100 iflag=direct || rc=$?
    t=$(($(date +%s) - t0))
    wait_until 60 grep -q '^gave_up=1' "$PDIO_RUN/nbd$i.rec" ||
        { echo "the supervisor did not give up"; pdio list; return 1; }
    pdio list | tee "$STATE/rc.list"
    why=$(grep "^$d " "$STATE/rc.list" | sed 's/.* failed: //')
    pdio detach "$d"
    if fe_connected "$i"; then echo "still connected"; return 1; fi
    fe_no_state
    fe_no_server
    detail "read after the kill: dd exit $rc after ${t}s (dead-connection timeout 15 s); pdio list: failed: $why; detached"
    [ "$rc" != 0 ] && [ "$rc" != 124 ] && [ "$t" -le 40 ]
    grep -q "failed: gave up: pdio serve could not serve" "$STATE/rc.list"
}

# One connection (the default on a one-CPU machine): the kernel requeues a
# timed-out request on a single connection too (nbd_xmit_timeout, since
# Linux 5.10) and waits for the new socket.  Raw O_DIRECT writes of one
# random 64 KiB pattern in a loop across a SIGKILL, then every one read
# back and compared.  (Broken variant: no-restart, the writes fail.)
rc_single() {
    img=/scratch/one.img
    rm -f "$img" "$STATE/one.fail" "$STATE/one.stop" "$STATE/one.n"
    truncate -s 64M "$img"
    d=$(pdio attach --connections 1 --timeout 4 --dead-timeout 30 "$img")
    i=${d#/dev/nbd}
    [ "$(ls "/sys/block/nbd$i/mq" | wc -l)" = 1 ]
    head -c 65536 /dev/urandom > /tmp/one.pat
    kmsg_reset; errs0=0
    (
        n=0
        while [ ! -f "$STATE/one.stop" ] && [ $n -lt 1000 ]; do
            dd if=/tmp/one.pat of="$d" bs=65536 count=1 seek=$n oflag=direct conv=notrunc 2>/dev/null ||
                echo "write $n failed" >> "$STATE/one.fail"
            n=$((n + 1))
        done
        echo "$n" > "$STATE/one.n"
    ) &
    loop=$!
    sleep 2
    server=$(sed -n 's/^server_pid=//p' "$PDIO_RUN/nbd$i.rec")
    case $server in ''|0) echo "no server"; touch "$STATE/one.stop"; return 1 ;; esac
    kill -KILL "$server"
    wait_until 40 restarted_once "$PDIO_RUN/nbd$i.rec" || echo "no restart"
    sleep 6
    touch "$STATE/one.stop"
    wait "$loop" || true
    n=$(cat "$STATE/one.n")
    bad=0 k=0
    while [ $k -lt "$n" ]; do
        dd if="$d" bs=65536 count=1 skip=$k iflag=direct 2>/dev/null | cmp -s - /tmp/one.pat || bad=$((bad + 1))
        k=$((k + 1))
    done
    errs=$(($(nbd_io_errors) - errs0))
    restarts=$(sed -n 's/^restarts=//p' "$PDIO_RUN/nbd$i.rec")
    pdio detach "$d"
    detail "1 connection: $n writes of 64 KiB across a SIGKILL, $(cat "$STATE/one.fail" 2>/dev/null | wc -l) failed, $bad read back wrong, restarts $restarts, kernel I/O errors $errs"
    [ ! -s "$STATE/one.fail" ] && [ "$bad" = 0 ] && [ "$errs" = 0 ] && [ "$restarts" = 1 ] && [ "$n" -gt 0 ]
}

# For wait_until: the record REC counts one restart and names a server.
restarted_once() {
    grep -q '^restarts=1$' "$1" && [ "$(sed -n 's/^server_pid=//p' "$1")" != 0 ]
}

scenario_recover() {
    step "recover: pdio attach (timeout $RC_TIMEOUT s), mkfs.ext4, mount; a supervisor runs" rc_attach
    step "recover: server SIGKILLed 3 times during fio verify: 0 errors, 3 restarts" rc_replace kill 3
    step "recover: unmount, e2fsck -fn clean, remount" rc_fsck
    step "recover: server SIGABRTed during fio verify: 0 errors" rc_replace abort 1
    step "recover: pdio restart twice during fio verify: 0 errors" rc_replace restart 2
    step "recover: unmount, e2fsck -fn clean, remount" rc_fsck
    step "recover: supervisor killed: I/O keeps working; pdio restart starts a new supervisor, which restarts a killed server; pdio detach cleans up" rc_supervisor_killed
    step "recover: one connection: raw O_DIRECT writes across a SIGKILL, all read back" rc_single
    step "recover: a server that cannot come back: I/O errors within the timeouts, list says why, detach cleans up" rc_cannot_come_back
}

# The same supervision with the other front end, nbdkit and pdio.so.
rc_detach() {
    umount "$MNT"
    e2fsck -fn "$(rc_dev)"
    pdio detach "$(rc_dev)"
    fe_no_state
    fe_no_server
}

scenario_nbdkit_recover() {
    RC_ATTACH_FLAGS=--nbdkit
    step "nbdkit-recover: pdio attach --nbdkit (timeout $RC_TIMEOUT s), mkfs.ext4, mount; a supervisor runs" rc_attach
    step "nbdkit-recover: nbdkit SIGKILLed 3 times during fio verify: 0 errors, 3 restarts" rc_replace kill 3
    step "nbdkit-recover: pdio restart during fio verify: 0 errors" rc_replace restart 1
    step "nbdkit-recover: unmount, e2fsck -fn clean, pdio detach leaves nothing" rc_detach
    RC_ATTACH_FLAGS=
}

# --- pdio restart hands the live connections over ---------------------------------
# With pdio's own server, pdio restart starts a new server that takes the
# live connections from the old one (pdio serve --take-over,
# src/server/handover.c): the kernel sees no close, nothing is resent, and
# the filesystem sees no pause beyond the hand-over itself.  The device is
# attached with the defaults, as a user would: request timeout 0 and
# queue/io_timeout 1000 ms.  The kernel itself is then the judge of the
# pause: a request the server holds for a second logs "Possible stuck
# request", and one resent after a dropped connection logs the drop.  So
# "no nbd line in the kernel log" means nothing was resent and no request
# waited a second at the server.  The probe pauses are the guest's wall
# clock under TCG, which a loaded host stretches (fio's own writes took
# 1.6 s in one CI run): they are printed, not a pass condition.
#
# Shown to fail against the test build (run.sh --scenario handover
# --break LIST, tests/vm/breaks.c):
#   handover-off    the supervisor skips the hand-over and kills the
#                   server as before: nbd messages in the kernel log, the
#                   record's reason names the fallback
#   handover-stall  the successor stops for 3 s right after it took the
#                   connections over: "Possible stuck request" lines
HO_RESTARTS=10

ho_attach() {
    rm -f "$RC_IMG"
    truncate -s "$RC_SIZE" "$RC_IMG"
    echo "$RC_IMG" > "$STATE/img"
    pdio attach "$RC_IMG" > "$STATE/rc.dev"
    mkfs.ext4 -F -q "$(rc_dev)"
    mount -t ext4 -o noinit_itable "$(rc_dev)" "$MNT"
    mkdir -p "$MNT/fio"
    [ "$(cat "/proc/$(rc_field server_pid)/comm")" = pdio ]
    io=$(cat "/sys/block/nbd$(rc_idx)/queue/io_timeout")
    detail "$(rc_dev), server pid $(rc_field server_pid), default timeouts (request $(rc_field timeout) s, io_timeout $io ms)"
    # The kernel's 1 s timer is what bounds the pause (above).
    [ "$(rc_field timeout)" = 0 ] && [ "$io" = 1000 ]
}

# The pause at each restart: the longest probe write that overlapped the
# time pdio restart ran (start and end uptimes in ho.restarts), in ms.
ho_pauses() {
    awk 'NR == FNR { s[++n] = $1; e[n] = $2; next }
         { for (i = 1; i <= n; i++) if ($2 >= s[i] && $1 <= e[i] && $2 - $1 > p[i]) p[i] = $2 - $1 }
         END { for (i = 1; i <= n; i++) printf "%d ", p[i] * 1000 }' \
        "$STATE/ho.restarts" "$STATE/rc.probe"
}

# The longest probe write of the whole run, in ms.
ho_longest_probe() {
    awk '{ if ($2 - $1 > m) m = $2 - $1 } END { printf "%d", m * 1000 }' "$STATE/rc.probe"
}

ho_restarts() {
    kmsg_reset
    rm -f "$STATE/ho.restarts" "$STATE/ho.pids"
    r0=$(rc_field restarts)
    rc_fio_loop handover
    rc_probe
    sleep 2
    k=0
    while [ $k -lt $HO_RESTARTS ]; do
        old=$(rc_field server_pid)
        case $old in ''|0) echo "no server to restart"; touch "$STATE/rc.stop"; return 1 ;; esac
        a=$(cut -d' ' -f1 /proc/uptime)
        pdio restart "$(rc_dev)" | tee -a "$STATE/ho.out" ||
            { echo "pdio restart $((k + 1)) failed"; touch "$STATE/rc.stop"; return 1; }
        b=$(cut -d' ' -f1 /proc/uptime)
        echo "$a $b" >> "$STATE/ho.restarts"
        k=$((k + 1))
        rc_replaced $((r0 + k)) "$old" ||
            { echo "restart $k: the record has no new live server"; touch "$STATE/rc.stop"; return 1; }
        echo "$old $new" >> "$STATE/ho.pids"
        sleep $(($(od -An -N1 -tu1 /dev/urandom) % 2 + 1))
    done
    sleep 2
    touch "$STATE/rc.stop"
    wait "$(cat "$STATE/rc.fiopid")" 2>/dev/null || true
    wait "$(cat "$STATE/rc.probepid")" 2>/dev/null || true
    wait_until 300 test -f "$STATE/rc.fioruns" || { echo "fio loop did not end"; return 1; }
    pdio list
    pdio list --json > "$STATE/rc.json"
    set -- $(rc_fio_figures handover)
    maxlat=$1 fioerrs=$2
    dmesg | grep -i nbd > "$STATE/ho.kmsg" || true
    kmsgs=$(wc -l < "$STATE/ho.kmsg")
    restarts=$(rc_field restarts)
    reason=$(rc_field reason)
    runs=$(cat "$STATE/rc.fioruns")
    pauses=$(ho_pauses)
    longest=$(ho_longest_probe)
    took=$(grep -o 'took the live connections .* in [0-9]* ms' "$PDIO_RUN/nbd$(rc_idx).supervisor.log" |
        tail -n $HO_RESTARTS | sed 's/.* in \([0-9]*\) ms/\1/' | tr '\n' ' ')
    distinct=$(tr ' ' '\n' < "$STATE/ho.pids" | sort -u | wc -l)
    tap_diag "handover x$HO_RESTARTS (TCG): probe pause at each restart ${pauses}ms, longest probe write of the run ${longest} ms; supervisor: hand-over done in ${took}ms; fio $runs runs, $fioerrs errors, max completion latency $maxlat ms; kernel nbd messages: $kmsgs"
    detail "restarts $r0 -> $restarts (last: $reason); probe pauses ${pauses}ms (TCG); fio $runs runs, $fioerrs errors, max latency $maxlat ms; nbd kernel messages $kmsgs; $distinct distinct server pids"
    cat "$STATE/ho.kmsg"
    [ ! -s "$STATE/rc.fiofail" ] || { cat "$STATE/rc.fiofail"; return 1; }
    [ "$fioerrs" = 0 ]
    [ "$kmsgs" = 0 ]
    [ "$restarts" = $((r0 + HO_RESTARTS)) ]
    grep -q "\"restarts\": $restarts" "$STATE/rc.json"
    [ "$reason" = "pdio restart: live connections handed over" ]
    [ "$(grep -c "(pdio restart: live connections handed over)" "$STATE/ho.out")" = $HO_RESTARTS ]
    # Every restart gave a new pid: the first old one and ten new ones.
    [ "$distinct" = $((HO_RESTARTS + 1)) ]
}

# The old server hangs (SIGSTOP): the successor gets no answer within
# its 10 s, so pdio restart falls back to killing the server and
# reconnecting, and says so; the filesystem carries on.
ho_fallback() {
    old=$(rc_field server_pid)
    r0=$(rc_field restarts)
    head -c 1048576 /dev/urandom > /tmp/ho.pat
    kill -STOP "$old"
    rc=0
    pdio restart "$(rc_dev)" > "$STATE/ho.fb" 2>&1 || rc=$?
    cat "$STATE/ho.fb"
    grep "hand-over failed" "$PDIO_RUN/nbd$(rc_idx).supervisor.log" | tail -n 1
    new=$(rc_field server_pid)
    cp /tmp/ho.pat "$MNT/after-fallback"
    sync
    detail "pdio restart exit $rc: $(cat "$STATE/ho.fb")"
    [ "$rc" = 0 ]
    grep -q "hand-over failed, fresh connections instead (.*cannot take over from the server on " "$STATE/ho.fb"
    [ "$(rc_field restarts)" = $((r0 + 1)) ]
    [ "$new" != "$old" ] && [ -d "/proc/$new" ] && proc_gone "$old"
    cmp /tmp/ho.pat "$MNT/after-fallback"
}

scenario_handover() {
    step "handover: pdio attach (default timeouts), mkfs.ext4, mount" ho_attach
    step "handover: pdio restart x$HO_RESTARTS during fio verify: 0 errors, no nbd kernel message (nothing resent, no request held 1 s), new pid each time, list counts them" ho_restarts
    step "handover: the old server hung (SIGSTOP): pdio restart falls back to kill and reconnect, says so, the filesystem carries on" ho_fallback
    step "handover: unmount, e2fsck -fn clean, pdio detach leaves nothing" rc_detach
}

# --- a crash costs only the restart (scenario crash) ---------------------------------
# pdio attach with its defaults: one connection, kernel request timeout 0,
# /sys/block/nbdN/queue/io_timeout 1000 ms.  The requests in flight on a
# dead connection are then resent at their timer's first expiry after the
# supervisor's NBD_CMD_RECONFIGURE (the connection's cookie changed); a
# live connection is never dropped for a slow request; a server that stops
# answering is the supervisor's watchdog's to replace.  Reuses the recover
# scenario's fio loop, probe writer and pause measurement (rc_*).
#
# Each check was shown to fail against the test build (run.sh --break):
#   kernel-timeout-default  attach as before (timeout 15 s, one connection
#                         per CPU up to 4): the defaults check fails, and
#                         the crash pauses exceed 3 s
#   no-watchdog           the supervisor never probes its server: the hung
#                         server is not replaced
#   kernel-timeout-nonzero  the 1 s timer as a kernel request timeout: the
#                         slow-storage check fails (the connection of a
#                         slow request is dropped and handed over again)
CR_PAUSE_MAX_MS=3000    # the longest probe pause allowed at a crash (TCG)
CR_HUNG_MS=10000        # watchdog.c: WATCHDOG_HUNG_MS
CR_SLOW_MS=3000         # dm-delay's delay
CR_SLOW_WRITES=2

cr_attach() {
    rm -f "$RC_IMG"
    truncate -s "$RC_SIZE" "$RC_IMG"
    # shellcheck disable=SC2086
    pdio attach $RC_ATTACH_FLAGS "$RC_IMG" > "$STATE/rc.dev"
    mkfs.ext4 -F -q "$(rc_dev)"
    mount -t ext4 -o noinit_itable "$(rc_dev)" "$MNT"
    mkdir -p "$MNT/fio"
    io=$(cat "/sys/block/nbd$(rc_idx)/queue/io_timeout")
    hw=$(ls "/sys/block/nbd$(rc_idx)/mq" | wc -l)
    detail "$(rc_dev): defaults: connections $(rc_field connections) ($hw hardware queue(s)), timeout $(rc_field timeout) s, io_timeout $io ms, dead-connection timeout $(rc_field dead_timeout) s; server pid $(rc_field server_pid)"
    [ "$(rc_field connections)" = 1 ] && [ "$hw" = 1 ]
    [ "$(rc_field timeout)" = 0 ]
    [ "$io" = 1000 ]
    want=pdio; [ "$RC_ATTACH_FLAGS" = --nbdkit ] && want=nbdkit
    [ "$(cat "/proc/$(rc_field server_pid)/comm")" = "$want" ]
}

# cr_crash HOW N: the recover scenario's replacement test, and every
# pause at most CR_PAUSE_MAX_MS.
cr_crash() {
    rc_replace "$@" || return 1
    pauses=$(rc_pauses)
    echo "$1 pauses (ms): $pauses"
    for p in $pauses; do
        [ "$p" -le "$CR_PAUSE_MAX_MS" ] || { echo "pause $p ms > $CR_PAUSE_MAX_MS ms"; return 1; }
    done
}

# SIGSTOP the server during fio: the watchdog kills it after CR_HUNG_MS
# without an answer and the supervisor starts a new one; fio sees no error.
cr_hung() {
    kmsg_reset
    r0=$(rc_field restarts)
    rc_fio_loop hung
    rc_probe
    sleep 3
    old=$(rc_field server_pid)
    case $old in ''|0) echo "no server"; touch "$STATE/rc.stop"; return 1 ;; esac
    cut -d' ' -f1 /proc/uptime > "$STATE/rc.kills"
    t0=$(cut -d' ' -f1 /proc/uptime)
    kill -STOP "$old"
    ok=0
    wait_until 60 rc_replaced $((r0 + 1)) "$old" || ok=1
    t1=$(cut -d' ' -f1 /proc/uptime)
    # Not replaced: the stopped server would hold fio (and this test) for
    # ever; killed, the supervisor brings it back as after a crash.
    [ "$ok" = 0 ] || kill -KILL "$old"
    sleep 3
    touch "$STATE/rc.stop"
    wait "$(cat "$STATE/rc.fiopid")" 2>/dev/null || true
    wait "$(cat "$STATE/rc.probepid")" 2>/dev/null || true
    wait_until 300 test -f "$STATE/rc.fioruns" || { echo "fio loop did not end"; return 1; }
    [ "$ok" = 0 ] || { echo "not replaced 60 s after SIGSTOP"; return 1; }
    grep "pdio-supervise" "$PDIO_RUN/nbd$(rc_idx).supervisor.log" | tail -n 4
    set -- $(rc_fio_figures hung)
    maxlat=$1 fioerrs=$2
    took=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%d", (b - a) * 1000 }')
    stuck=$(dmesg | grep -c 'Possible stuck request' || true)
    reason=$(rc_field reason)
    tap_diag "hung server (SIGSTOP): replaced ${took} ms after the stop (watchdog bound $CR_HUNG_MS ms + probe interval + restart; TCG); probe pause $(rc_pauses)ms; fio $fioerrs errors, max latency $maxlat ms; kernel 'Possible stuck request' lines: $stuck"
    detail "reason: $reason; replaced after ${took} ms; fio $fioerrs errors; kernel I/O errors $(nbd_io_errors)"
    [ ! -s "$STATE/rc.fiofail" ] || { cat "$STATE/rc.fiofail"; return 1; }
    [ "$fioerrs" = 0 ] && [ "$(nbd_io_errors)" = 0 ]
    case $reason in "server hung: no answer for "*) ;; *) return 1 ;; esac
    proc_gone "$old"
}

cr_detach() {
    umount "$MNT"
    e2fsck -fn "$(rc_dev)"
    pdio detach "$(rc_dev)"
    fe_no_state
    fe_no_server
}

# Slow storage: the image is a device-mapper device whose first MiB is a
# dm-delay target (CR_SLOW_MS on every I/O), the rest linear, over a loop
# device.  The watchdog's probes (offset 0) are slow too.  A writer keeps
# the fast part busy while CR_SLOW_WRITES 4 KiB O_DIRECT writes go, one
# after another, to the slow part.  Pass: each took the delay, no
# connection was dropped (no restart, no hand-over, no kernel timeout or
# dead-connection message), no I/O error, the data reads back, and the
# kernel logged at most 3 lines per slow request, the writes and their
# read-backs ("Possible stuck request", one per expiry of the 1 s timer:
# at 1-2, 2-3 and, under TCG's load, 3-4 s).
cr_slow() {
    back=/scratch/slow-back.img
    rm -f "$back" "$STATE/slow.stop" "$STATE/slow.fail"
    truncate -s 64M "$back"
    # By its path: the guest's busybox sh runs its own applet for "losetup".
    loop=$(/usr/sbin/losetup -f --show "$back")
    total=$((64 * 2048)) slow=2048
    printf '0 %d delay %s 0 %d\n%d %d linear %s %d\n' \
        "$slow" "$loop" "$CR_SLOW_MS" "$slow" $((total - slow)) "$loop" "$slow" |
        DM_DISABLE_UDEV=1 dmsetup create pdio-slow --noudevsync
    dmdev=/dev/mapper/pdio-slow
    if [ ! -b "$dmdev" ]; then
        for b in /sys/block/dm-*; do
            [ "$(cat "$b/dm/name")" = pdio-slow ] && dmdev=/dev/${b##*/}
        done
    fi
    [ -b "$dmdev" ] || { echo "no dm device"; ls -l /dev/mapper /sys/block; return 1; }
    d=$(pdio attach "$dmdev")
    i=${d#/dev/nbd}
    sup=$(sed -n 's/^supervisor_pid=//p' "$PDIO_RUN/nbd$i.rec")
    server=$(sed -n 's/^server_pid=//p' "$PDIO_RUN/nbd$i.rec")
    head -c 4096 /dev/urandom > /tmp/slow.pat
    kmsg_reset
    (
        n=0
        while [ ! -f "$STATE/slow.stop" ]; do
            dd if=/tmp/slow.pat of="$d" bs=4096 count=1 seek=$((1024 + n % 4096)) oflag=direct conv=notrunc 2>/dev/null ||
                echo "fast write $n failed" >> "$STATE/slow.fail"
            n=$((n + 1))
        done
    ) &
    writer=$!
    times=""
    k=0
    while [ $k -lt "$CR_SLOW_WRITES" ]; do
        a=$(cut -d' ' -f1 /proc/uptime)
        dd if=/tmp/slow.pat of="$d" bs=4096 count=1 seek=$((8 + k)) oflag=direct conv=notrunc 2>/dev/null ||
            echo "slow write $k failed" >> "$STATE/slow.fail"
        b=$(cut -d' ' -f1 /proc/uptime)
        times="$times $(awk -v a="$a" -v b="$b" 'BEGIN { printf "%d", (b - a) * 1000 }')"
        k=$((k + 1))
    done
    sleep 2
    touch "$STATE/slow.stop"
    wait "$writer" || true
    bad=0 k=0
    while [ $k -lt "$CR_SLOW_WRITES" ]; do
        dd if="$d" bs=4096 count=1 skip=$((8 + k)) iflag=direct 2>/dev/null | cmp -s - /tmp/slow.pat || bad=$((bad + 1))
        k=$((k + 1))
    done
    dmesg | grep -i nbd > "$STATE/slow.kmsg" || true
    cat "$STATE/slow.kmsg"
    lines=$(wc -l < "$STATE/slow.kmsg")
    nslow=$((2 * CR_SLOW_WRITES))
    dropped=$(grep -ci 'timed out\|dead\|shutting down\|failed\|I/O error\|Double reply\|Unexpected' "$STATE/slow.kmsg" || true)
    handed=$(grep -c 'died\|handed\|killing\|not answered' "$PDIO_RUN/nbd$i.supervisor.log" || true)
    restarts=$(sed -n 's/^restarts=//p' "$PDIO_RUN/nbd$i.rec")
    server2=$(sed -n 's/^server_pid=//p' "$PDIO_RUN/nbd$i.rec")
    pdio detach "$d"
    DM_DISABLE_UDEV=1 dmsetup remove pdio-slow
    /usr/sbin/losetup -d "$loop"
    tap_diag "slow storage (dm-delay $CR_SLOW_MS ms): slow writes took${times} ms; kernel log: $lines nbd line(s) for $nslow slow requests, $dropped of a dropped connection or error; supervisor: $handed hand-over(s), restarts $restarts"
    detail "slow writes took${times} ms; $bad read back wrong; server $server -> $server2, supervisor $sup; $(cat "$STATE/slow.fail" 2>/dev/null | wc -l) failed writes"
    [ ! -s "$STATE/slow.fail" ] && [ "$bad" = 0 ]
    for t in $times; do
        [ "$t" -ge $((CR_SLOW_MS - 500)) ] || { echo "a slow write took $t ms: the delay did not apply"; return 1; }
    done
    [ "$dropped" = 0 ] && [ "$handed" = 0 ] && [ "$restarts" = 0 ] && [ "$server2" = "$server" ]
    [ "$lines" -le $((3 * nslow)) ]
}

scenario_crash() {
    step "crash: pdio attach with its defaults (1 connection, timeout 0, io_timeout 1000 ms), mkfs.ext4, mount" cr_attach
    step "crash: server SIGKILLed 3 times during fio verify: 0 errors, each pause <= ${CR_PAUSE_MAX_MS} ms" cr_crash kill 3
    step "crash: server SIGABRTed during fio verify: 0 errors, pause <= ${CR_PAUSE_MAX_MS} ms" cr_crash abort 1
    step "crash: server SIGSTOPped during fio verify: the watchdog replaces it, 0 errors" cr_hung
    step "crash: unmount, e2fsck -fn clean, pdio detach leaves nothing" cr_detach
    step "crash: slow storage (dm-delay ${CR_SLOW_MS} ms): no connection dropped, no error, at most 3 kernel lines per slow request" cr_slow
    # The other front end: the kernel's side is the same.
    RC_ATTACH_FLAGS=--nbdkit
    step "crash: pdio attach --nbdkit with its defaults, mkfs.ext4, mount" cr_attach
    step "crash: nbdkit SIGKILLed 2 times during fio verify: 0 errors, each pause <= ${CR_PAUSE_MAX_MS} ms" cr_crash kill 2
    step "crash: nbdkit SIGSTOPped during fio verify: the watchdog replaces it, 0 errors" cr_hung
    step "crash: nbdkit: unmount, e2fsck -fn clean, pdio detach leaves nothing" cr_detach
    RC_ATTACH_FLAGS=
}

# --- mount -t pdio and fstab ---------------------------------------------------------
MT_IMG=/scratch/mt.img
# util-linux mount(8), which runs helpers (busybox's applets win over PATH
# in the guest's shell, and its mount does not).
MOUNT=/usr/bin/mount UMOUNT=/usr/bin/umount

# Nothing of an autoclear device left: not connected, no record, no
# server, no supervisor, 0 pages of the image cached.
mt_all_gone() {
    wait_until 15 fe_nothing_left ||
        { ls -l "$PDIO_RUN"; fe_no_state; fe_no_server; return 1; }
    for b in /sys/block/nbd*; do
        [ ! -f "$b/pid" ] || { echo "$b still connected"; return 1; }
    done
    pages=$(fincore_pages "$MT_IMG")
    echo "$pages" > "$STATE/mt.pages"
    [ "$pages" = 0 ]
}

mt_helper() {
    rm -f "$MT_IMG"
    truncate -s 128M "$MT_IMG"
    mkfs.ext4 -F -q "$MT_IMG"
    # mkfs wrote through the page cache; what pdio leaves there is the test.
    sync
    echo 3 > /proc/sys/vm/drop_caches
    $MOUNT -t pdio "$MT_IMG" "$MNT"
    grep " $MNT " /proc/mounts
    dev=$(grep " $MNT " /proc/mounts | cut -d' ' -f1)
    mnt_write_files 20
    pdio list | tee "$STATE/mt.list"
    grep -q '^autoclear=1$' "$PDIO_RUN/${dev#/dev/}.rec"
    # umount(8) runs umount.pdio (helper=pdio in utab), which returns once
    # the supervisor has cleaned up: no state, no connection, at once.
    helper=$(grep -c "helper=pdio" /run/mount/utab || true)
    $UMOUNT "$MNT"
    at_once=yes
    fe_no_state || at_once=no
    if [ -f "/sys/block/${dev#/dev/}/pid" ]; then echo "$dev still connected after umount"; at_once=no; fi
    mt_all_gone
    detail "mount -t pdio mounted $dev (ext4 detected, helper=pdio in utab: $helper), 20 files written; nothing left when umount returned: $at_once; then no server, supervisor, fincore $(cat "$STATE/mt.pages") pages"
    [ "$helper" = 1 ]
    [ "$at_once" = yes ]
}

mt_fstab() {
    echo "$MT_IMG $MNT pdio defaults 0 0" > /etc/fstab
    $MOUNT -a
    grep " $MNT " /proc/mounts
    mnt_verify_files 20
    $UMOUNT "$MNT"
    mt_all_gone
    echo "$MT_IMG $MNT pdio ro,fstype=ext4 0 0" > /etc/fstab
    $MOUNT -a
    grep " $MNT " /proc/mounts | grep -q ' ro[ ,]'
    dev=$(grep " $MNT " /proc/mounts | cut -d' ' -f1)
    ro=$(cat "/sys/block/${dev#/dev/}/ro")
    mnt_verify_files 20
    $UMOUNT "$MNT"
    mt_all_gone
    rm -f /etc/fstab
    detail "fstab 'IMAGE $MNT pdio defaults 0 0' mounted by mount -a, 20 checksums match; 'ro,fstype=ext4' mounts read-only (device ro=$ro); nothing left after each umount"
    [ "$ro" = 1 ]
}

scenario_mount() {
    step "mount: mount -t pdio IMAGE /mnt, write, umount: nothing left, fincore 0" mt_helper
    step "mount: fstab entries mounted by mount -a (rw, then ro with fstype=)" mt_fstab
}

# --- partitions ----------------------------------------------------------------------------
PT_IMG=/scratch/pt.img

pt_test() {
    rm -f "$PT_IMG"
    truncate -s 96M "$PT_IMG"
    printf 'label: gpt\nsize=24MiB\nsize=48MiB\n' | sfdisk -q "$PT_IMG"
    d=$(pdio attach "$PT_IMG")
    i=${d#/dev/nbd}
    wait_until 5 test -b "${d}p2" ||
        { ls /sys/block/nbd$i; echo "no ${d}p2"; pdio detach "$d"; return 1; }
    parts=$(ls "/sys/block/nbd$i" | grep "^nbd${i}p" | tr '\n' ' ')
    mkfs.ext4 -F -q "${d}p2"
    mount -t ext4 "${d}p2" "$MNT"
    echo hello > "$MNT/hello"
    umount "$MNT"
    pdio detach "$d"
    wait_until 5 no_partitions "$i" ||
        { echo "partitions left after detach: $(ls /sys/block/nbd$i)"; return 1; }
    fe_no_state
    detail "$d shows $parts; ${d}p2 mkfs/mount/write/umount; detach removed both"
    [ "$parts" = "nbd${i}p1 nbd${i}p2 " ]
}

no_partitions() {
    [ ! -e "/sys/block/nbd$1/nbd${1}p1" ] && [ ! -e "/sys/block/nbd$1/nbd${1}p2" ]
}

scenario_partitions() {
    step "partitions: a GPT image (sfdisk) shows nbdNp1 and nbdNp2, p2 mounts, detach removes both" pt_test
}

# --- resize: pdio resize and the image's identity ---------------------------------------
# The image grows under a mounted filesystem while fio runs on it; pdio
# resize gives the device the new size (NBD_CMD_RECONFIGURE), the kernel's
# uevent follows, resize2fs / xfs_growfs grow the filesystem online.
# Before growing, the old filesystem is filled (fallocate) to RS_SLACK of
# free space, so that RS_NEW of files written after it cannot all fit in
# the old space: their being there, intact after a remount, proves the
# new space usable.  A server killed after that comes back at the new
# size.  The device carries the image's identity
# (NBD_ATTR_BACKEND_IDENTIFIER), which the kernel insists every
# reconfigure repeats, and the supervisor does not serve another file put
# at the image's path.  Shrinking an open device is refused (mounted;
# open by a process) and allowed once it is closed; nbdkit (pdio attach
# --nbdkit, which pdio resize restarts) grows too.
#
# Each test was shown to fail against a deliberately broken pdio
# (run.sh --break LIST, tests/vm/breaks.c):
#   resize-no-reconfigure   pdio resize does not tell the kernel: the
#                           device keeps its size, the grow tests fail
#   resize-no-shrink-check  pdio resize shrinks a device in use: the
#                           shrink test fails
#   resize-no-restart       pdio resize does not restart nbdkit: the
#                           nbdkit test fails (its server serves the old
#                           size, which pdio resize sees and refuses)
#   no-backend              pdio attach gives the kernel no identity: the
#                           backend test fails (empty backend, and a
#                           reconfigure for another image is taken)
#   no-identity-check       the supervisor serves whatever file is at the
#                           image's path: the replaced-image test fails
#   supervisor-stale-size   the supervisor keeps the size of the attach:
#                           the restart-after-resize test fails (the
#                           record and pdio list go back to it)
# and pdio serve that keeps its size (a local patch: conn.c not reading
# the size for new connections) fails the native grow tests.
RS_IMG=/scratch/rs.img
RS_SLACK=$((24 * 1048576))   # free space left in the old filesystem
RS_NEW=48                    # MiB of files written after growing

rs_dev() { cat "$STATE/rs.dev"; }
rs_idx() { d=$(rs_dev); echo "${d#/dev/nbd}"; }
rs_field() { sed -n "s/^$1=//p" "$PDIO_RUN/nbd$(rs_idx).rec"; }
rs_dev_size() { echo $(($(cat "/sys/block/nbd$(rs_idx)/size") * 512)); }
rs_avail() { df -B1 "$MNT" | awk 'NR == 2 { print $4 }'; }
rs_fs_size() { df -B1 "$MNT" | awk 'NR == 2 { print $2 }'; }

# rs_attach FS SIZE [ATTACH-FLAGS]: a fresh image, attached, FS made and
# mounted, files written, the rest filled up to RS_SLACK.
rs_attach() {
    fs=$1 size=$2; shift 2
    rm -f "$RS_IMG"
    truncate -s "$size" "$RS_IMG"
    echo "$RS_IMG" > "$STATE/img"
    pdio attach "$@" "$RS_IMG" > "$STATE/rs.dev"
    case $fs in
    ext4) mkfs.ext4 -F -q "$(rs_dev)"; mount -t ext4 -o noinit_itable "$(rs_dev)" "$MNT" ;;
    xfs) mkfs.xfs -f -q "$(rs_dev)"; mount -t xfs "$(rs_dev)" "$MNT" ;;
    esac
    mkdir -p "$MNT/old" "$MNT/fio"
    write_files "$MNT/old" 60 "$STATE/rs.old.sums"
    fill=$(($(rs_avail) - RS_SLACK))
    xfs_io -f -c "falloc 0 $fill" "$MNT/fill"
    sync
    detail "$(rs_dev) ($*), $fs of $(($(rs_fs_size) / 1048576)) MiB on $((size / 1048576)) MiB, filled to $(($(rs_avail) / 1048576)) MiB free"
    [ "$(rs_dev_size)" = "$size" ]
    [ "$(rs_field size)" = "$size" ]
}

# rs_grow FS NEWSIZE FIO: the image is grown while FS is mounted (and fio
# runs on it if FIO=fio), pdio resize, the filesystem grown online.
rs_grow() {
    fs=$1 size=$2 withfio=$3
    kmsg_reset
    old_fs=$(rs_fs_size)
    pid0=$(rs_field server_pid) r0=$(rs_field restarts)
    if [ "$withfio" = fio ]; then rc_fio_loop "resize-$fs"; fi
    sleep 2
    truncate -s "$size" "$RS_IMG"
    # Failures are looked at once fio has stopped.
    t0=$(cut -d' ' -f1 /proc/uptime)
    resize_rc=0 grow_rc=0
    pdio resize "$(rs_dev)" || resize_rc=$?
    t1=$(cut -d' ' -f1 /proc/uptime)
    case $fs in
    ext4) resize2fs "$(rs_dev)" || grow_rc=$? ;;
    xfs) xfs_growfs "$MNT" || grow_rc=$? ;;
    esac
    t2=$(cut -d' ' -f1 /proc/uptime)
    sleep 2
    fioerrs=0 maxlat=- runs=-
    if [ "$withfio" = fio ]; then
        touch "$STATE/rc.stop"
        wait "$(cat "$STATE/rc.fiopid")" 2>/dev/null || true
        wait_until 300 test -f "$STATE/rc.fioruns" || { echo "fio loop did not end"; return 1; }
        set -- $(rc_fio_figures "resize-$fs")
        maxlat=$1 fioerrs=$2 runs=$(cat "$STATE/rc.fioruns")
    fi
    rm -rf "$MNT/fio"
    pdio list | tee "$STATE/rs.list"
    pdio list --json > "$STATE/rs.json"
    new_fs=$(rs_fs_size)
    errs=$(nbd_io_errors)
    tap_diag "resize $fs: pdio resize took $(echo "$t0 $t1" | awk '{printf "%.2f", $2 - $1}') s, the filesystem grow $(echo "$t1 $t2" | awk '{printf "%.2f", $2 - $1}') s (TCG); fio $runs runs, $fioerrs errors, max latency $maxlat ms"
    detail "pdio resize exit $resize_rc, grow exit $grow_rc; device $(rs_dev_size) bytes, $fs $((old_fs / 1048576)) -> $((new_fs / 1048576)) MiB; server pid $pid0 -> $(rs_field server_pid); fio $runs runs, $fioerrs errors; kernel I/O errors $errs"
    [ ! -s "$STATE/rc.fiofail" ] || { cat "$STATE/rc.fiofail"; return 1; }
    [ "$resize_rc" = 0 ] && [ "$grow_rc" = 0 ]
    [ "$fioerrs" = 0 ] && [ "$errs" = 0 ]
    [ "$(rs_dev_size)" = "$size" ]
    [ "$new_fs" -gt $((old_fs + 64 * 1048576)) ]
    # pdio list shows the new size, in the text and the JSON.
    grep "^$(rs_dev) " "$STATE/rs.list" | grep -q " $size ok"
    grep -qF "\"size\": $size," "$STATE/rs.json"
    [ "$(rs_field size)" = "$size" ]
    # pdio's own server takes the new size as it runs; nbdkit is replaced.
    if [ "$(rs_field frontend)" = nbdkit ]; then
        [ "$(rs_field server_pid)" != "$pid0" ] && [ "$(rs_field restarts)" = $((r0 + 1)) ]
    else
        [ "$(rs_field server_pid)" = "$pid0" ] && [ "$(rs_field restarts)" = "$r0" ]
    fi
}

# RS_NEW MiB of new files: more than the old filesystem had free, so
# most of them are in the new space; read back after a remount, with the
# old files, and the filesystem checked.
rs_new_space() {
    fs=$1
    mkdir -p "$MNT/new"
    head -c 1048576 /dev/urandom > /tmp/rs.pat
    i=0
    while [ $i -lt "$RS_NEW" ]; do
        { echo "$i"; cat /tmp/rs.pat; } > "$MNT/new/f$i"
        i=$((i + 1))
    done
    sync
    (cd "$MNT/new" && sha256sum f*) > "$STATE/rs.new.sums"
    umount "$MNT"
    case $fs in
    ext4) e2fsck -fn "$(rs_dev)" ;;
    xfs) xfs_repair -n "$(rs_dev)" ;;
    esac
    blockdev --flushbufs "$(rs_dev)"
    mount -t "$fs" "$(rs_dev)" "$MNT"
    verify_files "$MNT/old" 60 "$STATE/rs.old.sums"
    ok_new=$( (cd "$MNT/new" && sha256sum -c "$STATE/rs.new.sums") | grep -c ': OK$')
    detail "$RS_NEW MiB written past the old free space ($((RS_SLACK / 1048576)) MiB); after a remount $ok_new of $RS_NEW new files and the 60 old ones verify; ${fs} check clean"
    [ "$ok_new" = "$RS_NEW" ]
}

# After a resize, the server is killed: the supervisor's new server and
# connections serve the new size, and the record keeps it.
rs_restart() {
    size=$(rs_dev_size) pid0=$(rs_field server_pid) r0=$(rs_field restarts)
    kill -KILL "$pid0"
    wait_until 60 rc_replaced_dev "$(rs_idx)" $((r0 + 1)) "$pid0" ||
        { echo "no new server"; return 1; }
    dd if=/dev/urandom of="$MNT/new/after-restart" bs=64k count=16 2>/dev/null
    sync
    sum=$(md5sum < "$MNT/new/after-restart")
    echo 3 > /proc/sys/vm/drop_caches
    pdio list | tee "$STATE/rs.list"
    detail "server $pid0 killed, replaced by $(rs_field server_pid); record size $(rs_field size), device $(rs_dev_size)"
    [ "$(md5sum < "$MNT/new/after-restart")" = "$sum" ]
    [ "$(rs_dev_size)" = "$size" ] && [ "$(rs_field size)" = "$size" ]
    grep "^$(rs_dev) " "$STATE/rs.list" | grep -q " $size ok"
}

# For wait_until: the record of nbdIDX counts RESTARTS and names a live
# server other than OLD.
rc_replaced_dev() {
    rec=$PDIO_RUN/nbd$1.rec
    new=$(sed -n 's/^server_pid=//p' "$rec")
    [ "$(sed -n 's/^restarts=//p' "$rec")" = "$2" ] && [ -n "$new" ] &&
        [ "$new" != 0 ] && [ "$new" != "$3" ] && [ -d "/proc/$new" ]
}

# Shrinking: refused while mounted and while open (with the device's and
# the image's sizes untouched), done once closed.
rs_shrink() {
    size=$(rs_dev_size) small=$(($(rs_dev_size) - 64 * 1048576))
    rc=0
    pdio resize --size "$small" "$(rs_dev)" 2> "$STATE/rs.err" || rc=$?
    cat "$STATE/rs.err"
    [ "$rc" = 1 ] && grep -q "is in use (mounted on $MNT)" "$STATE/rs.err"
    [ "$(rs_dev_size)" = "$size" ] && [ "$(stat -c %s "$RS_IMG")" = "$size" ]
    umount "$MNT"
    sleep 600 < "$(rs_dev)" &
    holder=$!
    sleep 1
    rc=0
    pdio resize --size "$small" "$(rs_dev)" 2> "$STATE/rs.err" || rc=$?
    kill "$holder"; wait "$holder" 2>/dev/null || true
    cat "$STATE/rs.err"
    [ "$rc" = 1 ] && grep -q "is in use (open by sleep (pid $holder))" "$STATE/rs.err"
    [ "$(rs_dev_size)" = "$size" ] && [ "$(stat -c %s "$RS_IMG")" = "$size" ]
    pdio resize --size "$small" "$(rs_dev)" 2> "$STATE/rs.err"
    cat "$STATE/rs.err"
    grep -q "warning: shrinking $(rs_dev) from $size to $small bytes: the data past the new end is lost" "$STATE/rs.err"
    detail "refused while mounted and while open by a process; closed: $((size / 1048576)) -> $(($(rs_dev_size) / 1048576)) MiB, image $(($(stat -c %s "$RS_IMG") / 1048576)) MiB"
    [ "$(rs_dev_size)" = "$small" ] && [ "$(stat -c %s "$RS_IMG")" = "$small" ]
    [ "$(rs_field size)" = "$small" ]
}

# The device names its image; a reconfigure for another image (the test
# build's break point sends one) is refused by the kernel and changes
# nothing.
rs_backend() {
    b=$(cat "/sys/block/nbd$(rs_idx)/backend")
    ino=$(stat -c %i "$RS_IMG")
    kmsg_reset
    size=$(rs_dev_size)
    truncate -s $((size + 64 * 1048576)) "$RS_IMG"
    rc=0
    PDIO_TEST_BREAK=backend-mismatch /pdio/broken/pdio resize "$(rs_dev)" || rc=$?
    dmesg | grep "backend image doesn't match" || true
    detail "/sys/block/nbd$(rs_idx)/backend: $b; a reconfigure for another image: exit $rc, size $(rs_dev_size)"
    case $b in "pdio:"*":$ino:$RS_IMG") ;; *) echo "backend is '$b'"; return 1 ;; esac
    [ "$b" = "$(rs_field backend)" ]
    [ "$rc" = 1 ] && [ "$(rs_dev_size)" = "$size" ]
    dmesg | grep -q "backend image doesn't match with $b"
    # The right identity takes it.
    pdio resize "$(rs_dev)"
    [ "$(rs_dev_size)" = $((size + 64 * 1048576)) ]
}

# The image is replaced by a copy (another file at the same path), then
# the server killed: the supervisor does not serve the copy to the
# device, and says why.
rs_replaced() {
    pid0=$(rs_field server_pid)
    mv "$RS_IMG" "$RS_IMG.orig"
    cp "$RS_IMG.orig" "$RS_IMG"
    kill -KILL "$pid0"
    wait_until 60 grep -q '^gave_up=1' "$PDIO_RUN/nbd$(rs_idx).rec" ||
        { echo "the supervisor served the copy: $(rs_field server_pid)"; pdio list; rm -f "$RS_IMG.orig"; return 1; }
    pdio list | tee "$STATE/rs.list"
    rm -f "$RS_IMG.orig"
    detail "$(rs_field reason)"
    grep "^$(rs_dev) " "$STATE/rs.list" | grep -q "failed: gave up: $RS_IMG is not the image attached any more"
}

rs_detach() {
    if mounted; then umount "$MNT"; fi
    pdio detach "$(rs_dev)"
    fe_no_state
    fe_no_server
}

# A device the kernel made on demand (--device past nbds_max, 16 here):
# resized like any other, the new space written through it and found in
# the image, and still destroyed when detached (the resize's reconfigure
# keeps the device's client flags and identity).
RS_OD_IDX=20
rs_od_gone() { [ ! -e "/sys/block/nbd$RS_OD_IDX" ]; }
rs_on_demand() {
    rm -f "$RS_IMG"
    truncate -s $((16 * 1048576)) "$RS_IMG"
    d=$(pdio attach --device "/dev/nbd$RS_OD_IDX" "$RS_IMG")
    echo "$d" > "$STATE/rs.dev"
    [ "$d" = "/dev/nbd$RS_OD_IDX" ]
    [ "$(rs_field on_demand)" = 1 ] || { echo "not made on demand"; return 1; }
    b=$(cat "/sys/block/nbd$RS_OD_IDX/backend")
    pdio resize --size 24M "$d"
    detail "$d (made on demand) resized: $(rs_dev_size) bytes, record $(rs_field size), backend $(cat "/sys/block/nbd$RS_OD_IDX/backend")"
    [ "$(rs_dev_size)" = $((24 * 1048576)) ]
    [ "$(rs_field size)" = $((24 * 1048576)) ]
    [ "$(cat "/sys/block/nbd$RS_OD_IDX/backend")" = "$b" ]
    head -c 1048576 /dev/urandom > /tmp/rs.od
    dd if=/tmp/rs.od of="$d" bs=1048576 count=1 seek=20 oflag=direct conv=notrunc 2>/dev/null
    dd if="$d" bs=1048576 count=1 skip=20 iflag=direct 2>/dev/null | cmp - /tmp/rs.od
    dd if="$RS_IMG" bs=1048576 count=1 skip=20 2>/dev/null | cmp - /tmp/rs.od
    pdio detach "$d"
    fe_no_state
    fe_no_server
    wait_until 10 rs_od_gone || { echo "$d is still there after detach"; return 1; }
}

scenario_resize() {
    step "resize: pdio attach, mkfs.ext4 on 128 MiB, files, filled to $((RS_SLACK / 1048576)) MiB free" rs_attach ext4 $((128 * 1048576))
    step "resize: image grown to 256 MiB during fio verify, pdio resize, resize2fs: 0 errors, pdio list shows it" rs_grow ext4 $((256 * 1048576)) fio
    step "resize: $RS_NEW MiB of new files in the new space; all files verify after remount, e2fsck -fn clean" rs_new_space ext4
    step "resize: the server killed after the resize: the new one serves the new size, the record keeps it" rs_restart
    step "resize: /sys/block/nbdN/backend names the image; a reconfigure for another image is refused" rs_backend
    step "resize: shrinking refused while mounted or open, done once closed" rs_shrink
    step "resize: the image replaced by a copy: the supervisor does not serve it" rs_replaced
    step "resize: pdio detach leaves nothing" rs_detach
    step "resize: xfs on 320 MiB, files, filled to $((RS_SLACK / 1048576)) MiB free" rs_attach xfs $((320 * 1048576))
    step "resize: image grown to 448 MiB during fio verify, pdio resize, xfs_growfs: 0 errors" rs_grow xfs $((448 * 1048576)) fio
    step "resize: $RS_NEW MiB of new files in the new space; all files verify after remount, xfs_repair -n clean" rs_new_space xfs
    step "resize: pdio detach leaves nothing" rs_detach
    step "resize: pdio attach --nbdkit, ext4 on 128 MiB, filled" rs_attach ext4 $((128 * 1048576)) --nbdkit --timeout 8
    step "resize: nbdkit: image grown to 256 MiB, pdio resize restarts nbdkit, resize2fs" rs_grow ext4 $((256 * 1048576)) nofio
    step "resize: nbdkit: $RS_NEW MiB of new files in the new space; all verify after remount, e2fsck -fn clean" rs_new_space ext4
    step "resize: nbdkit: pdio detach leaves nothing" rs_detach
    step "resize: a device made on demand (/dev/nbd$RS_OD_IDX) grown to 24 MiB, written in the new space; destroyed on detach" rs_on_demand
}

# --- fstab at boot under systemd -------------------------------------------------------
# The fstab line "IMAGE DIR pdio defaults 0 0" booted as on a Debian
# machine: systemd is PID 1, systemd-fstab-generator turns /etc/fstab into
# mount units, udev (systemd-udevd, coldplugged by systemd-udev-trigger)
# brings up the device units, systemd mounts the scratch disk on /scratch
# (also from fstab: the image lives there) and then /mnt by running
# mount(8), which runs mount.pdio; pdio's server and supervisor stay
# behind, in a scope of their own in pdio.slice (not in mnt.mount's
# cgroup, so that mount(8)'s exit does not take them along, nor the
# memory limits of whoever mounts).  The shell sets it all up and execs
# systemd; the unit pdio-boot-check.service (this script again, with
# PDIO_GUEST_PHASE=systemd) runs the checks, stops mnt.mount, checks that
# nothing is left, finishes the run and powers off.  Broken variant:
# run.sh --break no-autoclear (the checks after systemctl stop fail).
SD_IMG=/scratch/sd.img
SD_UNIT=mnt.mount
SD_CHECK=/run/sd-check
SD_WATCHDOG=240     # s for the check unit to start, and again to finish

sd_setup() {
    # The image: ext4 with 20 files of known checksums, made with mount -t
    # pdio (the mount scenario's test) and never broken: --break is for
    # the mount systemd makes.
    unset PDIO_TEST_BREAK
    rm -f "$SD_IMG" "$STATE/sd.ready" "$STATE/sd.started" "$STATE/sd.done"
    truncate -s 128M "$SD_IMG"
    mkfs.ext4 -F -q "$SD_IMG"
    # mkfs wrote through the page cache; what pdio leaves there is the test.
    sync
    echo 3 > /proc/sys/vm/drop_caches
    $MOUNT -t pdio "$SD_IMG" "$MNT"
    mnt_write_files 20
    $UMOUNT "$MNT"
    MT_IMG=$SD_IMG
    mt_all_gone
    # systemd mounts the scratch disk itself, from fstab, as it would any
    # filesystem an image lives on.
    sync
    umount /scratch
    printf '/dev/vda  /scratch  ext4  defaults  0 0\n%s  %s  pdio  defaults  0 0\n' \
        "$SD_IMG" "$MNT" > /etc/fstab
    cat /etc/fstab
    # Enough of /etc for systemd and udev: a machine id (not a first
    # boot), the users and groups udev's rules name.
    tr -d '-' < /proc/sys/kernel/random/uuid > /etc/machine-id
    echo 'root:x:0:0:root:/root:/bin/sh' > /etc/passwd
    printf '%s\n' root:x:0: tty:x:5: disk:x:6: kmem:x:15: dialout:x:20: \
        fax:x:21: voice:x:22: cdrom:x:24: floppy:x:25: tape:x:26: audio:x:29: \
        video:x:44: sgx:x:101: input:x:102: kvm:x:103: render:x:104: > /etc/group
    # Debian's boot path: multi-user.target, udev enabled as its package
    # enables it, and the check unit enabled as systemctl enable would.
    # It Wants (not Requires) mnt.mount: it must run, and report, if the
    # mount fails, and must not be stopped with it.
    u=/etc/systemd/system
    mkdir -p "$u/multi-user.target.wants" "$u/sysinit.target.wants" \
        "$u/sockets.target.wants" /etc/systemd/system.conf.d
    ln -sf /lib/systemd/system/multi-user.target "$u/default.target"
    for f in systemd-udevd.service systemd-udev-trigger.service; do
        ln -sf "/lib/systemd/system/$f" "$u/sysinit.target.wants/$f"
    done
    for f in systemd-udevd-control.socket systemd-udevd-kernel.socket; do
        ln -sf "/lib/systemd/system/$f" "$u/sockets.target.wants/$f"
    done
    cat > "$u/pdio-boot-check.service" <<EOF
[Unit]
Description=pdio test: the fstab pdio mount systemd made at boot
Wants=$SD_UNIT
After=$SD_UNIT local-fs.target

[Service]
Type=oneshot
Environment=PDIO_GUEST_PHASE=systemd
ExecStart=/init
StandardOutput=tty
StandardError=tty
TimeoutStartSec=infinity

[Install]
WantedBy=multi-user.target
EOF
    ln -sf ../pdio-boot-check.service "$u/multi-user.target.wants/pdio-boot-check.service"
    # No journald here: what units print goes to the console.  run.sh
    # --break reaches mount.pdio through the manager's environment.
    {
        echo "[Manager]"
        echo "DefaultStandardOutput=tty"
        echo "DefaultStandardError=tty"
        if [ -n "$(sed -n "s/^PDIO_TEST_BREAK='\(.*\)'$/\1/p" /pdio/settings)" ]; then
            echo "DefaultEnvironment=$(sed -n "s/^PDIO_TEST_BREAK='\(.*\)'$/PDIO_TEST_BREAK=\1/p" /pdio/settings)"
        fi
    } > /etc/systemd/system.conf.d/pdio-test.conf
    cat /etc/systemd/system.conf.d/pdio-test.conf
    version=$(/lib/systemd/systemd --version | head -n 1)
    touch "$STATE/sd.ready"
    detail "$SD_IMG: ext4, 20 files; fstab: /dev/vda on /scratch (ext4), '$SD_IMG $MNT pdio defaults 0 0'; exec $version"
}

# If the check unit does not report in time: say so, show what systemd is
# waiting for, power off (the missing steps then fail on the host).
sd_give_up() {
    tap_diag "systemd: $1"
    log "$1"
    systemctl --no-pager list-jobs
    systemctl --no-pager --failed
    systemctl --no-pager status "$SD_UNIT" scratch.mount pdio-boot-check.service
    sync
    poweroff -f
    sleep 60
}

sd_watchdog() {
    cd /
    sleep "$SD_WATCHDOG"
    [ -f "$STATE/sd.started" ] ||
        sd_give_up "pdio-boot-check.service did not start within ${SD_WATCHDOG}s of systemd's start"
    sleep "$SD_WATCHDOG"
    [ -f "$STATE/sd.done" ] ||
        sd_give_up "pdio-boot-check.service did not finish within $((2 * SD_WATCHDOG))s of systemd's start"
}

# Hand over to systemd: the counters for the check unit, a watchdog, exec.
sd_boot() {
    echo "tap_n=$tap_n tap_pass=$tap_pass tap_fail=$tap_fail s0=$s0 sd_t0=$(uptime_s)" > "$STATE/sd.resume"
    sd_watchdog &
    log "exec /lib/systemd/systemd as PID 1"
    exec /lib/systemd/systemd --log-target=console --show-status=yes
}

sd_dev() { cat "$STATE/sd.dev"; }
sd_rec() { d=$(sd_dev); echo "$PDIO_RUN/${d#/dev/}.rec"; }
sd_prop() { systemctl show -p "$1" --value "$2"; }

# Mounted at boot by the generated unit, after the filesystem the image is
# on (systemd orders it so by itself: nothing in the fstab line asks).
sd_mounted() {
    pid1=$(cat /proc/1/comm)
    systemctl --no-pager status "$SD_UNIT" scratch.mount || true
    cat "/run/systemd/generator/$SD_UNIT" || true
    state=$(systemctl is-active "$SD_UNIT" || true)
    src=$(sd_prop SourcePath "$SD_UNIT")
    frag=$(sd_prop FragmentPath "$SD_UNIT")
    after=$(sd_prop After "$SD_UNIT")
    # Monotonic µs: /scratch was mounted before mounting /mnt began.
    scratch_up=$(sd_prop ActiveEnterTimestampMonotonic scratch.mount)
    mnt_start=$(sd_prop InactiveExitTimestampMonotonic "$SD_UNIT")
    dev=$(grep " $MNT " /proc/mounts | cut -d' ' -f1 || true)
    fstype=$(grep " $MNT " /proc/mounts | cut -d' ' -f3 || true)
    echo "$dev" > "$STATE/sd.dev"
    devunit="dev-${dev#/dev/}.device"
    devstate=$(systemctl is-active "$devunit" || true)
    pdio list | tee "$STATE/sd.list"
    detail "PID 1 is $pid1; $SD_UNIT $state, generated from $src ($frag); $dev ($fstype) on $MNT; scratch.mount up at ${scratch_up}us, $SD_UNIT started at ${mnt_start}us; $devunit $devstate"
    [ "$pid1" = systemd ]
    [ "$state" = active ]
    [ "$src" = /etc/fstab ]
    [ "$frag" = "/run/systemd/generator/$SD_UNIT" ]
    case $dev in /dev/nbd[0-9]*) ;; *) echo "not an nbd device on $MNT: '$dev'"; return 1 ;; esac
    case " $after " in *" scratch.mount "*) ;; *) echo "$SD_UNIT is not After=scratch.mount"; return 1 ;; esac
    [ "$scratch_up" -gt 0 ]
    [ "$scratch_up" -le "$mnt_start" ]
    grep -q '^autoclear=1$' "$(sd_rec)"
    grep -q "^$dev  *$SD_IMG " "$STATE/sd.list"
}

sd_files() {
    mounted
    mnt_verify_files 20
    head -c 300001 /dev/urandom > "$MNT/written-under-systemd"
    (cd "$MNT" && sha256sum written-under-systemd) > "$STATE/sd.new"
    sync
    detail "20 of 20 checksums match; wrote written-under-systemd (300001 bytes) and synced"
}

# mount(8) has exited; pdio's processes must not have gone with it.  They
# live in their own scope, pdio-SUPERVISOR.scope in pdio.slice, which
# systemd made for the supervisor (MemoryMin 4 MiB, the slice's at least
# that, neither stopped by shutdown.target), with PR_SET_IO_FLUSHER on
# every thread and oom_score_adj -1000; mnt.mount's cgroup is empty.
sd_alive() {
    sleep 5
    rec=$(sd_rec)
    server=$(sed -n 's/^server_pid=//p' "$rec")
    sup=$(sed -n 's/^supervisor_pid=//p' "$rec")
    cg=$(sd_prop ControlGroup "$SD_UNIT")
    cpid=$(sd_prop ControlPID "$SD_UNIT")
    sub=$(sd_prop SubState "$SD_UNIT")
    case $server in ''|0) echo "no server in $rec"; return 1 ;; esac
    case $sup in ''|0) echo "no supervisor in $rec"; return 1 ;; esac
    scope=pdio-$sup.scope
    scg=$(cgroup_of "$server")
    pcg=$(cgroup_of "$sup")
    procs=$(tr '\n' ' ' < "/sys/fs/cgroup$cg/cgroup.procs" 2>/dev/null || true)
    scope_cg=$(sd_prop ControlGroup "$scope")
    scope_state=$(systemctl is-active "$scope" || true)
    scope_min=$(sd_prop MemoryMin "$scope")
    scope_deps=$(sd_prop DefaultDependencies "$scope")
    slice_min=$(sd_prop MemoryMin pdio.slice)
    slice_deps=$(sd_prop DefaultDependencies pdio.slice)
    min=$(cat "/sys/fs/cgroup$scg/memory.min" 2>/dev/null || echo none)
    sf=$(flusher_of "$server") pf=$(flusher_of "$sup")
    so=$(cat "/proc/$server/oom_score_adj") po=$(cat "/proc/$sup/oom_score_adj")
    pdio list | tee "$STATE/sd.list"
    pdio list --json > "$STATE/sd.json"
    js=$(jq -c --arg dev "$(sd_dev)" '.nbddevices[] | select(.name == $dev) |
        [.io_flusher, .oom_score_adj, .cgroup]' "$STATE/sd.json")
    detail "5 s on: server $server ($(cat "/proc/$server/comm" 2>/dev/null || echo gone)) and supervisor $sup ($(cat "/proc/$sup/comm" 2>/dev/null || echo gone)) in $scg, $pcg; $scope $scope_state ($scope_cg, MemoryMin $scope_min, memory.min $min, DefaultDependencies $scope_deps); pdio.slice MemoryMin $slice_min, DefaultDependencies $slice_deps; IO_FLUSHER on $sf, $pf threads; oom_score_adj $so, $po; $cg holds: ${procs:-nothing}; mount(8) gone (ControlPID $cpid); $SD_UNIT $sub; pdio list: $(grep "^$(sd_dev) " "$STATE/sd.list" | awk '{print $NF}'), JSON $js"
    [ "$cpid" = 0 ]
    [ "$sub" = mounted ]
    [ "$(cat "/proc/$server/comm")" = pdio ]
    [ "$(cat "/proc/$sup/comm")" = pdio-supervise ]
    [ "$scope_state" = active ]
    [ "$scg" = "/pdio.slice/$scope" ]
    [ "$pcg" = "/pdio.slice/$scope" ]
    [ "$scope_cg" = "/pdio.slice/$scope" ]
    [ -z "$procs" ]
    [ "$scope_min" = 4194304 ]
    [ "$min" = 4194304 ]
    [ "$scope_deps" = no ]
    [ "$slice_deps" = no ]
    [ "$slice_min" -ge 4194304 ]
    [ "$sf" = all ] && [ "$pf" = all ]
    [ "$so" = -1000 ] && [ "$po" = -1000 ]
    [ "$js" = "[true,-1000,\"/pdio.slice/$scope\"]" ]
    grep -q "^$(sd_dev)  *$SD_IMG .* ok$" "$STATE/sd.list"
    echo "$scope" > "$STATE/sd.scope"
}

# systemd's umount: the device disconnects (autoclear) and the supervisor
# takes the server and the state with it.
sd_stop() {
    rec=$(sd_rec)
    server=$(sed -n 's/^server_pid=//p' "$rec")
    sup=$(sed -n 's/^supervisor_pid=//p' "$rec")
    cg=$(sd_prop ControlGroup "$SD_UNIT")
    t0=$(cut -d' ' -f1 /proc/uptime)
    systemctl stop "$SD_UNIT"
    t1=$(cut -d' ' -f1 /proc/uptime)
    state=$(systemctl is-active "$SD_UNIT" || true)
    result=$(sd_prop Result "$SD_UNIT")
    still=""
    if mounted; then still="still mounted"; fi
    MT_IMG=$SD_IMG
    gone=yes
    mt_all_gone || gone=no
    left=""
    if [ -f "/sys/fs/cgroup$cg/cgroup.procs" ]; then
        left=$(tr '\n' ' ' < "/sys/fs/cgroup$cg/cgroup.procs")
    fi
    # The scope goes once it is empty.
    scope=$(cat "$STATE/sd.scope" 2>/dev/null || echo "pdio-$sup.scope")
    wait_until 10 sh -c '! systemctl is-active --quiet "$1"' _ "$scope" || true
    scope_state=$(systemctl is-active "$scope" || true)
    detail "systemctl stop took $(echo "$t0 $t1" | awk '{printf "%.1f", $2 - $1}') s: $SD_UNIT $state (result $result) ${still:-unmounted}; device, server $server, supervisor $sup, state all gone: $gone; left in $cg: ${left:-nothing}; $scope $scope_state; pdio.slice MemoryMin $(sd_prop MemoryMin pdio.slice); fincore $(cat "$STATE/mt.pages" 2>/dev/null) pages"
    [ -z "$still" ]
    [ "$state" = inactive ]
    [ "$result" = success ]
    [ "$gone" = yes ]
    [ -z "$left" ]
    [ "$scope_state" = inactive ]
    proc_gone "$server"
    proc_gone "$sup"
}

# What was written under systemd is in the image: mounted again, read-only,
# somewhere else; then nothing left again, and e2fsck (last: it reads the
# image through the page cache) finds it clean.
sd_written() {
    mkdir -p "$SD_CHECK"
    $MOUNT -t pdio -o ro "$SD_IMG" "$SD_CHECK"
    grep " $SD_CHECK " /proc/mounts
    (cd "$SD_CHECK" && sha256sum -c "$STATE/sd.new")
    (cd "$SD_CHECK" && sha256sum -c "$STATE/sums" > "$STATE/check.out")
    ok=$(grep -c ': OK$' "$STATE/check.out")
    $UMOUNT "$SD_CHECK"
    MT_IMG=$SD_IMG
    mt_all_gone
    e2fsck -fn "$SD_IMG"
    detail "mount -t pdio -o ro on $SD_CHECK: written-under-systemd matches, $ok of 20 files too; nothing left after umount; e2fsck -fn clean"
    [ "$ok" = 20 ]
}

# Shutdown's order: stopping the filesystem the image is on stops $SD_UNIT
# first (systemd ordered it after), then unmounts /scratch, which must
# not be busy: nothing of pdio may hold the image any more by then.
sd_order() {
    systemctl start "$SD_UNIT"
    mounted
    dev=$(grep " $MNT " /proc/mounts | cut -d' ' -f1)
    t0=$(cut -d' ' -f1 /proc/uptime)
    systemctl stop scratch.mount || true
    t1=$(cut -d' ' -f1 /proc/uptime)
    m=$(systemctl is-active "$SD_UNIT" || true)
    sc=$(systemctl is-active scratch.mount || true)
    sr=$(sd_prop Result scratch.mount)
    wait_until 15 fe_nothing_left || true
    # /scratch back for the rest of the run.
    if ! grep -q " /scratch " /proc/mounts; then systemctl start scratch.mount; fi
    detail "systemctl start $SD_UNIT mounted $dev again; systemctl stop scratch.mount (as at shutdown) took $(echo "$t0 $t1" | awk '{printf "%.1f", $2 - $1}') s: $SD_UNIT $m, scratch.mount $sc (result $sr)"
    [ "$m" = inactive ]
    [ "$sc" = inactive ]
    [ "$sr" = success ]
    fe_no_state
    fe_no_server
}

# pdio attach --autoclear where udev runs: udev probes the new device
# (blkid opens and closes it) a little after it is connected; attach waits
# for that (udevadm settle) before arming autoclear, or the probe's close
# would be the last one and detach it before anyone mounts it.
sd_autoclear_udev() {
    [ -S /run/udev/control ]
    grep -q " /scratch " /proc/mounts
    d=$(pdio attach --autoclear "$SD_IMG")
    i=${d#/dev/nbd}
    # Give a late probe its chance to close the device.
    sleep 2
    udevadm settle
    connected=no
    if fe_connected "$i"; then connected=yes; fi
    fs=$(udevadm info --query=property "$d" | sed -n 's/^ID_FS_TYPE=//p')
    used="not mounted"
    if [ "$connected" = yes ]; then
        $MOUNT -t ext4 -o ro "$d" "$MNT"
        (cd "$MNT" && sha256sum -c "$STATE/sd.new")
        $UMOUNT "$MNT"
        used="mounted, written-under-systemd checked, unmounted"
    fi
    MT_IMG=$SD_IMG
    gone=yes
    mt_all_gone || gone=no
    detail "pdio attach --autoclear: $d; udev probed it (ID_FS_TYPE=${fs:-none}); still connected 2 s later and after udevadm settle: $connected; $used; then device, server, supervisor and state gone: $gone"
    [ "$fs" = ext4 ]
    [ "$connected" = yes ]
    [ "$gone" = yes ]
}

sd_not_booted() { detail "not run: the setup failed, systemd was not started"; return 1; }

sd_step() {
    desc=$1; shift
    if [ "${SD_SKIP:-0}" = 1 ]; then step "$desc" sd_not_booted; else step "$desc" "$@"; fi
}

sd_checks() {
    sd_step "systemd: PID 1; the fstab line mounted at boot by the generated $SD_UNIT, after scratch.mount" sd_mounted
    sd_step "systemd: the image's 20 checksums verified on $MNT; a new file written, synced" sd_files
    sd_step "systemd: 5 s after mount(8) exited, server and supervisor alive in their own scope in pdio.slice (MemoryMin 4 MiB, no default dependencies), not $SD_UNIT's cgroup; PR_SET_IO_FLUSHER, oom_score_adj -1000; pdio list ok" sd_alive
    sd_step "systemd: systemctl stop $SD_UNIT: unmounted; no device, server, supervisor, state, cgroup process or scope left; fincore 0" sd_stop
    sd_step "systemd: mounted again (mount -t pdio -o ro elsewhere): the new file is there; nothing left; e2fsck clean" sd_written
    sd_step "systemd: systemctl start $SD_UNIT, then stop scratch.mount (shutdown's order): both unmount, nothing left" sd_order
    sd_step "systemd: with udev running, pdio attach --autoclear outlives udev's probe; mount, umount: then nothing left" sd_autoclear_udev
}

scenario_systemd() {
    step "systemd: image with 20 files on /scratch, fstab (scratch disk, pdio line), check unit; exec systemd" sd_setup
    if [ "${TAP_DRY:-0}" = 1 ]; then
        sd_checks
    elif [ -f "$STATE/sd.ready" ]; then
        sd_boot
    else
        SD_SKIP=1
        sd_checks
        SD_SKIP=0
    fi
}

# --- devices on demand; attach never races (scenario ondemand) ---------------
# nbd reloaded with nbds_max=2: pdio attach lets the kernel pick a free
# device or make one (NBD_CMD_CONNECT without an index), for 64 images at
# once; I/O on every one (ext4 on 16); the devices made on demand go when
# detached (NBD_CFLAG_DESTROY_ON_DISCONNECT); 32 attaches at once, then 32
# detaches; attaches of one image at once (its claim: exactly one wins,
# the others name its device and supervisor); an attach racing a detach.
# Figures, under TCG (slow in absolute terms; compare within the run):
# per-device PSS of server + supervisor after I/O and idleness, the time
# per pdio attach, and losetup -f --show's in the same guest.
#
# Shown to fail with run.sh --break (tests/vm/breaks.c):
#   no-reserve        the servers keep no pool reserve: the PSS step fails
#                     (each server's VmPin 0 kB, VmLck 0 kB)
#   attach-no-lock    no claim on the image: the one-image race fails (seen:
#                     none of the 8 won, as the losers' cleanup removed
#                     the server files all of them had named after the
#                     image; otherwise losers would not name the winner)
#   no-destroy-flag   devices made on demand are not destroyed on detach:
#                     every "nothing left" step fails (nbd2... remain)
OD_DIR=/scratch/od
OD_N=64             # images attached at once
OD_FS=16            # of which with ext4
OD_PAR=32           # attaches (and detaches) at once
OD_RACE=8           # attaches of one image at once
OD_SIZE=$((16 * 1024 * 1024))
OD_NBDS_MAX=2

od_now() { awk '{ printf "%d", $1 * 100 }' /proc/uptime; }   # centiseconds
od_secs() { echo "$(($1 / 100)).$(printf %02d $(($1 % 100)))"; }
od_img() { echo "$OD_DIR/i$1.img"; }
od_rec() { echo "$PDIO_RUN/${1#/dev/}.rec"; }
od_field() { sed -n "s/^$2=//p" "$(od_rec "$1")"; }
od_pss_kib() { awk '/^Pss:/ { print $2 }' "/proc/$1/smaps_rollup"; }
# Everything in pdio's run directory but its lock file.
od_state_left() { ls "$PDIO_RUN" 2>/dev/null | grep -vx lock || true; }
# nbdN past nbds_max: made on demand.
od_made() {
    for b in /sys/block/nbd*; do
        [ -e "$b" ] || continue
        i=${b#/sys/block/nbd}
        [ "$i" -lt "$OD_NBDS_MAX" ] || echo "nbd$i"
    done
}
od_none_made() { [ -z "$(od_made)" ]; }

# No state, server, supervisor or connected device; the devices made on
# demand gone (the kernel removes them a little after the disconnect).
od_nothing_left() {
    left=$(od_state_left)
    [ -z "$left" ] || { echo "left in $PDIO_RUN: $left"; return 1; }
    fe_no_server
    wait_until 10 od_none_made ||
        { echo "devices made on demand still there: $(od_made | tr '\n' ' ')"; return 1; }
    for b in /sys/block/nbd*; do
        [ ! -f "$b/pid" ] || { echo "$b still connected"; return 1; }
    done
}

# fincore 0 for the first N images.
od_fincore_zero() {
    i=0 cached=0
    while [ "$i" -lt "$1" ]; do
        cached=$((cached + $(fincore_pages "$(od_img "$i")")))
        i=$((i + 1))
    done
    echo "$cached"
}

od_setup() {
    fe_nothing_left || { echo "pdio state left by an earlier scenario"; return 1; }
    rmmod nbd
    insmod /modules/nbd.ko nbds_max="$OD_NBDS_MAX" max_part=15
    n=$(ls -d /sys/block/nbd* | wc -l)
    rm -rf "$OD_DIR"
    mkdir -p "$OD_DIR"
    i=0
    while [ "$i" -lt "$OD_N" ]; do
        truncate -s "$OD_SIZE" "$(od_img "$i")"
        i=$((i + 1))
    done
    detail "nbd reloaded with nbds_max=$OD_NBDS_MAX: $n devices; $OD_N sparse images of $((OD_SIZE >> 20)) MiB"
    [ "$n" = "$OD_NBDS_MAX" ]
}

od_attach_all() {
    : > "$STATE/od.devs"
    t0=$(od_now)
    i=0
    while [ "$i" -lt "$OD_N" ]; do
        d=$(pdio attach "$(od_img "$i")")
        echo "$i $d" >> "$STATE/od.devs"
        i=$((i + 1))
    done
    t=$(($(od_now) - t0))
    echo "$((t * 10 / OD_N))" > "$STATE/od.attach_ms"
    distinct=$(cut -d' ' -f2 "$STATE/od.devs" | sort -u | wc -l)
    made=$(od_made | wc -l)
    demand=$(grep -l '^on_demand=1$' "$PDIO_RUN"/nbd*.rec | wc -l)
    while read -r i d; do
        fe_connected "${d#/dev/nbd}" || { echo "$d not connected"; return 1; }
        [ "$(od_field "$d" image)" = "$(od_img "$i")" ]
    done < "$STATE/od.devs"
    detail "$distinct distinct devices in $(od_secs "$t") s, $(cat "$STATE/od.attach_ms") ms per attach (TCG); $made made on demand, as the records say ($demand)"
    [ "$distinct" = "$OD_N" ]
    [ "$made" = $((OD_N - OD_NBDS_MAX)) ]
    [ "$demand" = "$made" ]
}

# ext4 on the first OD_FS devices, all mounted at once: files written,
# unmounted, the devices' caches dropped, mounted again, verified.  The
# rest: 4 KiB of random data written and read back through the device
# (O_DIRECT), and found in the image itself (the shadow).
od_io() {
    : > "$STATE/od.mnts"
    while read -r i d; do
        [ "$i" -lt "$OD_FS" ] || continue
        m=/mnt/od$i
        mkdir -p "$m"
        mkfs.ext4 -F -q "$d"
        mount -t ext4 -o noinit_itable "$d" "$m"
        echo "$i $d $m" >> "$STATE/od.mnts"
    done < "$STATE/od.devs"
    while read -r i d m; do
        write_files "$m" 8 "$STATE/od.sums.$i" > /dev/null
    done < "$STATE/od.mnts"
    while read -r i d m; do
        umount "$m"
        blockdev --flushbufs "$d"
    done < "$STATE/od.mnts"
    fs=0
    while read -r i d m; do
        mount -t ext4 "$d" "$m"
        verify_files "$m" 8 "$STATE/od.sums.$i" > /dev/null
        umount "$m"
        fs=$((fs + 1))
    done < "$STATE/od.mnts"
    blk=0
    while read -r i d; do
        [ "$i" -ge "$OD_FS" ] || continue
        off=$((i * 37 % 4000 + 1))
        head -c 4096 /dev/urandom > "$STATE/od.blk"
        dd if="$STATE/od.blk" of="$d" bs=4096 seek="$off" count=1 oflag=direct conv=notrunc 2> /dev/null
        dd if="$d" of="$STATE/od.back" bs=4096 skip="$off" count=1 iflag=direct 2> /dev/null
        cmp "$STATE/od.blk" "$STATE/od.back"
        dd if="$(od_img "$i")" of="$STATE/od.shadow" bs=4096 skip="$off" count=1 iflag=direct 2> /dev/null
        cmp "$STATE/od.blk" "$STATE/od.shadow"
        blk=$((blk + 1))
    done < "$STATE/od.devs"
    detail "ext4 on $fs devices mounted at once, 8 files each verified after a remount; 4 KiB read back through $blk devices and from their images"
    [ "$fs" = "$OD_FS" ]
    [ "$blk" = $((OD_N - OD_FS)) ]
}

od_list() {
    pdio list --noheadings > "$STATE/od.list"
    rows=$(wc -l < "$STATE/od.list")
    ok=$(awk '$NF == "ok"' "$STATE/od.list" | wc -l)
    json=$(pdio list --json | grep -c '"name": "/dev/nbd')
    while read -r i d; do
        grep -q "^$d  *$(od_img "$i") " "$STATE/od.list" ||
            { echo "$d ($(od_img "$i")) not listed"; return 1; }
    done < "$STATE/od.devs"
    detail "$rows rows, $ok ok, $json in --json"
    [ "$rows" = "$OD_N" ]
    [ "$ok" = "$OD_N" ]
    [ "$json" = "$OD_N" ]
}

# Every device has its server and supervisor; their PSS summed once the
# device is idle (a worker gives its pool back, all but its reserve).
# The target is 4 MiB per idle device (server + supervisor PSS), each
# device on its own.  Each server (one worker: one connection) pins and
# locks its reserve and nothing more (as fe_idle_memory).
OD_PSS_MAX_KIB=4096
# One reading of every device's PSS and pinned memory; true if each is
# within its bound.
od_pss_read() {
    total=0 n=0 max=0 maxdev= bad=0 first_bad= dead=0
    while read -r i d; do
        s=$(od_field "$d" server_pid)
        v=$(od_field "$d" supervisor_pid)
        if [ "$(cat "/proc/$s/comm")" != pdio ] ||
           [ "$(cat "/proc/$v/comm")" != pdio-supervise ]; then
            dead=$((dead + 1))
            continue
        fi
        p=$(($(od_pss_kib "$s") + $(od_pss_kib "$v")))
        total=$((total + p))
        [ "$p" -le "$max" ] || { max=$p maxdev=$d; }
        pin=$(awk '/^VmPin:/ { print $2 }' "/proc/$s/status")
        lck=$(awk '/^VmLck:/ { print $2 }' "/proc/$s/status")
        if [ "$pin $lck" != "$FE_RESERVE_PIN_KB $FE_RESERVE_LCK_KB" ]; then
            bad=$((bad + 1))
            first_bad=${first_bad:-"$d: VmPin $pin kB, VmLck $lck kB"}
        fi
        n=$((n + 1))
    done < "$STATE/od.devs"
    [ "$dead" = 0 ] && [ "$max" -le "$OD_PSS_MAX_KIB" ] && [ "$bad" = 0 ]
}

# A server gives its pool back after WORKER_IDLE_SECS (5 s) without I/O,
# checked once a second; under TCG, with 128 processes and a loaded host,
# that can take longer than it says.  The bound is on the idle device, so
# wait for idleness (up to 60 s), then judge that reading.
od_pss() {
    t0=$(od_now)
    sleep 6
    while ! od_pss_read && [ $(($(od_now) - t0)) -lt 6000 ]; do
        sleep 2
    done
    echo "$((total / n))" > "$STATE/od.pss_kib"
    detail "read $(od_secs $(($(od_now) - t0))) s after the last I/O (TCG); $n servers and supervisors alive, $dead dead; PSS $((total / 1024)) MiB in all, $(cat "$STATE/od.pss_kib") KiB per device, at most $max KiB ($maxdev; limit $OD_PSS_MAX_KIB); each server's VmPin $FE_RESERVE_PIN_KB kB and VmLck $FE_RESERVE_LCK_KB kB${first_bad:+ but for $bad (first $first_bad)}"
    [ "$n" = "$OD_N" ]
    [ "$dead" = 0 ]
    [ "$max" -le "$OD_PSS_MAX_KIB" ]
    [ "$bad" = 0 ]
}

od_detach_all() {
    pdio detach --all
    od_nothing_left
    kept=$(ls -d /sys/block/nbd* | wc -l)
    cached=$(od_fincore_zero "$OD_N")
    detail "no device, server, supervisor or state left; $kept devices stay (the module's), the $((OD_N - OD_NBDS_MAX)) made on demand are gone; fincore: $cached pages of the $OD_N images"
    [ "$kept" = "$OD_NBDS_MAX" ]
    [ "$cached" = 0 ]
}

# The same images on loop devices, for comparison: util-linux's losetup
# finds or makes a device through /dev/loop-control.  By its path: the
# guest's busybox sh runs its own applet for a bare "losetup".
od_losetup() {
    losetup=/usr/sbin/losetup
    "$losetup" --version | grep -q util-linux
    : > "$STATE/od.loops"
    t0=$(od_now)
    i=0
    while [ "$i" -lt "$OD_N" ]; do
        "$losetup" -f --show "$(od_img "$i")" >> "$STATE/od.loops"
        i=$((i + 1))
    done
    t=$(($(od_now) - t0))
    echo "$((t * 10 / OD_N))" > "$STATE/od.losetup_ms"
    n=$(sort -u "$STATE/od.loops" | wc -l)
    while read -r l; do "$losetup" -d "$l"; done < "$STATE/od.loops"
    detail "$n loop devices in $(od_secs "$t") s, $(cat "$STATE/od.losetup_ms") ms per losetup -f --show (TCG)"
    [ "$n" = "$OD_N" ]
}

od_concurrent_attach() {
    t0=$(od_now)
    i=0
    while [ "$i" -lt "$OD_PAR" ]; do
        (rc=0; pdio attach "$(od_img "$i")" > "$STATE/od.c$i" 2> "$STATE/od.e$i" || rc=$?
         echo "$rc" > "$STATE/od.r$i") &
        i=$((i + 1))
    done
    wait
    t=$(($(od_now) - t0))
    echo "$t" > "$STATE/od.par_cs"
    i=0 failed=0
    : > "$STATE/od.devs"
    while [ "$i" -lt "$OD_PAR" ]; do
        if [ "$(cat "$STATE/od.r$i")" != 0 ]; then
            cat "$STATE/od.e$i"
            failed=$((failed + 1))
        else
            echo "$i $(cat "$STATE/od.c$i")" >> "$STATE/od.devs"
        fi
        i=$((i + 1))
    done
    distinct=$(cut -d' ' -f2 "$STATE/od.devs" | sort -u | wc -l)
    ok=$(pdio list --noheadings | awk '$NF == "ok"' | wc -l)
    detail "$OD_PAR at once in $(od_secs "$t") s (TCG): $failed failed, $distinct distinct devices, $ok ok in pdio list"
    [ "$failed" = 0 ]
    [ "$distinct" = "$OD_PAR" ]
    [ "$ok" = "$OD_PAR" ]
}

od_concurrent_detach() {
    i=0
    while [ "$i" -lt "$OD_PAR" ]; do
        (rc=0; pdio detach "$(od_img "$i")" 2> "$STATE/od.e$i" || rc=$?
         echo "$rc" > "$STATE/od.r$i") &
        i=$((i + 1))
    done
    wait
    i=0 failed=0
    while [ "$i" -lt "$OD_PAR" ]; do
        if [ "$(cat "$STATE/od.r$i")" != 0 ]; then
            cat "$STATE/od.e$i"
            failed=$((failed + 1))
        fi
        i=$((i + 1))
    done
    od_nothing_left
    cached=$(od_fincore_zero "$OD_PAR")
    detail "$failed failed; nothing left; fincore: $cached pages"
    [ "$failed" = 0 ]
    [ "$cached" = 0 ]
}

# OD_RACE attaches of one image at once: one wins; every other one is
# refused naming the winner's device and its supervisor's pid.
od_one_image() {
    img=$(od_img 0)
    i=0
    while [ "$i" -lt "$OD_RACE" ]; do
        (rc=0; pdio attach "$img" > "$STATE/od.c$i" 2> "$STATE/od.e$i" || rc=$?
         echo "$rc" > "$STATE/od.r$i") &
        i=$((i + 1))
    done
    wait
    won=0 dev=""
    i=0
    while [ "$i" -lt "$OD_RACE" ]; do
        if [ "$(cat "$STATE/od.r$i")" = 0 ]; then
            won=$((won + 1))
            dev=$(cat "$STATE/od.c$i")
        fi
        i=$((i + 1))
    done
    [ "$won" = 1 ] || { echo "$won attaches won"; return 1; }
    sup=$(od_field "$dev" supervisor_pid)
    named=0
    i=0
    while [ "$i" -lt "$OD_RACE" ]; do
        if [ "$(cat "$STATE/od.r$i")" != 0 ]; then
            cat "$STATE/od.e$i"
            [ "$(cat "$STATE/od.r$i")" = 1 ]
            if grep -qF "pdio attach: $img: already attached to $dev by pid $sup (pdio detach $dev)" "$STATE/od.e$i"; then
                named=$((named + 1))
            fi
        fi
        i=$((i + 1))
    done
    records=$(ls "$PDIO_RUN"/*.rec | wc -l)
    pdio detach "$img"
    od_nothing_left
    detail "1 of $OD_RACE won ($dev); $named refused naming $dev and supervisor $sup; $records record(s); then nothing left"
    [ "$named" = $((OD_RACE - 1)) ]
    [ "$records" = 1 ]
}

# An attach of an image racing its detach, and attaches of other images
# racing both (the kernel hands out the number just freed): whatever the
# order, every attach that succeeded is whole (listed ok, its device
# connected), and detach --all then leaves nothing.
od_attach_detach_race() {
    d0=$(pdio attach "$(od_img 0)")
    (rc=0; pdio detach "$(od_img 0)" 2> "$STATE/od.ed" || rc=$?; echo "$rc" > "$STATE/od.rd") &
    i=0
    while [ "$i" -lt 8 ]; do
        (rc=0; pdio attach "$(od_img "$i")" > "$STATE/od.c$i" 2> "$STATE/od.e$i" || rc=$?
         echo "$rc" > "$STATE/od.r$i") &
        i=$((i + 1))
    done
    wait
    cat "$STATE/od.ed"
    [ "$(cat "$STATE/od.rd")" = 0 ]
    won=0
    i=0
    while [ "$i" -lt 8 ]; do
        if [ "$(cat "$STATE/od.r$i")" = 0 ]; then
            d=$(cat "$STATE/od.c$i")
            fe_connected "${d#/dev/nbd}" || { echo "$d not connected"; return 1; }
            [ "$(od_field "$d" image)" = "$(od_img "$i")" ]
            won=$((won + 1))
        else
            cat "$STATE/od.e$i"
            # Only image 0's attach may lose: to the attachment its
            # detach was tearing down.
            [ "$i" = 0 ]
        fi
        i=$((i + 1))
    done
    ok=$(pdio list --noheadings | awk '$NF == "ok"' | wc -l)
    pdio detach --all
    od_nothing_left
    detail "detach of $d0 and 8 attaches at once: $won attached, $ok ok in pdio list; after detach --all nothing left"
    [ "$ok" = "$won" ]
}

# --device still works: a module's device (it stays after detach) and one
# past nbds_max that the kernel makes for it (destroyed on detach).
od_device() {
    d1=$(pdio attach --device /dev/nbd1 "$(od_img 1)")
    d2=$(pdio attach --device /dev/nbd40 "$(od_img 2)")
    [ "$d1" = /dev/nbd1 ]
    [ "$d2" = /dev/nbd40 ]
    fe_connected 1
    fe_connected 40
    [ "$(od_field "$d2" on_demand)" = 1 ]
    [ "$(od_field "$d1" on_demand)" = 0 ]
    rc=0; pdio attach --device /dev/nbd1 "$(od_img 3)" 2> "$STATE/od.e" || rc=$?
    cat "$STATE/od.e"
    [ "$rc" = 1 ]
    grep -qF "pdio attach: /dev/nbd1: is in use: $(od_img 1) is attached to it" "$STATE/od.e"
    pdio detach /dev/nbd1
    pdio detach "$(od_img 2)"
    od_nothing_left
    [ -e /sys/block/nbd1 ]
    detail "$d1 (the module's) and $d2 (made for it) attached; a second attach of $d1 refused naming its image; after detach nbd1 stays, nbd40 is gone"
}

od_restore() {
    fe_nothing_left
    rmmod nbd
    insmod /modules/nbd.ko max_part=15
    n=$(ls -d /sys/block/nbd* | wc -l)
    rm -rf "$OD_DIR"
    detail "nbd reloaded as at boot: $n devices"
    [ "$n" = 16 ]
}

scenario_ondemand() {
    step "ondemand: nbd with nbds_max=$OD_NBDS_MAX, $OD_N images" od_setup
    step "ondemand: $OD_N pdio attach, one after another: distinct devices, made on demand past nbds_max" od_attach_all
    step "ondemand: ext4 on $OD_FS at once, files verified; 4 KiB read back on the rest, and in the images" od_io
    step "ondemand: pdio list and --json show all $OD_N" od_list
    step "ondemand: every device's server and supervisor alive; PSS after I/O and idleness at most 4 MiB per device, each server pinning its reserve and nothing more" od_pss
    step "ondemand: pdio detach --all: no device (made ones destroyed), server, supervisor or state; fincore 0" od_detach_all
    step "ondemand: losetup -f --show on the same $OD_N images, for comparison" od_losetup
    step "ondemand: $OD_PAR pdio attach at once: all succeed, distinct devices" od_concurrent_attach
    step "ondemand: $OD_PAR pdio detach at once: all succeed, nothing left, fincore 0" od_concurrent_detach
    step "ondemand: $OD_RACE attaches of one image at once: one wins, the others name its device and pid" od_one_image
    step "ondemand: attaches racing a detach: every attach whole, then nothing left" od_attach_detach_race
    step "ondemand: --device: a module's device stays after detach, one the kernel made for it goes" od_device
    step "ondemand: nbd reloaded as at boot" od_restore
    # The figures together (TCG: compare within the run).
    if [ -f "$STATE/od.attach_ms" ] && [ -f "$STATE/od.losetup_ms" ]; then
        tap_diag "ondemand (TCG): pdio attach $(cat "$STATE/od.attach_ms") ms per device, losetup -f --show $(cat "$STATE/od.losetup_ms") ms ($OD_N one after another)"
    fi
    if [ -f "$STATE/od.par_cs" ]; then
        tap_diag "ondemand (TCG): $OD_PAR pdio attach at once took $(od_secs "$(cat "$STATE/od.par_cs")") s"
    fi
    if [ -f "$STATE/od.pss_kib" ]; then
        tap_diag "ondemand: PSS per attached device (server + supervisor, idle after I/O): $(cat "$STATE/od.pss_kib") KiB; a loop device has no process"
    fi
}

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
# serving $TLS_IMG (made fresh by tls_image), with the usual wrapper files.
tls_serve() {
    tag=tls-$1; shift
    rm -f "$STATE/nbdkit.rc" "$STATE/nbdkit.pid"
    echo "$tag" > "$STATE/tag"
    echo "$TLS_IMG" > "$STATE/img"
    log "pdio serve --port $TLS_PORT --bind 127.0.0.1 $* $TLS_IMG"
    sh -c 'pidfile=$1 rcfile=$2; shift 2
           pdio serve "$@" & echo $! > "$pidfile"
           wait $!; echo $? > "$rcfile"' \
        pdio-wrapper "$STATE/nbdkit.pid" "$STATE/nbdkit.rc" \
        --port "$TLS_PORT" --bind 127.0.0.1 "$@" "$TLS_IMG" \
        > "$LOGS/nbdkit-$tag.log" 2>&1 &
    ready() { grep -q '^uri: ' "$LOGS/nbdkit-$tag.log"; }
    wait_until 60 serving
    grep '^uri: ' "$LOGS/nbdkit-$tag.log"
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

# nbd-client without -enable-tls: the server must not serve it.
tls_plain_refused() {
    lines=$(wc -l < "$LOGS/nbdkit-$(cat "$STATE/tag").log")
    rc=0
    nbd-client 127.0.0.1 "$TLS_PORT" "$DEV" -b 512 || rc=$?
    # The server logs it once the client has gone.
    wait_until 10 grep -q 'refused: a client asked for the export without TLS' \
        "$LOGS/nbdkit-$(cat "$STATE/tag").log" || :
    log_new=$(tail -n +$((lines + 1)) "$LOGS/nbdkit-$(cat "$STATE/tag").log")
    echo "$log_new"
    if [ -f /sys/block/nbd0/pid ]; then
        nbd-client -d "$DEV"
        wait_until 10 nbd0_unsized
        echo "a plain nbd-client was served"
        return 1
    fi
    detail "nbd-client exit status $rc; server: $(echo "$log_new" | grep refused | head -n 1)"
    [ "$rc" != 0 ] && [ "$(cat /sys/block/nbd0/size)" = 0 ] &&
        echo "$log_new" | grep -q 'refused: a client asked for the export without TLS'
}

# The image after the run, with the server stopped: the raw region is the
# shadow, and the filesystem is clean.
tls_image_check() {
    dd if="$TLS_IMG" bs=1M skip="$TLS_RAW_MIB" count="$TLS_RAW_LEN_MIB" 2>/dev/null |
        cmp - "$STATE/tls.shadow"
    e2fsck -fn "$TLS_IMG"
    detail "raw region ($TLS_RAW_LEN_MIB MiB at $TLS_RAW_MIB MiB) matches its shadow, e2fsck -fn clean"
}

tls_stop() {
    tag=$(cat "$STATE/tag")
    kill -TERM "$(cat "$STATE/nbdkit.pid")"
    wait_until 30 test -f "$STATE/nbdkit.rc" || { echo "pdio serve did not exit"; return 1; }
    rc=$(cat "$STATE/nbdkit.rc")
    cat "$LOGS/nbdkit-$tag.log"
    crashes=$(grep -ciE 'assert|abort|segmentation|corrupt' "$LOGS/nbdkit-$tag.log" || :)
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
    lines=$(wc -l < "$LOGS/nbdkit-$(cat "$STATE/tag").log")
    rc=0
    tls_client bob || rc=$?
    wait_until 10 grep -q 'is not in --tls-authz' "$LOGS/nbdkit-$(cat "$STATE/tag").log" || :
    log_new=$(tail -n +$((lines + 1)) "$LOGS/nbdkit-$(cat "$STATE/tag").log")
    echo "$log_new"
    if [ -f /sys/block/nbd0/pid ]; then
        nbd-client -d "$DEV"
        wait_until 10 nbd0_unsized
        echo "bob's certificate was served"
        return 1
    fi
    wait_until 10 tls_no_proxy
    detail "nbd-client exit status $rc; server: $(echo "$log_new" | grep -i 'tls-authz' | head -n 1)"
    [ "$rc" != 0 ] && echo "$log_new" | grep -q 'is not in --tls-authz'
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

# --- scenarios in files of their own ------------------------------------------------
# /pdio/scenarios/*.sh (tests/vm/scenarios/ in the tree): each defines its
# scenario_NAME functions with the helpers above.
for f in /pdio/scenarios/*.sh; do
    # shellcheck disable=SC1090 # copied in by run.sh
    [ ! -f "$f" ] || . "$f"
done

# --- the scratch disk -----------------------------------------------------------------

scratch_setup() {
    if [ -s "$STATE/insmod.failed" ]; then
        detail "insmod failed: $(cat "$STATE/insmod.failed" | tr '\n' ' ')"
        return 1
    fi
    wait_until 30 test -b /dev/vda
    mkfs.ext4 -F -q /dev/vda
    mount -t ext4 /dev/vda /scratch
    mkdir -p "$LOGS"
    lbs=$(cat /sys/block/vda/queue/logical_block_size)
    detail "$(wc -l < /modules/order) modules loaded; /dev/vda $(($(cat /sys/block/vda/size) / 2097152)) GiB, logical block $lbs, ext4 on /scratch"
}

scratch_check() {
    sync
    umount /scratch
    e2fsck -fn /dev/vda
}

main() {
    step "guest: modules loaded, scratch virtio disk formatted and mounted" scratch_setup
    # native-NAME: scenario NAME with pdio's own server (FRONT=native).
    for s in $SCENARIOS; do
        s0=$(uptime_s)
        case $s in
        native-*) FRONT=native; "scenario_${s#native-}" ;;
        *) FRONT=nbdkit; "scenario_$s" ;;
        esac
        tap_diag "scenario $s: $(($(uptime_s) - s0))s"
    done
    main_end
}

# (The systemd scenario's unit runs this after its own steps.)
main_end() {
    FRONT=nbdkit
    # The figures together, at the end of the report.
    for s in $SCENARIOS; do
        [ -f "$STATE/fincore.pdio.$s" ] && tap_diag "fincore after $s (pdio): $(cat "$STATE/fincore.pdio.$s") pages"
    done
    step "guest: scratch filesystem unmounts and e2fsck -fn is clean" scratch_check
}

finish() {
    tap_summary
    poweroff_now
}

export FIO_SIZE FIO_JOBS=4

if [ "$PHASE" = systemd ]; then
    # Under systemd, from pdio-boot-check.service: the rest of the run.
    TAP_DRY=0
    # shellcheck disable=SC1091 # the tap_* counters, s0, sd_t0 from sd_boot
    . "$STATE/sd.resume"
    touch "$STATE/sd.started"
    sd_checks
    # shellcheck disable=SC2154 # sd_t0 from sd.resume
    tap_diag "scenario systemd: $(($(uptime_s) - s0))s (systemd PID 1 from ${sd_t0}s of uptime)"
    main_end
    touch "$STATE/sd.done"
    finish
fi

TAP_DRY=1
main
plan=$tap_n
tap_n=0
TAP_DRY=0
tap_plan "$plan"
log "plan: $plan steps; scenarios: $SCENARIOS"
main
finish
