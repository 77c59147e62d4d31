# SPDX-License-Identifier: BSD-3-Clause
# tests/lib/guest.sh: the helpers of the VM guest's scenarios
# (tests/vm/scenarios/NAME.sh), on top of tap.sh.  Plain POSIX sh (busybox
# ash).  tests/vm/run.sh carries tests/lib into the initramfs as /pdio/lib;
# the guest's /init (tests/vm/guest-init.sh) sources tap.sh and this file,
# sets the variables below, sources every scenario and runs the ones asked
# for.  It only defines functions and constants.
#
# Set by the init:
#   STATE     the tests' own state (tmpfs); a step's results that outlive
#             it live here
#   LOGS      logs on the scratch disk (servers' output, fio's)
#   PDIO_RUN  pdio's run directory (its records, nbdN.*): only read
#   DEV MNT   /dev/nbd0, and where scenarios mount
#   SOCK IMG_SIZE FILES FIO_SIZE FIO_JOBS HOST_NBDKIT_VERSION
# Set by the init for each scenario it runs:
#   SCENARIO  its name as run (such as ext4 or nbdkit-ext4): its steps'
#             label, its server's log name
#   SERVER    the server that serves the scenario's devices: native (pdio
#             serve, the default) or nbdkit (nbdkit with pdio.so); from
#             PDIO_TEST_SERVER, or nbdkit for a scenario run as nbdkit-NAME
#
# Each step is one TAP line: step DESC CMD [ARGS...] (tap.sh's tap_case:
# CMD runs in a subshell with set -e).  The init runs the scenarios twice,
# a dry pass (TAP_DRY=1) that only counts steps for the plan, then the real
# one: a scenario function only calls step, it does no work itself.

log() { echo "pdio-guest: $*"; }
uptime_s() { cut -d' ' -f1 /proc/uptime | cut -d. -f1; }

step() { tap_case "$@"; }

# --- the server under test ----------------------------------------------------------

# What the steps call it, what pdio attach is told, and its processes' comm.
srv_name() { if [ "$SERVER" = nbdkit ]; then echo "nbdkit pdio.so"; else echo "pdio serve"; fi; }
srv_attach_flags() { if [ "$SERVER" = nbdkit ]; then echo --nbdkit; fi; }
srv_comm() { if [ "$SERVER" = nbdkit ]; then echo nbdkit; else echo pdio; fi; }

# srv_spawn TAG CMD [ARGS...]: run a server, CMD in the foreground, in the
# background under a wrapper that records its pid ($STATE/server.pid) and,
# once it exits, its status ($STATE/server.rc); its output goes to
# $LOGS/server-TAG.log, which srv_log names.
srv_spawn() {
    tag=$1; shift
    rm -f "$STATE/server.rc" "$STATE/server.pid"
    echo "$tag" > "$STATE/tag"
    log "$*"
    sh -c 'pidfile=$1 rcfile=$2; shift 2
           "$@" & echo $! > "$pidfile"
           wait $!; echo $? > "$rcfile"' \
        server-wrapper "$STATE/server.pid" "$STATE/server.rc" "$@" \
        > "$LOGS/server-$tag.log" 2>&1 &
}
srv_log() { echo "$LOGS/server-$(cat "$STATE/tag").log"; }

# For wait_until, with ready() defined by the caller: the server serves;
# the step fails if it has exited.
serving() {
    ready && return 0
    [ -f "$STATE/server.rc" ] || return 1
    cat "$(srv_log)"
    exit 1
}

# srv_term: SIGTERM the server srv_spawn ran and wait for it; its log
# printed, its exit status in $rc.
srv_term() {
    kill -TERM "$(cat "$STATE/server.pid")"
    wait_until 30 test -f "$STATE/server.rc" || { echo "the server did not exit"; return 1; }
    rc=$(cat "$STATE/server.rc")
    cat "$(srv_log)"
}

# serve_stop: srv_term, and the server must exit 0 with no error line in
# its log.
serve_stop() {
    srv_term
    log=$(srv_log)
    # Debian 12's nbdkit 1.32.5 can abort when a client hangs up with replies
    # queued (fixed upstream in 1.33.10); say so precisely, still a failure.
    if nbdkit_send_abort "$log" "$HOST_NBDKIT_VERSION"; then
        detail "nbdkit $HOST_NBDKIT_VERSION aborted in raw_send_socket (known nbdkit 1.32.4-1.33.9 server bug)"
        return 1
    fi
    server_log_clean "$rc" "$log"
}

# --- one server, nbd-client and a filesystem: the round trips ------------------------

