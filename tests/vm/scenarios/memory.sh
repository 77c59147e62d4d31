# SPDX-License-Identifier: BSD-3-Clause
# tests/vm/scenarios/memory.sh — the guest's memory-pressure scenarios,
# sourced by guest-init.sh (run.sh copies it to /pdio/scenarios/); it
# uses the guest library's helpers (tests/lib/tap.sh, tests/lib/guest.sh):
# step, detail, tap_diag, wait_until, srv_no_state, srv_no_server,
# proc_gone, uptime_s.
#
# A pdio device must never deadlock the machine, and its server must never
# be the OOM killer's victim.  Every write the kernel flushes to the device
# passes through the server: if the server must allocate to make progress
# while the kernel needs that write to free memory, the two wait on each
# other.  The scenarios:
#
#   memory_flags   every thread of the server and the supervisor runs with
#                  PR_SET_IO_FLUSHER (PF_MEMALLOC_NOIO|PF_LOCAL_THROTTLE in
#                  /proc/PID/task/TID/stat) and oom_score_adj -1000, after
#                  attach, pdio restart, a SIGKILL and a watchdog
#                  replacement; pdio list --json says so
#   memory_cgroup  the writer in a memory cgroup (384 MiB, no swap):
#                  MEM_CYCLES times an idle give-back, 200 MiB buffered
#                  into ext4, a hog near the limit, a bounded sync; with
#                  pdio attach run inside the writer's cgroup and outside
#                  it, both with the default placement (pdio.slice), each
#                  with the hog killable and protected
#   memory_slice_none  (on demand, not in "memory") attach --slice none,
#                  pdio in the writer's limit, with the hog killable.
#                  (--slice none beside a protected hog is not
#                  supported: the cgroup then holds nothing the OOM killer
#                  may take, and the writeback through the server is
#                  charged to the full limit -- measured: a sync past
#                  137 s, 14 OOM events, 0 kills.  pdio(1) says so.)
#   memory_global  the same cycle with a machine-wide hog, killable and
#                  protected; the protected one is sized to fit only once
#                  the dirty pages have gone out through pdio, so that
#                  the OOM killer is never needed (every other process
#                  is protected too: it would have no victim but pdio)
#   memory_swap    pdio attach --swap, swap on the device, data in tmpfs
#                  pushed out to it by a hog larger than what is left,
#                  then read back and compared
#   memory         all four
#
# Time is never a pass condition (TCG): the sync times are printed.  What
# is asserted: the idle server gave its pool back but its reserve (VmPin
# at most MEM_RESERVE_KIB, VmLck at least that), the sync ends within
# MEM_SYNC_MAX (past it the machine is taken as deadlocked), no "blocked
# for more than" in the kernel log, no pdio process OOM-killed, no
# restart, e2fsck clean, the data read back; with a machine-wide
# protected hog, no OOM kill at all.
#
# The test's own shell runs with oom_score_adj -1000 (mem_setup; put back
# by mem_teardown), and so does everything it starts but the killable
# hogs and pdio attach and restart, which run with 0 ($MEM_PDIO): its
# processes are no victims either, only the hog or pdio are.
#
# The kernel's OOM reports (expected: the killable hog is killed) print
# call traces, which run.sh takes as kernel trouble on the console: these
# scenarios keep the console to errors (the kills, hung tasks; a panic)
# and scan the kernel log themselves ($LOGS/memory-kmsg.log keeps it).
#
# Shown to fail against today's build and the test build's break points
# (run.sh --scenario memory --break LIST): no-io-flusher, no-oom-adjust,
# no-reserve.

# --- pdio's names for what is tested: one place to adjust ---------------------
MEM_ATTACH_KEEP_CGROUP="--slice none"   # attach: stay in the caller's cgroup
MEM_ATTACH_SWAP="--swap"                # attach: a device to swap on
MEM_JSON_IO_FLUSHER=io_flusher          # pdio list --json: a bool
MEM_JSON_OOM=oom_score_adj              # an int
MEM_JSON_CGROUP=cgroup                  # a string, the server's cgroup
MEM_SLICE=/pdio.slice                   # the default placement (no systemd)
MEM_RESERVE_KIB=2048                    # what an idle server keeps pinned

MEM_PDIO=$STATE/mem-pdio                # pdio, run with oom_score_adj 0

# --- the kernel's ------------------------------------------------------------
PF_MEMALLOC_NOIO=0x80000
PF_LOCAL_THROTTLE=0x100000

# --- sizes and bounds --------------------------------------------------------
MEM_IMG=/scratch/mem.img
MEM_IMG_MIB=1024
MEM_SRC=/scratch/mem-src.bin            # what every cycle writes
MEM_WRITE_MIB=200
MEM_CG=/sys/fs/cgroup/pdio-test-writer
MEM_CG_MAX_MIB=384
MEM_CG_HOG_MIB=360                      # close to the limit
MEM_CYCLES=${MEM_CYCLES:-10}           # per variant (run.sh: PDIO_VM_MEM_CYCLES)
MEM_REF_CYCLES=1                        # of the loop device's reference
MEM_GLOBAL_SLACK_MIB=128                # the global hog: MemAvailable (caches
                                        # dropped, before the write) less this:
                                        # less than MEM_WRITE_MIB, so it fits
                                        # only once the dirty pages are written
MEM_SWAP_DEV=/dev/vdb                   # the swap device's image
MEM_SWAP_IMG_MIB=768                    # of swap on it
MEM_SWAP_DATA=/dev/shm/pdio-mem-swap    # tmpfs: swapped out and back
MEM_SWAP_CG=/sys/fs/cgroup/pdio-test-swapped   # what MEM_SWAP_DATA is charged to
MEM_SWAP_OVER_MIB=128                   # the swap hog: MemAvailable plus this
MEM_IDLE_SECS=6                         # no request for this long: the server
                                        # has given its pool back (5 s, checked
                                        # every second)
MEM_IDLE_MAX=60                         # s for the pool to be given back
MEM_FILL_MAX=60                         # s for the hog to fill
MEM_SYNC_MAX=120                        # s: a sync past it is a deadlock
MEM_SWAP_MAX=600                        # s for the swap hog to fill, and for
                                        # the read back
MEM_HUNG_TIMEOUT=30                     # kernel.hung_task_timeout_secs

