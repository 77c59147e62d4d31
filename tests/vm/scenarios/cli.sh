# SPDX-License-Identifier: BSD-3-Clause
# --- pdio(1), the command-line interface ----------------------------------------------
# pdio attach/list/detach as a user runs them: the plugin from $PDIO_PLUGIN,
# state in pdio's own run directory, $PDIO_RUN (nbdN.*: read here, never
# written).  The image is a fresh sparse file.
CLI_IMG=/scratch/cli.img
CLI_IMG2=/scratch/cli2.img
CLI_SIZE=$((256 * 1024 * 1024))
CLI_FILES=60

cli_dev() { cat "$STATE/cli.dev"; }
cli_idx() { d=$(cli_dev); echo "${d#/dev/nbd}"; }
# The pid of the server pdio's record names.
cli_pid() { sed -n 's/^server_pid=//p' "$PDIO_RUN/nbd$(cli_idx).rec"; }

cli_attach() {
    rm -f "$CLI_IMG" "$CLI_IMG2"
    truncate -s "$CLI_SIZE" "$CLI_IMG"
    truncate -s "$CLI_SIZE" "$CLI_IMG2"
    echo "$CLI_IMG" > "$STATE/img"
    echo cli > "$STATE/tag"
    pdio attach "$CLI_IMG" > "$STATE/cli.dev"
    cat "$STATE/cli.dev"
    i=$(cli_idx)
    srv_connected "$i"
    size=$(($(cat "/sys/block/nbd$i/size") * 512))
    lbs=$(cat "/sys/block/nbd$i/queue/logical_block_size")
    queues=$(ls "/sys/block/nbd$i/mq" | wc -l)
    pid=$(cli_pid)
    maxkb=$(cat "/sys/block/nbd$i/queue/max_sectors_kb")
    detail "$(cli_dev), $((size / 1048576)) MiB, pdio attach chose logical block $lbs, $queues connection(s), requests up to $maxkb KiB, server pid $pid"
    case $(cli_dev) in /dev/nbd[0-9]*) ;; *) return 1 ;; esac
    [ "$size" = "$CLI_SIZE" ]
    [ "$lbs" = 512 ]
    [ "$queues" = 1 ]                          # one connection by default
    # pdio serve advertises 32 MiB: attach raises the driver's 128 KiB to
    # its own cap, 1 MiB (pdio.h, MAX_REQUEST_BYTES).
    [ "$maxkb" = 1024 ]
    [ "$(cat "/proc/$pid/comm")" = pdio ]      # pdio's own server by default
}