# serve TAG PLUGIN IMAGE [ARGS...]: a fresh sparse image and a server on
# $SOCK: for PLUGIN pdio, $SERVER's (pdio serve, given the plugin's
# parameters as its options, or nbdkit with pdio.so); for PLUGIN file,
# nbdkit's file plugin.  Checks what it advertises.
serve() {
    tag=$1 plugin=$2 img=$3; shift 3
    rm -f "$img" "$SOCK"
    truncate -s "$IMG_SIZE" "$img"
    echo "$img" > "$STATE/img"
    if [ "$plugin" = pdio ] && [ "$SERVER" = native ]; then
        opts=""
        for a in "$@"; do
            case $a in
            align=*) opts="$opts --align ${a#align=}" ;;
            backend=*) opts="$opts --backend ${a#backend=}" ;;
            *) echo "pdio serve has no equivalent of $a"; return 1 ;;
            esac
        done
        # shellcheck disable=SC2086
        srv_spawn "$tag" pdio serve --socket "$SOCK" $opts "$img"
        ready() { grep -q '^uri: ' "$(srv_log)"; }
    else
        case $plugin in
        pdio) p=/pdio/pdio.so ;;
        file) p='file' ;;
        esac
        srv_spawn "$tag" nbdkit -f -U "$SOCK" "$p" "file=$img" "$@"
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

# fs_check FS [DEVICE]: unmount $MNT, check FS on DEVICE (default $DEV).
fs_check() {
    fs=$1 d=${2:-$DEV}
    umount "$MNT"
    case $fs in
    ext4) e2fsck -fn "$d" ;;
    xfs) xfs_repair -n "$d" ;;
    esac
    # Drop the device's own cache so what follows reads through the server.
    blockdev --flushbufs "$d"
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
    [ -f "$STATE/server.pid" ] || { echo "no server has served $img"; return 1; }
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

attach_advertised() { attach "$(cat "$STATE/dioblock")" "$1"; }
# advertised_preferred SIZE: the server advertised that preferred block
# size (serve recorded it).
advertised_preferred() { [ "$(cat "$STATE/dioblock")" = "$1" ]; }

# The steps the round-trip scenarios share.

# serve_attach LABEL CONNECTIONS HOW: the steps that serve disk.img with
# pdio.so's parameters by $SERVER's server and attach /dev/nbd0 with the
# advertised preferred block size over CONNECTIONS (HOW says so).
serve_attach() {
    step "$1: $(srv_name) serving disk.img on a unix socket" serve "$1" pdio /scratch/disk.img
    step "$1: nbd-client attaches /dev/nbd0 $3" attach_advertised "$2"
}


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
    step "$1: $(srv_name) exits cleanly after SIGTERM, no errors logged" serve_stop
}

# --- pdio(1)'s devices: what is left of them --------------------------------------