mem_now() { awk '{ printf "%d", $1 * 100 }' /proc/uptime; }   # centiseconds
mem_secs() { echo "$(($1 / 100)).$(printf %02d $(($1 % 100)))"; }
mem_dev() { cat "$STATE/mem.dev"; }
mem_rec() { d=$(mem_dev); echo "$PDIO_RUN/${d#/dev/}.rec"; }
mem_field() { sed -n "s/^$1=//p" "$(mem_rec)"; }
mem_status() { awk -v k="$2:" '$1 == k { print $2 }' "/proc/$1/status"; }
mem_pss_kib() { awk '/^Pss:/ { print $2 }' "/proc/$1/smaps_rollup"; }
mem_cgroup_of() { sed -n 's/^0:://p' "/proc/$1/cgroup"; }
mem_avail_mib() { awk '/^MemAvailable:/ { print int($2 / 1024) }' /proc/meminfo; }
mem_psi() { tr '\n' '|' < "$1" | sed 's/|$//; s/|/ | /'; }

# A step that follows one which left the machine stuck fails at once,
# naming what is stuck, rather than hanging too.
mem_not_stuck() {
    [ ! -s "$STATE/mem.stuck" ] || { echo "not run: stuck before: $(cat "$STATE/mem.stuck")"; return 1; }
}

# mem_bounded SECS CMD...: run CMD, wait at most SECS for it.  Returns
# CMD's status; one still running is left (it may be in D state, beyond
# any signal) and named in $STATE/mem.stuck.  mem_took: centiseconds.
mem_bounded() {
    _mb_secs=$1; shift
    rm -f "$STATE/mem.bg.rc"
    _mb_t0=$(mem_now)
    ( set +e; "$@"; echo $? > "$STATE/mem.bg.rc" ) &
    _mb_pid=$!
    if ! wait_until "$_mb_secs" test -s "$STATE/mem.bg.rc"; then
        mem_took=$(($(mem_now) - _mb_t0))
        echo "$* ($_mb_secs s)" >> "$STATE/mem.stuck"
        echo "still running after $_mb_secs s: $*"
        return 124
    fi
    mem_took=$(($(mem_now) - _mb_t0))
    wait "$_mb_pid" 2>/dev/null || true
    return "$(cat "$STATE/mem.bg.rc")"
}

# The kernel's log since the last call, appended to the scenario's log
# and to $STATE/mem.kmsg (this part's), the ring emptied so that the
# OOM reports cannot overflow it.
mem_kmsg() {
    dmesg -c > "$STATE/mem.kmsg.new" || true
    cat "$STATE/mem.kmsg.new" >> "$LOGS/memory-kmsg.log"
    cat "$STATE/mem.kmsg.new" >> "$STATE/mem.kmsg"
}
mem_kmsg_reset() { mem_kmsg; : > "$STATE/mem.kmsg"; }
# Counts in $STATE/mem.kmsg: OOM kills, of pdio's processes, hung tasks,
# and the console's own kernel trouble (an OOM report's call trace is
# not trouble).
mem_kmsg_counts() {
    k=$STATE/mem.kmsg
    ooms=$(grep -c 'Killed process [0-9]' "$k" || true)
    pdio_ooms=$(grep -c 'Killed process [0-9]* (\(pdio\|pdio-supervise\|nbdkit\))' "$k" || true)
    hung=$(grep -c 'blocked for more than' "$k" || true)
    trouble=$(grep -c 'Kernel panic\|Oops\|BUG:\|WARNING:\|general protection fault' "$k" || true)
    noio=$(grep -c 'page allocation failure' "$k" || true)
}
mem_kmsg_verdict() {
    mem_kmsg_counts
    grep 'Killed process\|blocked for more than\|page allocation failure\|BUG:\|WARNING:' "$STATE/mem.kmsg" || true
    [ "$pdio_ooms" = 0 ] || { echo "the OOM killer took a pdio process"; return 1; }
    [ "$hung" = 0 ] || { echo "hung tasks (blocked for more than $MEM_HUNG_TIMEOUT s)"; return 1; }
    [ "$trouble" = 0 ] || { echo "kernel trouble in the log"; return 1; }
}

# --- setup ----------------------------------------------------------------------
# cgroup2 with the memory controller, PSI, stress-ng, the hung-task
# detector at MEM_HUNG_TIMEOUT, a quiet console, and the source data.
mem_setup() {
    if ! grep -q ' /sys/fs/cgroup cgroup2 ' /proc/mounts; then
        mount -t cgroup2 cgroup2 /sys/fs/cgroup
        touch "$STATE/mem.cgroup-mounted"
    fi
    grep -qw memory /sys/fs/cgroup/cgroup.controllers ||
        { echo "no memory controller: $(cat /sys/fs/cgroup/cgroup.controllers)"; return 1; }
    grep -qw memory /sys/fs/cgroup/cgroup.subtree_control ||
        echo +memory > /sys/fs/cgroup/cgroup.subtree_control
    [ -r /proc/pressure/memory ] || { echo "no /proc/pressure/memory (PSI)"; return 1; }
    stress-ng --version
    [ -f "$STATE/mem.printk" ] || cut -f1 /proc/sys/kernel/printk > "$STATE/mem.printk"
    echo 4 > /proc/sys/kernel/printk
    # The test's processes out of the OOM killer's reach: the guest's
    # shell, which every later step inherits it from, and this step's.
    [ -f "$STATE/mem.oom_adj" ] || cat "/proc/$$/oom_score_adj" > "$STATE/mem.oom_adj"
    echo -1000 > "/proc/$$/oom_score_adj"
    echo -1000 > /proc/self/oom_score_adj
    # pdio itself is run as from an ordinary shell, oom_score_adj 0:
    # whatever protection its processes have is their own.
    printf '#!/bin/sh\necho 0 > /proc/self/oom_score_adj\nexec pdio "$@"\n' > "$MEM_PDIO"
    chmod 755 "$MEM_PDIO"
    echo "$MEM_HUNG_TIMEOUT" > /proc/sys/kernel/hung_task_timeout_secs
    if [ ! -f "$STATE/mem.src.made" ]; then
        # O_DIRECT: the source takes no page cache when written.
        dd if=/dev/urandom of="$MEM_SRC" bs=1M count="$MEM_WRITE_MIB" oflag=direct status=none
        md5sum < "$MEM_SRC" | cut -d' ' -f1 > "$STATE/mem.src.md5"
        touch "$STATE/mem.src.made"
    fi
    : > "$STATE/mem.stuck"
    mem_kmsg_reset
    detail "cgroup2 memory controller, PSI ($(mem_psi /proc/pressure/memory)), $(stress-ng --version | cut -d' ' -f1-3), MemAvailable $(mem_avail_mib) MiB, hung_task_timeout_secs $MEM_HUNG_TIMEOUT, this shell's oom_score_adj $(cat "/proc/$$/oom_score_adj")"
}