# The columns of the text and the fields of the JSON, against the facts.
cli_list() {
    pdio list > "$STATE/cli.list"
    cat "$STATE/cli.list"
    pid=$(cli_pid)
    head -n 1 "$STATE/cli.list" | grep -q '^NAME  *IMAGE  *RO  *CONNS  *BLOCK-SIZE  *DIO-ALIGN  *PID  *RESTARTS  *CACHED  *SIZE  *STATUS$'
    [ "$(wc -l < "$STATE/cli.list")" = 2 ]
    set -- $(sed -n 2p "$STATE/cli.list")
    [ "$1 $2 $3 $4 $5 $6 $7 $8 $9 ${10} ${11}" = "$(cli_dev) $CLI_IMG 0 1 512 512 $pid 0 0 $CLI_SIZE ok" ]
    pdio list --json > "$STATE/cli.json"
    cat "$STATE/cli.json"
    for kv in "\"name\": \"$(cli_dev)\"" "\"back-file\": \"$CLI_IMG\"" '"ro": false' \
              '"connections": 1' '"timeout": 0' '"block-size": 512' '"dio-align": 512' \
              "\"size\": $CLI_SIZE" "\"pid\": $pid" '"cached": 0' '"status": "ok"' \
              '"restarts": 0' '"reason": null'; do
        grep -qF "$kv" "$STATE/cli.json" || { echo "JSON lacks $kv"; return 1; }
    done
    head -n 2 "$STATE/cli.json" | tr -d ' \n' | grep -q '^{"nbddevices":\[$'
    # It parses (jq), with the front end and the memory of a live server
    # and supervisor (null where pdio list could not read them).
    jq -e --arg dev "$(cli_dev)" --arg img "$CLI_IMG" --argjson pid "$pid" '
        .nbddevices | length == 1 and (.[0] |
            .name == $dev and ."back-file" == $img and .pid == $pid and
            ."front-end" == "pdio" and .supervisor > 0 and
            ."server-rss" > 0 and ."server-pss" > 0 and
            ."supervisor-rss" > 0 and ."supervisor-pss" > 0)' \
        "$STATE/cli.json" > /dev/null || { echo "jq: not the device's JSON"; return 1; }
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
cli_idle_memory() {
    pid=$(cli_pid)
    end=$(($(uptime_s) + 300))
    while :; do
        pdio list --json > "$STATE/cli-mem.json"
        set -- $(jq -r '.nbddevices[0] | [."server-pss", ."supervisor-pss",
                        ."server-rss", ."supervisor-rss"] | map(tostring) |
                        join(" ")' "$STATE/cli-mem.json")
        for v in "$@"; do
            case $v in
            ''|*[!0-9]*) echo "not a byte count: $v"; cat "$STATE/cli-mem.json"; return 1 ;;
            esac
        done
        pin=$(awk '/^VmPin:/ { print $2 }' "/proc/$pid/status")
        lck=$(awk '/^VmLck:/ { print $2 }' "/proc/$pid/status")
        total=$(($1 + $2))
        [ "$total" -gt $((4 << 20)) ] || [ "$pin" != $SRV_RESERVE_PIN_KB ] ||
            [ "$lck" != $SRV_RESERVE_LCK_KB ] || break
        if [ "$(uptime_s)" -ge "$end" ]; then
            echo "after 300 s: PSS server $1 + supervisor $2 = $total bytes, VmPin $pin kB (want $SRV_RESERVE_PIN_KB), VmLck $lck kB (want $SRV_RESERVE_LCK_KB)"
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
cli_double() {
    pid=$(cli_pid)
    rc=0; pdio attach "$CLI_IMG" 2> "$STATE/cli.err" || rc=$?
    cat "$STATE/cli.err"
    [ "$rc" = 1 ]
    grep -q "already attached to $(cli_dev)" "$STATE/cli.err"
    # A hard link is the same image (its identity, not its path): the
    # image's claim refuses it, naming the device and the supervisor.
    sup=$(sed -n 's/^supervisor_pid=//p' "$PDIO_RUN/nbd$(cli_idx).rec")
    ln -f "$CLI_IMG" /scratch/cli-link.img
    rc=0; pdio attach /scratch/cli-link.img 2> "$STATE/cli.err" || rc=$?
    cat "$STATE/cli.err"
    [ "$rc" = 1 ]
    grep -qF "already attached to $(cli_dev) by pid $sup" "$STATE/cli.err"
    rm -f /scratch/cli-link.img
    rc=0; nbdkit -U /tmp/cli-direct.sock /pdio/pdio.so file="$CLI_IMG" --run true \
        2> "$STATE/cli.err" || rc=$?
    cat "$STATE/cli.err"
    [ "$rc" != 0 ]
    grep -q "is in use: pid $pid (pdio)" "$STATE/cli.err"
    # Still exactly one server and one device; no second record.
    [ "$(server_pids)" = "$pid" ]
    [ "$(ls "$PDIO_RUN"/*.rec | wc -l)" = 1 ]
    detail "refused: again and via a hard link (the image's claim, naming supervisor $sup), and by nbdkit pdio (naming server $pid)"
}

cli_fs() {
    mkfs.ext4 -F -q "$(cli_dev)"
    mount -t ext4 -o noinit_itable "$(cli_dev)" "$MNT"
    mnt_write_files "$CLI_FILES"
    umount "$MNT"
    blockdev --flushbufs "$(cli_dev)"
    mount -t ext4 "$(cli_dev)" "$MNT"
    mnt_verify_files "$CLI_FILES"
}

cli_detach_mounted() {
    rc=0; pdio detach "$(cli_dev)" 2> "$STATE/cli.err" || rc=$?
    cat "$STATE/cli.err"
    [ "$rc" = 1 ]
    grep -q "is mounted on $MNT" "$STATE/cli.err"
    srv_connected "$(cli_idx)"
    mounted
    detail "refused with: $(cat "$STATE/cli.err")"
}

cli_detach() {
    pid=$(cli_pid)
    umount "$MNT"
    pdio detach "$(cli_dev)"
    # (No "! cmd" here: set -e ignores it.)
    if srv_connected "$(cli_idx)"; then echo "still connected"; return 1; fi
    proc_gone "$pid"
    srv_no_state
    srv_no_server
    pages=$(fincore_pages "$CLI_IMG")
    detail "server $pid gone, no state left, fincore: $pages pages of $CLI_IMG resident"
    [ "$pages" = 0 ]
}

# Reattach at once (the lock of the server just stopped must be gone),
# plus a second image read-only with one connection; then --all.
cli_detach_all() {
    d1=$(pdio attach "$CLI_IMG")
    d2=$(pdio attach --nbdkit --read-only --connections 1 "$CLI_IMG2")
    pdio list
    i1=${d1#/dev/nbd} i2=${d2#/dev/nbd}
    p2=$(sed -n 's/^server_pid=//p' "$PDIO_RUN/nbd$i2.rec")
    [ "$(cat "/proc/$p2/comm")" = nbdkit ]
    [ "$(cat "/sys/block/nbd$i2/ro")" = 1 ]
    [ "$(ls "/sys/block/nbd$i2/mq" | wc -l)" = 1 ]
    pdio list | grep -q "^$d2  *$CLI_IMG2  *1  *1 "
    pdio detach --all
    if srv_connected "$i1" || srv_connected "$i2"; then echo "still connected"; return 1; fi
    srv_no_state
    srv_no_server
    detail "$d1 (pdio's server) and $d2 (--nbdkit, read-only, 1 connection) attached and detached with --all"
}

# --force detaches a mounted device (read-only here, so unmounting it
# afterwards writes nothing): server and state go at once, the kernel
# lets go of the device when it is unmounted.
cli_detach_force() {
    d=$(pdio attach "$CLI_IMG")
    i=${d#/dev/nbd}
    mount -t ext4 -o ro "$d" "$MNT"
    pid=$(sed -n 's/^server_pid=//p' "$PDIO_RUN/nbd$i.rec")
    pdio detach --force "$d"
    proc_gone "$pid"
    srv_no_state
    srv_no_server
    umount "$MNT"
    wait_until 10 srv_disconnected "$i" || { echo "$d still connected after umount"; return 1; }
    detail "$d detached while mounted; released after umount"
}

# The device is connected, then attach fails (the test build's break
# point fail-after-connect, tests/vm/breaks.c): attach must disconnect the
# device and stop the server it started, and leave no supervisor.
cli_failed_attach() {
    rc=0
    PDIO_TEST_BREAK=fail-after-connect /pdio/broken/pdio attach "$CLI_IMG" 2> "$STATE/cli.err" || rc=$?
    cat "$STATE/cli.err"
    [ "$rc" = 1 ]
    grep -q "injected failure" "$STATE/cli.err"
    for b in /sys/block/nbd*; do
        [ ! -f "$b/pid" ] || { echo "$b still connected"; return 1; }
    done
    srv_no_state
    srv_no_server
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
CLI_LD_IMG=/scratch/ld.img
cli_link_dead() {
    rm -f "$CLI_LD_IMG"
    truncate -s 64M "$CLI_LD_IMG"
    kmsg_reset
    d=$(PDIO_TEST_BREAK=link-dead-at-attach${PDIO_TEST_BREAK:+,$PDIO_TEST_BREAK} /pdio/broken/pdio attach "$CLI_LD_IMG") ||
        { echo "attach failed"; return 1; }
    head -c 1048576 /dev/urandom > "$STATE/cli.ld"
    rc=0
    dd if="$STATE/cli.ld" of="$d" bs=1M seek=3 oflag=direct conv=fsync status=none || rc=$?
    dd if="$d" of="$STATE/cli.ld.back" bs=1M skip=3 count=1 iflag=direct status=none || rc=$?
    cp "$PDIO_RUN/${d#/dev/}.supervisor.log" "$STATE/cli.ld.log"
    grep "a connection of\|died" "$STATE/cli.ld.log" || true
    dmesg | grep nbd || true
    errs=$(nbd_io_errors)
    fresh=$(grep -c "a connection of $d died with the server alive: handed it a fresh one" "$STATE/cli.ld.log" || true)
    pdio detach "$d"
    detail "$d: dd exit $rc; supervisor: $fresh fresh connection(s); kernel I/O errors $errs"
    [ "$rc" = 0 ]
    cmp "$STATE/cli.ld" "$STATE/cli.ld.back"
    cmp -n 1048576 "$STATE/cli.ld" "$CLI_LD_IMG" 0 3145728
    [ "$fresh" -ge 1 ]
    [ "$errs" = 0 ]
    srv_no_state
    srv_no_server
    rm -f "$CLI_LD_IMG"
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
cli_make_orphan() {
    rc=0
    PDIO_TEST_BREAK=die-after-connect /pdio/broken/pdio attach "$CLI_IMG" 2> "$STATE/cli.err" || rc=$?
    cat "$STATE/cli.err"
    [ "$rc" = 1 ] || { echo "attach exited with $rc"; return 1; }
    d=
    for b in /sys/block/nbd*; do
        [ ! -f "$b/pid" ] || d=/dev/${b##*/}
    done
    [ -n "$d" ] || { echo "no device left connected"; return 1; }
    # pdio:MAJ:MIN:INO:NAME:PATH, the name the image's (cli).
    grep -q "^pdio:[0-9]*:[0-9]*:[0-9]*:cli:$CLI_IMG\$" "/sys/block/${d#/dev/}/backend"
    [ ! -e "$PDIO_RUN/${d#/dev/}.rec" ] || { echo "$d has a record"; return 1; }
    [ -z "$(comm_pids pdio-supervise)" ] || { echo "a supervisor runs"; return 1; }
    echo "$d" > "$STATE/cli.orphan"
}
cli_orphan_gone() {
    d=$1 pid=$2
    if srv_connected "${d#/dev/nbd}"; then echo "$d still connected"; return 1; fi
    proc_gone "$pid" || { echo "server $pid still runs"; return 1; }
    srv_no_state
    srv_no_server
    left=$(ls "$PDIO_RUN" | grep -v '^lock$' || true)
    [ -z "$left" ] || { echo "left in $PDIO_RUN: $left"; return 1; }
    [ "$(fincore_pages "$CLI_IMG")" = 0 ]
}
cli_orphan() {
    cli_make_orphan
    d=$(cat "$STATE/cli.orphan")
    pid=$(server_pids)
    [ -n "$pid" ] || { echo "no server left by the killed attach"; return 1; }
    want="no record: attach was interrupted; pdio detach $d"
    pdio list | tee "$STATE/cli.list"
    grep -q "^$d  *$CLI_IMG  .* $pid  .* $want\$" "$STATE/cli.list"
    pdio list --json > "$STATE/cli.json"
    [ "$(jq -r --arg d "$d" '.nbddevices[] | select(.name == $d) | .status' "$STATE/cli.json")" = "$want" ]
    [ "$(jq -r --arg d "$d" '.nbddevices[] | select(.name == $d) | .pid' "$STATE/cli.json")" = "$pid" ]
    rc=0; pdio attach "$CLI_IMG" 2> "$STATE/cli.err" || rc=$?
    cat "$STATE/cli.err"
    [ "$rc" = 1 ]
    grep -qF "$CLI_IMG: already connected to $d by an attach that was interrupted before it recorded it (pdio detach $d)" "$STATE/cli.err"
    # restart and resize need a record: refused, saying what to do.
    for c in restart resize; do
        rc=0; pdio $c "$d" 2> "$STATE/cli.err" || rc=$?
        cat "$STATE/cli.err"
        [ "$rc" = 1 ] || { echo "pdio $c exited with $rc"; return 1; }
        grep -qF "pdio $c: $d: connected by an attach that was interrupted before it recorded it; pdio detach $d, then attach again" "$STATE/cli.err"
    done
    [ "$(server_pids)" = "$pid" ] || { echo "servers: $(server_pids), expected $pid alone"; return 1; }
    pdio detach "$d"
    cli_orphan_gone "$d" "$pid"
    # By the image, and with --all.
    cli_make_orphan
    d2=$(cat "$STATE/cli.orphan") pid2=$(server_pids)
    pdio detach "$CLI_IMG"
    cli_orphan_gone "$d2" "$pid2"
    cli_make_orphan
    d3=$(cat "$STATE/cli.orphan") pid3=$(server_pids)
    pdio detach --all
    cli_orphan_gone "$d3" "$pid3"
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

cli_protect() {
    fp_cgroup2
    rm -f "$FP_IMG"
    truncate -s 64M "$FP_IMG"
    seen=""
    for SERVER in native nbdkit; do
        # shellcheck disable=SC2046
        d=$(pdio attach $(srv_attach_flags) "$FP_IMG")
        i=${d#/dev/nbd}
        sup=$(sed -n 's/^supervisor_pid=//p' "$PDIO_RUN/nbd$i.rec")
        fp_check "$i" own
        seen="$seen $(srv_name): $(cat "$STATE/fp.seen")."
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
    srv_no_state
    srv_no_server
    detail "$seen Detached: cgroups removed, pdio.slice memory.min $left_min. Test build with no-io-flusher,no-oom-adjust: caught: $caught ($broken)"
    [ "$left_min" = 0 ]
    [ "$caught" = yes ]
}

# --slice none: the caller's cgroup, the protections all the same.
cli_slice_none() {
    d=$(pdio attach --slice none "$FP_IMG")
    i=${d#/dev/nbd}
    mine=$(cgroup_of $$)
    fp_check "$i" "$mine"
    pdio detach "$d"
    srv_no_state
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

cli_child_unprotected() {
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
    srv_no_state
    detail "$good; test build with child-keeps-protection: $bad, caught: $caught"
    [ $ok = yes ]
    [ $caught = yes ]
}

scenario_cli() {
    step "cli: pdio attach prints the device, 512-byte blocks, 1 connection, 1 MiB requests" cli_attach
    step "cli: pdio list and list --json show it" cli_list
    step "cli: a second attach of the image is refused, by any path, naming the holder" cli_double
    step "cli: mkfs.ext4, mount, write files, remount, every checksum verified" cli_fs
    step "cli: idle, server + supervisor within 4 MiB PSS, the server's reserve pinned and nothing more (pdio list --json)" cli_idle_memory
    step "cli: pdio detach of the mounted device is refused" cli_detach_mounted
    step "cli: unmount, pdio detach: device, server and state gone, fincore 0" cli_detach
    step "cli: reattach at once plus a read-only image, pdio detach --all" cli_detach_all
    step "cli: pdio detach --force of a mounted device" cli_detach_force
    step "cli: a failed attach leaves no device, no server, no supervisor, no state" cli_failed_attach
    step "cli: a connection that dies during attach gets a fresh one from the supervisor: write and read back, no I/O error" cli_link_dead
    step "cli: an attach killed after the connect: list shows the device, attach refused naming it, detach (device, image, --all) leaves nothing; restart and resize refused" cli_orphan
    step "cli: server and supervisor (pdio's, nbdkit) with PR_SET_IO_FLUSHER on every thread, oom_score_adj -1000, in /pdio.slice/pdio-SUP (memory.min 4 MiB), after attach, pdio restart and a SIGKILL; the test build without them is caught" cli_protect
    step "cli: pdio attach --slice none: the caller's cgroup, the protections all the same" cli_slice_none
    step "cli: a program the supervisor runs (udevadm) has neither PR_SET_IO_FLUSHER nor -1000; the test build's that keeps them is caught" cli_child_unprotected
}