# No pdio state (nbdN.sock/.pid/.rec/.log) left in $PDIO_RUN.
srv_no_state() {
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
srv_no_server() {
    left=$(server_pids)
    [ -z "$left" ] || { echo "a server is still running: $left"; return 1; }
    left=$(comm_pids pdio-supervise)
    [ -z "$left" ] || { echo "pdio-supervise still running: $left"; return 1; }
}
srv_connected() { [ -f "/sys/block/nbd$1/pid" ]; }
srv_disconnected() { ! srv_connected "$1"; }
# Nothing of pdio left: no state, no server, no supervisor.
srv_nothing_left() {
    [ -z "$(ls "$PDIO_RUN" | grep '^nbd[0-9]' || true)" ] &&
        [ -z "$(server_pids)" ] && [ -z "$(comm_pids pdio-supervise)" ]
}

# util-linux mount(8), which runs helpers (busybox's applets win over PATH
# in the guest's shell, and its mount does not).
MOUNT=/usr/bin/mount UMOUNT=/usr/bin/umount

# srv_all_gone IMAGE: nothing of an autoclear device left: not connected,
# no record, no server, no supervisor, 0 pages of IMAGE cached (the count
# in $STATE/all_gone.pages).
srv_all_gone() {
    wait_until 15 srv_nothing_left ||
        { ls -l "$PDIO_RUN"; srv_no_state; srv_no_server; return 1; }
    for b in /sys/block/nbd*; do
        [ ! -f "$b/pid" ] || { echo "$b still connected"; return 1; }
    done
    pages=$(fincore_pages "$1")
    echo "$pages" > "$STATE/all_gone.pages"
    [ "$pages" = 0 ]
}

# --- what protects a device's processes --------------------------------------------

# What an idle server keeps pinned: its one worker's 2 MiB pool chunk,
# registered (VmPin) and locked with the chunk's two pages of allocator
# bookkeeping (VmLck), so that the first write after idle allocates
# nothing.
SRV_RESERVE_PIN_KB=2048
SRV_RESERVE_LCK_KB=$((SRV_RESERVE_PIN_KB + 8))

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

# --- a mounted device whose server is replaced under fio -------------------------
# The recover, handover and crash scenarios (resize too): a device pdio
# attach made (rc_attach_fs), ext4 on it, fio verifying in a loop beside a
# probe writer while the server is replaced, the pauses and errors counted.
RC_IMG=/scratch/rc.img
RC_SIZE=$((256 * 1024 * 1024))
RC_TIMEOUT=8        # kernel request timeout: the pause at a restart
RC_DEAD=40          # dead-connection timeout
RC_FIO_SIZE=${RC_FIO_SIZE:-4m}

rc_dev() { cat "$STATE/rc.dev"; }
rc_idx() { d=$(rc_dev); echo "${d#/dev/nbd}"; }
# rc_field KEY: the value in the device's pdio record.
rc_field() { sed -n "s/^$1=//p" "$PDIO_RUN/nbd$(rc_idx).rec"; }

# rc_attach_fs [OPTION...]: pdio attach (--nbdkit for SERVER=nbdkit) of a
# fresh $RC_IMG with OPTIONs, ext4 on it, mounted on $MNT; the record
# names a server of $SERVER's.
rc_attach_fs() {
    rm -f "$RC_IMG"
    truncate -s "$RC_SIZE" "$RC_IMG"
    echo "$RC_IMG" > "$STATE/img"
    # shellcheck disable=SC2046
    pdio attach $(srv_attach_flags) "$@" "$RC_IMG" > "$STATE/rc.dev"
    mkfs.ext4 -F -q "$(rc_dev)"
    mount -t ext4 -o noinit_itable "$(rc_dev)" "$MNT"
    mkdir -p "$MNT/fio"
    [ "$(cat "/proc/$(rc_field server_pid)/comm")" = "$(srv_comm)" ] ||
        { echo "the server is not $(srv_name)'s"; return 1; }
}

# I/O errors the kernel logged for nbd devices since kmsg_reset (which
# empties the ring buffer, so that a full buffer cannot hide new lines; the
# console keeps everything).
nbd_io_errors() { dmesg | grep -c 'I/O error.*nbd\|nbd.*I/O error' || true; }
kmsg_reset() { dmesg -c > /dev/null; }

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

# End rc_fio_loop and rc_probe, and wait for both.
rc_io_stop() {
    touch "$STATE/rc.stop"
    wait "$(cat "$STATE/rc.fiopid")" 2>/dev/null || true
    wait "$(cat "$STATE/rc.probepid")" 2>/dev/null || true
    wait_until 300 test -f "$STATE/rc.fioruns" || { echo "fio loop did not end"; return 1; }
}

# rc_io_end TAG: rc_io_stop, then what the runs of TAG and the
# supervisor left: $maxlat (fio's largest completion latency) and
# $fioerrs, $runs, and the record's $restarts and $reason; pdio list
# --json in rc.json.
rc_io_end() {
    rc_io_stop
    pdio list
    pdio list --json > "$STATE/rc.json"
    cat "$STATE/rc.json"
    set -- $(rc_fio_figures "$1")
    maxlat=$1 fioerrs=$2
    restarts=$(rc_field restarts)
    reason=$(rc_field reason)
    runs=$(cat "$STATE/rc.fioruns")
}

# rc_io_clean RESTARTS: after rc_io_end, no fio run or probe write
# failed, and the record and pdio list --json count RESTARTS.
rc_io_clean() {
    [ ! -s "$STATE/rc.fiofail" ] || { cat "$STATE/rc.fiofail"; return 1; }
    [ "$fioerrs" = 0 ]
    [ "$restarts" = "$1" ]
    grep -q "\"restarts\": $restarts" "$STATE/rc.json"
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
    rc_io_end "$how"
    grep "pdio-supervise" "$PDIO_RUN/nbd$(rc_idx).supervisor.log" | tail -n "$count" || true
    handed=$(grep -o 'died\|[0-9]* ms after' "$PDIO_RUN/nbd$(rc_idx).supervisor.log" |
        grep ms | tail -n "$count" | sed 's/ ms after//' | tr '\n' ' ')
    errs=$(($(nbd_io_errors) - errs0))
    pauses=$(rc_pauses)
    tap_diag "$how x$count: filesystem paused ${pauses}ms at the replacements (probe writes); supervisor handed over new connections ${handed}ms after each death; fio $runs runs, $fioerrs errors, max completion latency ${maxlat} ms; kernel I/O errors: $errs"
    detail "restarts $r0 -> $restarts (last: $reason); pauses ${pauses}ms; new connections after ${handed}ms; fio: $runs runs, $fioerrs errors, max latency $maxlat ms; kernel I/O errors $errs"
    rc_io_clean $((r0 + count))
    [ "$errs" = 0 ]
    case $how in
    kill) [ "$reason" = "server killed by SIGKILL" ] ;;
    abort) case $reason in "server killed by SIGABRT"*) ;; *) return 1 ;; esac ;;
    # pdio's own server hands its connections over (scenario handover);
    # nbdkit is killed and replaced.
    restart) if [ "$SERVER" = nbdkit ]; then
                 [ "$reason" = "pdio restart" ]
             else
                 [ "$reason" = "pdio restart: live connections handed over" ]
             fi ;;
    esac
}

# The end of the device rc_attach_fs made.
rc_detach() {
    umount "$MNT"
    e2fsck -fn "$(rc_dev)"
    pdio detach "$(rc_dev)"
    srv_no_state
    srv_no_server
}