# Back to how the other scenarios run: no hog, no test cgroup, the
# console's level and the hung-task detector as at boot.
mem_teardown() {
    mem_hog_stop
    for s in $(swapon -s 2>/dev/null | awk '$1 ~ /^\/dev\/nbd/ { print $1 }'); do
        swapoff "$s" || true
    done
    [ ! -d "$MEM_CG" ] || rmdir "$MEM_CG"
    [ ! -d "$MEM_SWAP_CG" ] || rmdir "$MEM_SWAP_CG"
    left=$(find /sys/fs/cgroup -mindepth 1 -type d 2>/dev/null | sed 's|^/sys/fs/cgroup||' | tr '\n' ' ')
    [ ! -f "$STATE/mem.printk" ] || cat "$STATE/mem.printk" > /proc/sys/kernel/printk
    echo 0 > /proc/sys/kernel/hung_task_timeout_secs
    [ ! -f "$STATE/mem.oom_adj" ] || cat "$STATE/mem.oom_adj" > "/proc/$$/oom_score_adj"
    if [ -f "$STATE/mem.cgroup-mounted" ]; then
        # Empty cgroups left behind (pdio's own, once its processes are
        # gone) would outlive the unmount: remove them, deepest first.
        find /sys/fs/cgroup -mindepth 1 -depth -type d -exec rmdir {} \; 2>/dev/null || true
        umount /sys/fs/cgroup
        rm -f "$STATE/mem.cgroup-mounted"
    fi
    rm -f "$MEM_IMG"
    detail "cgroups left by the scenario (then removed): ${left:-none}"
    [ ! -s "$STATE/mem.stuck" ] || { echo "still stuck: $(cat "$STATE/mem.stuck")"; return 1; }
}

# --- the flags ----------------------------------------------------------------
# Threads of PID lacking PF_MEMALLOC_NOIO or PF_LOCAL_THROTTLE, one line
# each.  The flags are field 9 of stat, the 7th after the ")" that ends
# comm (which may hold spaces and parentheses itself).
mem_flags_missing() {
    for t in /proc/"$1"/task/*; do
        st=$(cat "$t/stat" 2>/dev/null) || continue    # the thread ended
        # shellcheck disable=SC2086 # the fields, split
        set -- ${st##*)}
        f=$7
        want=$((PF_MEMALLOC_NOIO | PF_LOCAL_THROTTLE))
        [ $((f & want)) = $((want)) ] ||
            echo "task ${t##*/} ($(cat "$t/comm" 2>/dev/null)) flags $(printf 0x%x "$f")"
    done
}

# mem_flags_check WHAT: the server and the supervisor the record names run
# with both flags on every thread and oom_score_adj -1000, and pdio list
# --json says so.
mem_flags_check() {
    what=$1
    srv=$(mem_field server_pid) sup=$(mem_field supervisor_pid)
    [ -d "/proc/$srv" ] && [ -d "/proc/$sup" ] || { echo "server $srv or supervisor $sup not running"; return 1; }
    bad=""
    for p in "$srv" "$sup"; do
        m=$(mem_flags_missing "$p")
        [ -z "$m" ] || { echo "pid $p ($(cat "/proc/$p/comm")) lacks PF_MEMALLOC_NOIO|PF_LOCAL_THROTTLE:"; echo "$m"; bad=1; }
    done
    n_srv=$(ls "/proc/$srv/task" | wc -l) n_sup=$(ls "/proc/$sup/task" | wc -l)
    adj_srv=$(cat "/proc/$srv/oom_score_adj") adj_sup=$(cat "/proc/$sup/oom_score_adj")
    pdio list --json > "$STATE/mem.json"
    set -- $(jq -r --arg d "$(mem_dev)" --arg f "$MEM_JSON_IO_FLUSHER" --arg o "$MEM_JSON_OOM" \
        --arg c "$MEM_JSON_CGROUP" '.nbddevices[] | select(.name == $d) |
        [.[$f], .[$o], .[$c]] | map(tostring) | join(" ")' "$STATE/mem.json")
    j_flusher=${1:-} j_oom=${2:-} j_cg=${3:-}
    cg=$(mem_cgroup_of "$srv")
    detail "$what: server $srv ($n_srv threads), supervisor $sup ($n_sup): flags ${bad:+NOT }set on every thread, oom_score_adj $adj_srv/$adj_sup; list: $MEM_JSON_IO_FLUSHER $j_flusher, $MEM_JSON_OOM $j_oom, $MEM_JSON_CGROUP $j_cg (server's $cg)"
    # (One test per line: set -e ignores a failure left of "&&".)
    [ -z "$bad" ]
    [ "$adj_srv" = -1000 ]
    [ "$adj_sup" = -1000 ]
    [ "$j_flusher" = true ]
    [ "$j_oom" = -1000 ]
    [ "$j_cg" = "$cg" ]
}

# For wait_until: the record counts RESTARTS and names a live server
# other than OLD.
mem_replaced() {
    new=$(mem_field server_pid)
    [ "$(mem_field restarts)" = "$1" ] && [ -n "$new" ] && [ "$new" != 0 ] &&
        [ "$new" != "$2" ] && [ -d "/proc/$new" ]
}

mf_attach() {
    rm -f "$MEM_IMG"
    truncate -s 64M "$MEM_IMG"
    "$MEM_PDIO" attach "$MEM_IMG" > "$STATE/mem.dev"
    mem_flags_check "pdio attach"
}

# mf_replace HOW: replace the server (pdio restart, SIGKILL, or SIGSTOP
# for the watchdog), wait for the new one, check it.
mf_replace() {
    old=$(mem_field server_pid) r0=$(mem_field restarts)
    case $old in ''|0) echo "no server"; return 1 ;; esac
    case $1 in
    restart) "$MEM_PDIO" restart "$(mem_dev)" ;;
    kill) kill -KILL "$old" ;;
    hung)
        # The watchdog probes only a device with requests in flight: one
        # read, which waits for the new server.
        kill -STOP "$old"
        dd if="$(mem_dev)" of=/dev/null bs=4096 count=1 iflag=direct status=none &
        reader=$! ;;
    esac
    ok=0
    wait_until 60 mem_replaced $((r0 + 1)) "$old" || ok=1
    if [ "$ok" != 0 ]; then
        [ "$1" != hung ] || kill -KILL "$old"
        echo "no new server 60 s after $1"
        return 1
    fi
    [ "$1" != hung ] || wait "$reader" || { echo "the read across the replacement failed"; return 1; }
    echo "$1: server $old -> $(mem_field server_pid); reason: $(mem_field reason)"
    mem_flags_check "after $1 (reason: $(mem_field reason))"
}

