# SPDX-License-Identifier: BSD-3-Clause
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
#                         slow-storage step never passes: attach's own
#                         read of the partition table (slow storage at
#                         sector 0) drops its connection every second and
#                         gets a fresh one, without end, so the run ends
#                         at its hard limit (it prints all the while)
#
# With -C 2 the kernel drops the connection of any request that outlives
# its timer, and resends the requests in flight at a death only then: the
# request timeout (pdio.h, DEFAULT_MULTI_TIMEOUT) bounds the crash pause
# and must outlast the slow disk.  The -C 2 pauses are printed, not a
# pass condition.  Shown to fail against the test build:
#   multi-timeout-long    -C 2 gets the 15 s timeout pdio had: the -C 2
#                         defaults check fails (the pauses print ~15 s)
#   multi-timeout-short   -C 2 gets 2 s: the defaults check fails, and the
#                         -C 2 slow-storage check (both connections
#                         dropped, failed writes once the dead-connection
#                         timeout passed; in one run the slow request was
#                         resent for ever and the step never ended)
CR_PAUSE_MAX_MS=3000    # the longest probe pause allowed at a crash (TCG)
CR_MULTI_TIMEOUT=5      # pdio.h: DEFAULT_MULTI_TIMEOUT
CR_HUNG_MS=10000        # watchdog.c: WATCHDOG_HUNG_MS
CR_SLOW_MS=3000         # dm-delay's delay
CR_SLOW_WRITES=2