mf_detach() {
    pdio detach "$(mem_dev)"
    srv_no_state
    srv_no_server
}

scenario_memory_flags() {
    step "memory: cgroup2 with the memory controller, PSI, stress-ng; hung-task detector at $MEM_HUNG_TIMEOUT s" mem_setup
    step "memory-flags: pdio attach: every server and supervisor thread has PF_MEMALLOC_NOIO|PF_LOCAL_THROTTLE, oom_score_adj -1000, list --json says so" mf_attach
    step "memory-flags: the same after pdio restart" mf_replace restart
    step "memory-flags: the same after the server is SIGKILLed (the supervisor restarts it)" mf_replace kill
    step "memory-flags: the same after the watchdog replaced a SIGSTOPped server" mf_replace hung
    step "memory-flags: pdio detach leaves nothing" mf_detach
    step "memory: teardown: no hog, test cgroups removed, console and hung-task detector as before" mem_teardown
}

# --- the pressure cycle --------------------------------------------------------
# MEM_WHERE: cgroup (the writer and the hog in $MEM_CG) or global;
# MEM_HOG: killable (oom_score_adj 0) or protected (-1000).

# mem_in CG CMD...: CMD in cgroup CG (none: where the caller is).
mem_in() {
    _mi_cg=$1; shift
    sh -c 'cg=$1; shift; [ "$cg" = none ] || echo $$ > "$cg/cgroup.procs"; exec "$@"' mem-in "$_mi_cg" "$@"
}

mem_cg_make() {
    [ ! -d "$MEM_CG" ] || rmdir "$MEM_CG"
    mkdir "$MEM_CG"
    echo "${MEM_CG_MAX_MIB}M" > "$MEM_CG/memory.max"
    [ -f "$MEM_CG/memory.swap.max" ] || { echo "no memory.swap.max (swap accounting off?)"; return 1; }
    echo 0 > "$MEM_CG/memory.swap.max"
}

# The live processes whose comm is $1 (a grep pattern): one grep, not a
# cat per process, which TCG makes slow to poll.
mem_pids() {
    for _mp in $(grep -lx "$1" /proc/[0-9]*/comm 2>/dev/null | sed 's|^/proc/||; s|/comm$||'); do
        proc_gone "$_mp" || echo "$_mp"
    done
}
mem_hog_stop() {
    for p in $(mem_pids 'stress-ng.*'); do kill -KILL "$p" 2>/dev/null || true; done
    wait_until 30 mem_no_hog || { echo "the hog does not go away"; return 1; }
}
mem_no_hog() { [ -z "$(mem_pids 'stress-ng.*')" ]; }
# The hog's resident memory, KiB: its largest process.
mem_hog_rss() {
    _mr_max=0
    for _mr_p in $(mem_pids stress-ng-vm); do
        _mr_r=$(mem_status "$_mr_p" VmRSS 2>/dev/null || true)
        [ -z "$_mr_r" ] || [ "$_mr_r" -le "$_mr_max" ] || _mr_max=$_mr_r
    done
    echo "$_mr_max"
}

# mem_hog_start MIB CG HOW ARGS...: stress-ng's vm hog of MIB in cgroup CG
# (or none), oom_score_adj 0 (killable) or -1000 (protected) and kept as
# it is (--no-oom-adjust: stress-ng would make itself the first victim).
mem_hog_start() {
    _mh_mib=$1 _mh_cg=$2 _mh_adj=0
    [ "$3" != protected ] || _mh_adj=-1000
    shift 3
    (
        cd /tmp
        mem_in "$_mh_cg" sh -c 'echo "$1" > /proc/self/oom_score_adj; shift; exec "$@"' hog "$_mh_adj" \
            stress-ng --vm 1 --vm-bytes "${_mh_mib}m" --vm-keep --vm-madvise normal \
            --no-oom-adjust "$@"
    ) >> "$LOGS/memory-hog.log" 2>&1 &
    echo $! > "$STATE/mem.hog"
}
# For wait_until: the hog holds 90 % of what it asked for, or the OOM
# killer has had to act.  If it took a pdio process the cycle has failed
# already: the hog goes at once, so that the machine recovers for the
# steps after (or the OOM killer goes on to this test's own processes).
mem_hog_up() {
    if dmesg | grep -q 'Killed process [0-9]* (\(pdio\|pdio-supervise\|nbdkit\))'; then
        mem_hog_stop
        return 0
    fi
    [ "$(mem_hog_rss)" -ge $(($1 * 1024 * 9 / 10)) ] && return 0
    dmesg | grep -q 'Killed process [0-9]'
}

# For wait_until: the device DEV has had no request for MEM_IDLE_SECS,
# so its server SERVER has given its pool back, and pins at most its
# reserve (mem_cycle then checks that it kept that much, locked).  (The
# device's counters, /sys/block/DEV/stat, say when it last had a
# request.)
mem_given_back() {
    _mg_stat=$(cat "/sys/block/$1/stat") _mg_now=$(uptime_s)
    if [ "$_mg_stat" != "$(cat "$STATE/mem.stat" 2>/dev/null)" ]; then
        echo "$_mg_stat" > "$STATE/mem.stat"
        echo "$_mg_now" > "$STATE/mem.stat.t"
        return 1
    fi
    [ $((_mg_now - $(cat "$STATE/mem.stat.t"))) -ge "$MEM_IDLE_SECS" ] || return 1
    _mg_pin=$(mem_status "$2" VmPin)
    [ -n "$_mg_pin" ] && [ "$_mg_pin" -le "$MEM_RESERVE_KIB" ]
}

# The device for a variant, mkfs.ext4 and mount.  MEM_PLACE: loop (the
# kernel's loop driver, no server: the reference), inside (pdio attach
# run inside the writer's cgroup, pdio's default placement), outside
# (attach run from the root cgroup, the default placement), keep (attach
# $MEM_ATTACH_KEEP_CGROUP run inside the writer's cgroup: pdio stays in
# its limit).  For the global cycle, a plain attach.
mem_attach() {
    rm -f "$MEM_IMG"
    : > "$STATE/mem.stuck"
    mem_hog_stop
    truncate -s "${MEM_IMG_MIB}M" "$MEM_IMG"
    if [ "$MEM_PLACE" = loop ]; then
        [ "$MEM_WHERE" = global ] || mem_cg_make
        # By its path: busybox sh would run its own applet.
        /usr/sbin/losetup -f --show "$MEM_IMG" > "$STATE/mem.dev"
        mem_bounded 120 mkfs.ext4 -F -q "$(mem_dev)"
        mount -t ext4 -o noinit_itable "$(mem_dev)" "$MNT"
        sync
        mem_kmsg_reset
        detail "$(mem_dev) over $MEM_IMG: the kernel's loop driver, no server"
        return 0
    fi
    flags="" in=none
    [ "$MEM_PLACE" != keep ] || flags=$MEM_ATTACH_KEEP_CGROUP
    [ "$MEM_WHERE" != cgroup ] || mem_cg_make
    case $MEM_WHERE/$MEM_PLACE in cgroup/inside|cgroup/keep) in=$MEM_CG ;; esac
    # shellcheck disable=SC2086 # the flags, split
    mem_in "$in" "$MEM_PDIO" attach $flags "$MEM_IMG" > "$STATE/mem.dev"
    mem_bounded 120 mkfs.ext4 -F -q "$(mem_dev)"
    mount -t ext4 -o noinit_itable "$(mem_dev)" "$MNT"
    sync
    srv=$(mem_field server_pid) sup=$(mem_field supervisor_pid)
    echo "$srv" > "$STATE/mem.srv0"
    scg=$(mem_cgroup_of "$srv") pcg=$(mem_cgroup_of "$sup")
    mem_kmsg_reset
    detail "$(mem_dev): server $srv in $scg, supervisor $sup in $pcg (oom_score_adj $(cat "/proc/$srv/oom_score_adj")/$(cat "/proc/$sup/oom_score_adj"))"
    [ "$MEM_WHERE" = cgroup ] || return 0
    w=${MEM_CG#/sys/fs/cgroup}
    if [ "$MEM_PLACE" = keep ]; then
        [ "$scg" = "$w" ] && [ "$pcg" = "$w" ]
    else
        # Out of the writer's limit, in pdio's own slice.
        case $scg in "$MEM_SLICE"/*) ;; *) echo "server in $scg, not under $MEM_SLICE"; return 1 ;; esac
        case $pcg in "$MEM_SLICE"/*) ;; *) echo "supervisor in $pcg, not under $MEM_SLICE"; return 1 ;; esac
    fi
}

# One cycle: (1) idle until the server has given its pool back; (2)
# MEM_WRITE_MIB buffered into ext4, no fsync; (3) the hog; (4) sync,
# bounded.  Then the hog stopped, the data read back (O_DIRECT: through
# the server) against the source, the file removed.
mem_cycle() {
    n=$1 label=$2
    mem_not_stuck
    mem_hog_stop
    cg=none; [ "$MEM_WHERE" = global ] || cg=$MEM_CG
    dmesg -c >> "$LOGS/memory-kmsg.log" || true
    : > "$STATE/mem.kmsg"
    idle=0 server="" pin_bad=""
    if [ "$MEM_PLACE" != loop ]; then
        srv=$(mem_field server_pid)
        [ "$srv" = "$(cat "$STATE/mem.srv0")" ] || { echo "the server changed: $(cat "$STATE/mem.srv0") -> $srv ($(mem_field reason))"; return 1; }
        t0=$(mem_now)
        rm -f "$STATE/mem.stat"
        d=$(mem_dev)
        wait_until "$MEM_IDLE_MAX" mem_given_back "${d#/dev/}" "$srv" ||
            { echo "not idle, or VmPin $(mem_status "$srv" VmPin) kB > $MEM_RESERVE_KIB kB, after $MEM_IDLE_MAX s"; return 1; }
        idle=$(($(mem_now) - t0))
        lck=$(mem_status "$srv" VmLck)
        server=" (server VmPin $(mem_status "$srv" VmPin) kB, VmLck $lck kB, PSS $(mem_pss_kib "$srv") kB, RssAnon $(mem_status "$srv" RssAnon) kB)"
        # Given back, but its reserve, locked in memory: the first write
        # after idle allocates nothing.  (Judged at the end: the cycle
        # still runs.)
        [ "$lck" -ge "$MEM_RESERVE_KIB" ] ||
            pin_bad="the idle server has $lck kB locked, not its reserve of $MEM_RESERVE_KIB kB"
    fi
    # What is free once every cache that can go has gone: the global
    # hog's size.
    sync
    echo 3 > /proc/sys/vm/drop_caches
    avail=$(mem_avail_mib)
    oom0=$(mem_oom_events "$cg")

    rc=0
    mem_bounded "$MEM_SYNC_MAX" mem_in "$cg" dd if="$MEM_SRC" of="$MNT/data" bs=1M iflag=direct status=none || rc=$?
    wrote=$mem_took
    [ "$rc" = 0 ] || { echo "dd: exit $rc"; return 1; }

    if [ "$MEM_WHERE" = global ]; then
        hog=$((avail - MEM_GLOBAL_SLACK_MIB))
    else
        hog=$MEM_CG_HOG_MIB
    fi
    t0=$(mem_now)
    mem_hog_start "$hog" "$cg" "$MEM_HOG" --vm-hang 0 --vm-method write64
    filled=ok
    wait_until "$MEM_FILL_MAX" mem_hog_up "$hog" || filled=no
    fill=$(($(mem_now) - t0))
    hog_kib=$(mem_hog_rss)

    rc=0
    mem_bounded "$MEM_SYNC_MAX" sync || rc=$?
    synced=$mem_took
    psi=$(mem_psi /proc/pressure/memory)
    cpsi="" events=""
    if [ "$cg" != none ]; then
        cpsi=$(mem_psi "$cg/memory.pressure")
        events=$(tr '\n' ' ' < "$cg/memory.events")
    fi
    mem_hog_stop
    mem_kmsg
    mem_kmsg_counts
    oom=$(($(mem_oom_events "$cg") - oom0))
    failed=""; [ "$rc" = 0 ] || failed=" (exit $rc)"
    tap_diag "$label cycle $n: sync $(mem_secs "$synced") s$failed; write $(mem_secs "$wrote") s; hog ${hog} MiB, $((hog_kib / 1024)) MiB resident after $(mem_secs "$fill") s; OOM events $oom, kills $ooms (of pdio: $pdio_ooms), allocation failures $noio; /proc/pressure/memory: $psi${cpsi:+; cgroup: $cpsi}"
    [ "$rc" = 0 ] || { echo "sync: exit $rc after $(mem_secs "$synced") s"; mem_kmsg_verdict || true; return 1; }

    # Read back through the server, its cached pages dropped first (the
    # sync made them clean), and compared with the source.
    rc=0
    echo 3 > /proc/sys/vm/drop_caches
    mem_bounded "$MEM_SYNC_MAX" mem_same "$MNT/data" || rc=$?
    read_t=$mem_took
    good=no
    [ "$rc" != 0 ] || good=yes
    rm -f "$MNT/data"
    mem_bounded "$MEM_SYNC_MAX" sync
    echo "$events"
    detail "idle $(mem_secs "$idle") s$server, MemAvailable $avail MiB; write $(mem_secs "$wrote") s; hog $hog MiB ($filled: $((hog_kib / 1024)) MiB in $(mem_secs "$fill") s); sync $(mem_secs "$synced") s; read back $(mem_secs "$read_t") s: $good; OOM events $oom, kills $ooms, hung tasks $hung"
    [ "$good" = yes ] || { echo "read back: exit $rc: not the data written"; return 1; }
    mem_kmsg_verdict
    if [ "$MEM_PLACE" = loop ]; then
        # The reference: a hog of this size fits when nothing in the
        # device's path needs memory.
        [ "$oom" = 0 ] || { echo "the hog needed the OOM killer $oom times without a server: sized too large"; return 1; }
        return 0
    fi
    if [ "$MEM_WHERE/$MEM_HOG" = global/protected ]; then
        # Sized to fit once the writeback is done: the OOM killer was
        # not needed, as with the loop device (it would have had no
        # victim but pdio).
        [ "$oom" = 0 ] && [ "$ooms" = 0 ] || { echo "the OOM killer ran $oom times beside a hog that fits once written back"; return 1; }
    fi
    srv1=$(mem_field server_pid)
    [ "$srv1" = "$srv" ] || { echo "the server changed: $srv -> $srv1 ($(mem_field reason))"; return 1; }
    [ "$(mem_field restarts)" = 0 ] || { echo "restarts: $(mem_field restarts) ($(mem_field reason))"; return 1; }
    [ -z "$pin_bad" ] || { echo "$pin_bad"; return 1; }
}

# How many times the OOM killer was invoked: in cgroup CG (memory.events
# "oom", which counts those that found no victim too), or in the whole
# machine (none: /proc/vmstat oom_kill).
mem_oom_events() {
    if [ "$1" = none ]; then
        awk '$1 == "oom_kill" { print $2 }' /proc/vmstat
    else
        awk '$1 == "oom" { print $2 }' "$1/memory.events"
    fi
}

# The supervisor's log of the device, kept on the scratch disk as
# memory-supervisor-TAG.log.
mem_keep_log() {
    d=$(mem_dev)
    cp "$PDIO_RUN/${d#/dev/}.supervisor.log" "$LOGS/memory-supervisor-$1.log" 2>/dev/null || true
}

# A device left stuck (a sync that never ended: the filesystem's
# writeback waits on a server that is gone or cannot make progress):
# stop the hog, kill the supervisor and the server, and disconnect the
# device, which fails its requests, so that what waits on them returns
# and the rest of the run (its own sync) is not held too.  Every wait
# bounded; the filesystem is unmounted lazily.
mem_rescue() {
    [ -s "$STATE/mem.stuck" ] || return 0
    mem_keep_log "stuck-$(uptime_s)"
    # What is blocked, and where: the blocked tasks' stacks into the
    # kernel's log, kept with the rest of it.
    echo w > /proc/sysrq-trigger || true
    for t in /proc/"$(mem_field server_pid)"/task/*; do
        echo "server thread ${t##*/} ($(cat "$t/comm" 2>/dev/null)): $(cat "$t/wchan" 2>/dev/null)"
        cat "$t/stack" 2>/dev/null || true
    done
    mem_kmsg
    echo "stuck: $(cat "$STATE/mem.stuck"); stopping the hog, the supervisor and the server, disconnecting $(mem_dev)"
    mem_hog_stop || true
    for k in supervisor_pid server_pid; do
        p=$(mem_field "$k" 2>/dev/null || true)
        case $p in ''|0) ;; *) kill -KILL "$p" 2>/dev/null || true ;; esac
    done
    d=$(mem_dev)
    mem_bounded 60 pdio detach --force "$d" || mem_bounded 60 nbd-client -d "$d" || true
    wait_until 120 srv_disconnected "${d#/dev/nbd}" || echo "$d still connected"
    umount -l "$MNT" || true
    : > "$STATE/mem.stuck"
}