# cr_attach SERVER [N]: rc_attach_fs with the defaults, which it checks;
# with N, -C N and the defaults of several connections.
cr_attach() {
    SERVER=$1 conns=${2:-1}
    if [ "$conns" = 1 ]; then rc_attach_fs; else rc_attach_fs -C "$conns"; fi
    io=$(cat "/sys/block/nbd$(rc_idx)/queue/io_timeout")
    hw=$(ls "/sys/block/nbd$(rc_idx)/mq" | wc -l)
    detail "$(rc_dev): defaults: connections $(rc_field connections) ($hw hardware queue(s)), timeout $(rc_field timeout) s, io_timeout $io ms, dead-connection timeout $(rc_field dead_timeout) s; server pid $(rc_field server_pid)"
    [ "$(rc_field connections)" = "$conns" ] || return 1
    [ "$hw" = "$conns" ] || return 1
    if [ "$conns" = 1 ]; then
        [ "$(rc_field timeout)" = 0 ] && [ "$io" = 1000 ]
    else
        [ "$(rc_field timeout)" = "$CR_MULTI_TIMEOUT" ] &&
            [ "$io" = $((CR_MULTI_TIMEOUT * 1000)) ]
    fi
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

# cr_crash_multi HOW N: the replacement test with several connections;
# the pauses (in rc_replace's line) are figures, and the kernel's resends
# of the requests in flight at each death are counted.
cr_crash_multi() {
    rc_replace "$@" || return 1
    resent=$(dmesg | grep -c 'Connection timed out, retrying' || true)
    tap_diag "-C $(rc_field connections), timeout $(rc_field timeout) s: $1 x$2 paused $(rc_pauses)ms (TCG, printed only); kernel 'Connection timed out, retrying' lines (rate-limited): $resent"
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
    rc_io_stop
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

# cr_dm_slow NAME FILE MS: a loop device of FILE (64 MiB), and over it
# the device-mapper device NAME whose first MiB is a dm-delay target of MS
# on every I/O, the rest linear.  Sets loop, total (sectors) and dmdev.
cr_dm_slow() {
    # By its path: the guest's busybox sh runs its own applet for "losetup".
    loop=$(/usr/sbin/losetup -f --show "$2")
    total=$((64 * 2048))
    printf '0 2048 delay %s 0 %d\n2048 %d linear %s 2048\n' \
        "$loop" "$3" $((total - 2048)) "$loop" |
        DM_DISABLE_UDEV=1 dmsetup create "$1" --noudevsync
    dmdev=/dev/mapper/$1
    if [ ! -b "$dmdev" ]; then
        for b in /sys/block/dm-*; do
            [ "$(cat "$b/dm/name")" = "$1" ] && dmdev=/dev/${b##*/}
        done
    fi
    [ -b "$dmdev" ] || { echo "no dm device $1"; ls -l /dev/mapper /sys/block; return 1; }
}

# Slow storage: the image is a device-mapper device whose first MiB is a
# dm-delay target (CR_SLOW_MS on every I/O), the rest linear, over a loop
# device.  The watchdog's probes (offset 0) are slow too.  A writer keeps
# the fast part busy while CR_SLOW_WRITES 4 KiB O_DIRECT writes go, one
# after another, to the slow part.  Pass: each took the delay, no
# connection was dropped (no restart, no hand-over, no kernel timeout or
# dead-connection message), no I/O error, the data reads back, and every
# nbd line the kernel logged is a "Possible stuck request", which it logs
# at each expiry of the 1 s timer of a request still in flight and is no
# fault.  How many there are is load's (one a second past the first of
# each slow request: 7 and 5 lines in two loaded runs), so it is printed,
# not a pass condition.  cr_slow -C N: the same with N connections, whose
# timeout must outlast the delay.
cr_slow() {
    back=/scratch/slow-back.img
    rm -f "$back" "$STATE/slow.stop" "$STATE/slow.fail"
    truncate -s 64M "$back"
    cr_dm_slow pdio-slow "$back" "$CR_SLOW_MS" || return 1
    d=$(pdio attach "$@" "$dmdev")
    i=${d#/dev/nbd}
    conns=$(sed -n 's/^connections=//p' "$PDIO_RUN/nbd$i.rec")
    tmo=$(sed -n 's/^timeout=//p' "$PDIO_RUN/nbd$i.rec")
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
    others=$(grep -vc 'Possible stuck request' "$STATE/slow.kmsg" || true)
    dropped=$(grep -ci 'timed out\|dead\|shutting down\|failed\|I/O error\|Double reply\|Unexpected' "$STATE/slow.kmsg" || true)
    handed=$(grep -c 'died\|handed\|killing\|not answered' "$PDIO_RUN/nbd$i.supervisor.log" || true)
    restarts=$(sed -n 's/^restarts=//p' "$PDIO_RUN/nbd$i.rec")
    server2=$(sed -n 's/^server_pid=//p' "$PDIO_RUN/nbd$i.rec")
    # What the supervisor did about a dropped connection, and when.
    [ "$handed" = 0 ] || cat "$PDIO_RUN/nbd$i.supervisor.log"
    pdio detach "$d"
    DM_DISABLE_UDEV=1 dmsetup remove pdio-slow
    /usr/sbin/losetup -d "$loop"
    tap_diag "slow storage (dm-delay $CR_SLOW_MS ms), $conns connection(s), timeout $tmo s: slow writes took${times} ms; kernel log: $lines nbd line(s) for $nslow slow requests, $others not of a possibly stuck request, $dropped of a dropped connection or error; supervisor: $handed hand-over(s), restarts $restarts"
    detail "slow writes took${times} ms; $bad read back wrong; server $server -> $server2, supervisor $sup; $(cat "$STATE/slow.fail" 2>/dev/null | wc -l) failed writes"
    # One test a line: set -e ignores a failure before the last command
    # of an && list.
    [ ! -s "$STATE/slow.fail" ] || return 1
    [ "$bad" = 0 ] || return 1
    for t in $times; do
        [ "$t" -ge $((CR_SLOW_MS - 500)) ] || { echo "a slow write took $t ms: the delay did not apply"; return 1; }
    done
    [ "$dropped" = 0 ] || { echo "$dropped kernel line(s) of a dropped connection or error"; return 1; }
    [ "$handed" = 0 ] || { echo "the supervisor handed over $handed time(s)"; return 1; }
    [ "$restarts" = 0 ] && [ "$server2" = "$server" ] || { echo "the server was replaced"; return 1; }
    [ "$others" = 0 ] || { echo "$others kernel line(s) not of a possibly stuck request"; return 1; }
}

# Storage slower than the timeout while attach reads the partition
# table, with -C 2: the image (an MBR, one partition) is a loop device
# whose first MiB is a dm-delay target of CR_SCAN_SLOW_MS, past the
# timeout, the rest linear.  The scan's read of sector 0 outlives its
# timer: the kernel drops its connection, resends it on the other, drops
# that one too.  Once it has dropped two, the table becomes all linear
# (a resume flushes what dm-delay holds).  Only attach can hand fresh
# connections then: it is not the supervisor yet.  Pass: attach says it
# handed one, the partition shows, and the kernel logged no failed read.
# Shown to fail with scan-inline (attach answers no LINK_DEAD meanwhile,
# as when it read the table itself): both connections stay dead until the
# dead-connection timeout fails the read, and nbdNp1 never shows.
CR_SCAN_SLOW_MS=8000
cr_slow_scan() {
    back=/scratch/scan-back.img
    rm -f "$back"
    truncate -s 64M "$back"
    printf 'label: dos\nstart=2048\n' | sfdisk -q "$back"
    cr_dm_slow pdio-scan "$back" "$CR_SCAN_SLOW_MS" || return 1
    kmsg_reset
    # The switch: after the kernel's second dropped connection, or 90 s.
    (
        k=0
        while [ $k -lt 900 ] && [ "$(dmesg | grep -c 'nbd.*timed out')" -lt 2 ]; do
            sleep 0.1; k=$((k + 1))
        done
        a=$(cut -d' ' -f1 /proc/uptime)
        echo "0 $total linear $loop 0" | DM_DISABLE_UDEV=1 dmsetup reload pdio-scan
        DM_DISABLE_UDEV=1 dmsetup resume pdio-scan
        echo "$a" > "$STATE/scan.switched"
    ) &
    switcher=$!
    a=$(cut -d' ' -f1 /proc/uptime)
    d=$(pdio attach -C 2 "$dmdev" 2> "$STATE/scan.err") || { cat "$STATE/scan.err"; wait "$switcher"; return 1; }
    b=$(cut -d' ' -f1 /proc/uptime)
    wait "$switcher" || true
    i=${d#/dev/nbd}
    cat "$STATE/scan.err"
    dmesg | grep -i 'nbd' > "$STATE/scan.kmsg" || true
    cat "$STATE/scan.kmsg"
    drops=$(grep -c 'timed out' "$STATE/scan.kmsg" || true)
    failed=$(grep -ci 'unable to read partition table\|I/O error' "$STATE/scan.kmsg" || true)
    handed=$(grep -c 'handed it a fresh one' "$STATE/scan.err" || true)
    part=no
    [ -e "/sys/block/nbd$i/nbd${i}p1" ] && part=yes
    tap_diag "slow storage during attach's partition scan (dm-delay $CR_SCAN_SLOW_MS ms, -C 2, timeout $(sed -n 's/^timeout=//p' "$PDIO_RUN/nbd$i.rec") s): attach took $(awk -v a="$a" -v b="$b" 'BEGIN { printf "%d", (b - a) * 1000 }') ms (TCG), the table went linear at $(awk -v a="$a" -v b="$(cat "$STATE/scan.switched")" 'BEGIN { printf "%d", (b - a) * 1000 }') ms; $drops dropped connection(s), $handed handed by attach, $failed failed read line(s); nbd${i}p1: $part"
    pdio detach "$d"
    DM_DISABLE_UDEV=1 dmsetup remove pdio-scan
    /usr/sbin/losetup -d "$loop"
    [ "$drops" -ge 2 ] || { echo "the kernel dropped $drops connection(s): the delay did not apply"; return 1; }
    [ "$handed" -ge 1 ] || { echo "attach handed no fresh connection"; return 1; }
    [ "$failed" = 0 ] || { echo "$failed kernel line(s) of a failed read"; return 1; }
    [ "$part" = yes ] || { echo "nbd${i}p1 does not show"; return 1; }
}

scenario_crash() {
    step "crash: pdio attach with its defaults (1 connection, timeout 0, io_timeout 1000 ms), mkfs.ext4, mount" cr_attach native
    step "crash: server SIGKILLed 3 times during fio verify: 0 errors, each pause <= ${CR_PAUSE_MAX_MS} ms" cr_crash kill 3
    step "crash: server SIGABRTed during fio verify: 0 errors, pause <= ${CR_PAUSE_MAX_MS} ms" cr_crash abort 1
    step "crash: server SIGSTOPped during fio verify: the watchdog replaces it, 0 errors" cr_hung
    step "crash: unmount, e2fsck -fn clean, pdio detach leaves nothing" rc_detach
    step "crash: slow storage (dm-delay ${CR_SLOW_MS} ms): no connection dropped, no error, no kernel line but of stuck requests" cr_slow
    # Several connections: the timeout bounds the pause.
    step "crash -C 2: pdio attach -C 2 with its defaults (timeout ${CR_MULTI_TIMEOUT} s, io_timeout ${CR_MULTI_TIMEOUT}000 ms), mkfs.ext4, mount" cr_attach native 2
    step "crash -C 2: server SIGKILLed 3 times during fio verify: 0 errors (pauses printed)" cr_crash_multi kill 3
    step "crash -C 2: unmount, e2fsck -fn clean, pdio detach leaves nothing" rc_detach
    step "crash -C 2: slow storage (dm-delay ${CR_SLOW_MS} ms): no connection dropped, no error" cr_slow -C 2
    step "crash -C 2: storage slower than the timeout during attach's partition scan: attach hands fresh connections, the table is read" cr_slow_scan
    # The other server: the kernel's side is the same.
    step "crash: pdio attach --nbdkit with its defaults, mkfs.ext4, mount" cr_attach nbdkit
    step "crash: nbdkit SIGKILLed 2 times during fio verify: 0 errors, each pause <= ${CR_PAUSE_MAX_MS} ms" cr_crash kill 2
    step "crash: nbdkit SIGSTOPped during fio verify: the watchdog replaces it, 0 errors" cr_hung
    step "crash: nbdkit: unmount, e2fsck -fn clean, pdio detach leaves nothing" rc_detach
}