# The end of a variant: unmount, e2fsck clean, the server never replaced,
# no pdio process OOM-killed in pdio's own cgroup either, detach.
mem_end() {
    if [ -s "$STATE/mem.stuck" ]; then
        mem_rescue
        echo "the variant was stuck"
        return 1
    fi
    mem_hog_stop
    if [ "$MEM_PLACE" = loop ]; then
        mem_bounded 120 umount "$MNT"
        mem_bounded 300 e2fsck -fn "$(mem_dev)"
        /usr/sbin/losetup -d "$(mem_dev)"
        [ ! -d "$MEM_CG" ] || wait_until 10 rmdir "$MEM_CG"
        return 0
    fi
    srv=$(mem_field server_pid)
    restarts=$(mem_field restarts) reason=$(mem_field reason)
    mem_keep_log "$MEM_WHERE-$MEM_PLACE-$MEM_HOG"
    scg=$(mem_cgroup_of "$srv" 2>/dev/null || true)
    pdio_kills=none
    if [ -n "$scg" ] && [ "/sys/fs/cgroup$scg" != "$MEM_CG" ] && [ -f "/sys/fs/cgroup$scg/memory.events" ]; then
        pdio_kills=$(awk '$1 == "oom_kill" { print $2 }' "/sys/fs/cgroup$scg/memory.events")
    fi
    mem_bounded 120 umount "$MNT"
    mem_bounded 300 e2fsck -fn "$(mem_dev)"
    pdio detach "$(mem_dev)"
    srv_no_state
    srv_no_server
    [ ! -d "$MEM_CG" ] || wait_until 10 rmdir "$MEM_CG"
    detail "server $srv, restarts $restarts${reason:+ ($reason)}, oom_kill in pdio's cgroup ($scg): $pdio_kills; e2fsck clean"
    [ "$srv" = "$(cat "$STATE/mem.srv0")" ]
    [ "$restarts" = 0 ]
    case $pdio_kills in none|0) ;; *) return 1 ;; esac
}

# mem_variant WHERE PLACE HOW CYCLES
mem_variant() {
    MEM_WHERE=$1 MEM_PLACE=$2 MEM_HOG=$3
    case $1/$2 in
    */loop) l="memory-$1 reference: a loop device (no server), hog $3"
            what="losetup, the writer and the hog in the ${MEM_CG_MAX_MIB} MiB cgroup"
            [ "$1" = cgroup ] || what="losetup" ;;
    cgroup/keep) l="memory-cgroup, attach $MEM_ATTACH_KEEP_CGROUP in the writer's cgroup, hog $3"
                 what="pdio attach $MEM_ATTACH_KEEP_CGROUP run inside a ${MEM_CG_MAX_MIB} MiB cgroup (no swap): server and supervisor stay there" ;;
    cgroup/inside) l="memory-cgroup, attach inside the writer's cgroup, hog $3"
                   what="pdio attach run inside a ${MEM_CG_MAX_MIB} MiB cgroup (no swap): server and supervisor placed under $MEM_SLICE" ;;
    cgroup/outside) l="memory-cgroup, attach outside the writer's cgroup, hog $3"
                    what="pdio attach run outside the writer's ${MEM_CG_MAX_MIB} MiB cgroup (no swap): server and supervisor placed under $MEM_SLICE" ;;
    global/*) l="memory-global, hog $3"
              what="pdio attach" ;;
    esac
    step "$l: $what; mkfs.ext4, mount" mem_attach
    i=1
    while [ "$i" -le "$4" ]; do
        if [ "$2" = loop ]; then
            step "$l: cycle $i: $MEM_WRITE_MIB MiB buffered, hog, sync, read back: the hog fits (no OOM event), no hung task" mem_cycle "$i" "$l"
        else
            step "$l: cycle $i: idle give-back, $MEM_WRITE_MIB MiB buffered, hog, sync within $MEM_SYNC_MAX s; read back; no pdio OOM kill, hung task or restart" mem_cycle "$i" "$l"
        fi
        i=$((i + 1))
    done
    if [ "$2" = loop ]; then
        step "$l: unmount, e2fsck -fn clean, losetup -d" mem_end
    else
        step "$l: unmount, e2fsck -fn clean, server never replaced, pdio detach leaves nothing" mem_end
    fi
}

scenario_memory_cgroup() {
    step "memory: cgroup2 with the memory controller, PSI, stress-ng; hung-task detector at $MEM_HUNG_TIMEOUT s" mem_setup
    mem_variant cgroup loop protected "$MEM_REF_CYCLES"
    mem_variant cgroup inside killable "$MEM_CYCLES"
    mem_variant cgroup inside protected "$MEM_CYCLES"
    mem_variant cgroup outside killable "$MEM_CYCLES"
    mem_variant cgroup outside protected "$MEM_CYCLES"
    step "memory: teardown: no hog, test cgroups removed, console and hung-task detector as before" mem_teardown
}

# pdio in the writer's limit (attach --slice none), only beside a hog
# the OOM killer may take: with a protected one it is not supported (see
# the top).  On demand, not part of "memory".
scenario_memory_slice_none() {
    step "memory: cgroup2 with the memory controller, PSI, stress-ng; hung-task detector at $MEM_HUNG_TIMEOUT s" mem_setup
    mem_variant cgroup keep killable "$MEM_CYCLES"
    step "memory: teardown: no hog, test cgroups removed, console and hung-task detector as before" mem_teardown
}

scenario_memory_global() {
    step "memory: cgroup2 with the memory controller, PSI, stress-ng; hung-task detector at $MEM_HUNG_TIMEOUT s" mem_setup
    mem_variant global loop protected "$MEM_REF_CYCLES"
    mem_variant global default killable "$MEM_CYCLES"
    mem_variant global default protected "$MEM_CYCLES"
    step "memory: teardown: no hog, test cgroups removed, console and hung-task detector as before" mem_teardown
}

# --- swap ---------------------------------------------------------------------------
# ms_attach: pdio attach --swap of a block device (the 4Kn scratch disk,
# which only the sector4k scenario uses, formatting it afresh), mkswap
# on MEM_SWAP_IMG_MIB of it, swapon.  A block device: an image file on
# a filesystem puts that filesystem's own writeback in the swap path (a
# sparse file on the scratch disk's ext4 stalled kswapd, kblockd and its
# jbd2 for over 90 s).
ms_attach() {
    : > "$STATE/mem.stuck"
    # shellcheck disable=SC2086 # the flags, split
    "$MEM_PDIO" attach $MEM_ATTACH_SWAP "$MEM_SWAP_DEV" > "$STATE/mem.dev"
    srv=$(mem_field server_pid)
    echo "$srv" > "$STATE/mem.srv0"
    mkswap "$(mem_dev)" $((MEM_SWAP_IMG_MIB * 1024))
    swapon "$(mem_dev)"
    cat /proc/swaps
    grep -q "^$(mem_dev) " /proc/swaps
    detail "$(mem_dev) ($MEM_SWAP_DEV, $(($(awk -v d="$(mem_dev)" '$1 == d { print $3 }' /proc/swaps) / 1024)) MiB of swap) swapped on; server $srv VmLck $(mem_status "$srv" VmLck) kB, VmPin $(mem_status "$srv" VmPin) kB"
}

# mem_same FILE: FILE holds the source's bytes.  By the source's MD5,
# taken once when it was made: under TCG (qemu64) md5sum reads 200 MiB
# in 1.9 s where cmp takes 10 s, which was a third of every pressure
# cycle.  A difference is then found again with cmp, to be named.
mem_same() {
    [ "$(md5sum < "$1" | cut -d' ' -f1)" = "$(cat "$STATE/mem.src.md5")" ] && return 0
    echo "$1 is not the source: $(cmp "$1" "$MEM_SRC" 2>&1 | head -n 1)"
    return 1
}

mem_vmstat() { awk -v k="$1" '$1 == k { print $2 }' /proc/vmstat; }
mem_swap_used_kib() { awk -v d="$(mem_dev)" '$1 == d { print $4 }' /proc/swaps; }

# Data through swap and back: MEM_WRITE_MIB of the source copied into
# tmpfs (swap-backed pages, charged to MEM_SWAP_CG), a hog that outgrows
# what is left by MEM_SWAP_OVER_MIB, then, the hog still holding its
# memory, the tmpfs copy read back and compared with the source.  Which
# pages the hog's pressure sends out is the LRU's choice: once it sent
# only the hog's own, and the copy was read back without one page in
# (pswpin 0).  So the copy's cgroup is also told to reclaim it
# (memory.reclaim): its pages leave memory for the device, and come back
# in through it.  One pass each way: a hog that verified its own pages
# would sweep them all in and out on every pass (LRU against a cyclic
# scan): 600 s did not see one such pass through.
ms_hog() {
    mem_not_stuck
    grep -q "^$(mem_dev) " /proc/swaps || { echo "no swap on $(mem_dev)"; return 1; }
    [ ! -d "$MEM_SWAP_CG" ] || rmdir "$MEM_SWAP_CG"
    mkdir "$MEM_SWAP_CG"
    [ -f "$MEM_SWAP_CG/memory.reclaim" ] || { echo "no memory.reclaim in $MEM_SWAP_CG"; return 1; }
    mem_kmsg_reset
    out0=$(mem_vmstat pswpout) in0=$(mem_vmstat pswpin)
    t0=$(mem_now)
    mem_in "$MEM_SWAP_CG" dd if="$MEM_SRC" of="$MEM_SWAP_DATA" bs=1M iflag=direct status=none
    sync
    echo 3 > /proc/sys/vm/drop_caches
    avail=$(mem_avail_mib)
    hog=$((avail + MEM_SWAP_OVER_MIB))
    # Killable, as a program that outgrows memory should be.
    mem_hog_start "$hog" none killable --vm-hang 0 --vm-method write64
    filled=ok
    wait_until "$MEM_SWAP_MAX" ms_hog_up "$hog" || filled=no
    fill=$(($(mem_now) - t0))
    hog_kib=$(mem_hog_rss)
    # What reclaim cannot take in its retries it refuses (EAGAIN): the
    # resident and swapped sizes below are what counts.
    echo "${MEM_WRITE_MIB}M" > "$MEM_SWAP_CG/memory.reclaim" || true
    res_kib=$(($(cat "$MEM_SWAP_CG/memory.current") / 1024))
    out_kib=$(($(cat "$MEM_SWAP_CG/memory.swap.current") / 1024))
    used=$(mem_swap_used_kib)
    rc=0
    mem_bounded "$MEM_SWAP_MAX" mem_same "$MEM_SWAP_DATA" || rc=$?
    cmp_t=$mem_took
    # The most swap held, at the hog's fill or after the read back.
    u=$(mem_swap_used_kib)
    [ "${u:-0}" -le "${used:-0}" ] || used=$u
    out=$(($(mem_vmstat pswpout) - out0)) in=$(($(mem_vmstat pswpin) - in0))
    mem_hog_stop
    rm -f "$MEM_SWAP_DATA"
    rmdir "$MEM_SWAP_CG"
    mem_kmsg
    mem_kmsg_counts
    tap_diag "memory-swap: $MEM_WRITE_MIB MiB in tmpfs, hog ${hog} MiB (MemAvailable $avail MiB): $((hog_kib / 1024)) MiB resident after $(mem_secs "$fill") s; the copy before the read back: $((res_kib / 1024)) MiB resident, $((out_kib / 1024)) MiB swapped; swap used $((used / 1024)) MiB; read back and compared in $(mem_secs "$cmp_t") s, exit $rc; pswpout $out, pswpin $in pages; OOM kills $ooms (of pdio: $pdio_ooms); /proc/pressure/memory: $(mem_psi /proc/pressure/memory)"
    detail "hog $hog MiB ($filled: $((hog_kib / 1024)) MiB in $(mem_secs "$fill") s); the copy $((res_kib / 1024)) MiB resident, $((out_kib / 1024)) MiB swapped; swap used $((used / 1024)) MiB, pswpout $out, pswpin $in; tmpfs copy compared: exit $rc in $(mem_secs "$cmp_t") s"
    [ "$rc" = 0 ] || { echo "the tmpfs copy, back from swap, is not the source (exit $rc)"; mem_kmsg_verdict || true; return 1; }
    # Most of the copy out on the device, and little of it left in
    # memory: its read back must come in through the device.
    [ "$out_kib" -ge $((MEM_WRITE_MIB * 1024 * 3 / 4)) ] ||
        { echo "only $((out_kib / 1024)) MiB of the $MEM_WRITE_MIB MiB copy was swapped out"; return 1; }
    [ "$res_kib" -le $((MEM_WRITE_MIB * 1024 / 4)) ] ||
        { echo "$((res_kib / 1024)) MiB of the $MEM_WRITE_MIB MiB copy still in memory"; return 1; }
    [ "${used:-0}" -gt 0 ]
    [ "$out" -gt 0 ]
    [ "$in" -gt 0 ]
    mem_kmsg_verdict
}

# For wait_until: the hog holds 90 % of MIB, resident or swapped, or
# the OOM killer has acted.
ms_hog_up() {
    for _mu_p in $(mem_pids stress-ng-vm); do
        _mu_k=$(awk '/^Vm(RSS|Swap):/ { k += $2 } END { print k + 0 }' "/proc/$_mu_p/status" 2>/dev/null || echo 0)
        [ "$_mu_k" -lt $(($1 * 1024 * 9 / 10)) ] || return 0
    done
    dmesg | grep -q 'Killed process [0-9]'
}

ms_end() {
    if [ -s "$STATE/mem.stuck" ]; then
        mem_rescue
        echo "stuck"
        return 1
    fi
    srv=$(mem_field server_pid) restarts=$(mem_field restarts) reason=$(mem_field reason)
    mem_keep_log swap
    mem_bounded 300 swapoff "$(mem_dev)"
    pdio detach "$(mem_dev)"
    srv_no_state
    srv_no_server
    detail "swapoff in $(mem_secs "$mem_took") s; server $srv, restarts $restarts${reason:+ ($reason)}"
    [ "$srv" = "$(cat "$STATE/mem.srv0")" ]
    [ "$restarts" = 0 ]
}

scenario_memory_swap() {
    step "memory: cgroup2 with the memory controller, PSI, stress-ng; hung-task detector at $MEM_HUNG_TIMEOUT s" mem_setup
    step "memory-swap: pdio attach $MEM_ATTACH_SWAP $MEM_SWAP_DEV, mkswap, swapon" ms_attach
    step "memory-swap: $MEM_WRITE_MIB MiB in tmpfs, a hog ${MEM_SWAP_OVER_MIB} MiB larger than what is left: swapped out to the device and back, compared with the source; no pdio OOM kill, no hung task" ms_hog
    step "memory-swap: swapoff within 300 s, server never replaced, pdio detach leaves nothing" ms_end
    step "memory: teardown: no hog, test cgroups removed, console and hung-task detector as before" mem_teardown
}

scenario_memory() {
    scenario_memory_flags
    scenario_memory_cgroup
    scenario_memory_global
    scenario_memory_swap
}
