#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
# tests/vm/guest-init.sh — /init of the TCG guest booted by tests/vm/run.sh.
#
# Boots the guest (mounts, modules, the scratch disk), runs the scenarios
# run.sh asked for, each a file of its own (tests/vm/scenarios/NAME.sh,
# /pdio/scenarios here) on the guest's library (tests/lib/guest.sh and
# tap.sh, /pdio/lib here), and ends the run: a check of the scratch disk,
# the summary, poweroff.  The kernel nbd client meets pdio's servers on a
# unix socket, with the images on a virtio-blk scratch disk.  Prints TAP
# to /dev/ttyS1 (the host passes it on): a plan, one "ok N - ..." / "not
# ok N - ..." per step, "# ..." figures, and a final "N passed, M failed".
# Everything else (commands and their output, kernel messages, and a copy
# of the TAP lines) goes to the console, /dev/ttyS0, and the scratch
# disk's /logs directory.
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
. /pdio/lib/tap.sh
. /pdio/lib/guest.sh
# run.sh --break: /usr/bin/pdio is the test build (tests/vm/breaks.c),
# and this says what it breaks (see scenario_recover).
if [ -n "${PDIO_TEST_BREAK:-}" ]; then export PDIO_TEST_BREAK; fi
TAP_OUT=/dev/ttyS1
stty -F "$TAP_OUT" raw -echo 2>/dev/null

IMG_SIZE=$((1024 * 1024 * 1024))     # xfs wants at least 300 MiB
# The server of the scenarios that run under either (see main), by
# default pdio's own.
SERVER_DEFAULT=${PDIO_TEST_SERVER:-native}
SERVER=$SERVER_DEFAULT SCENARIO=guest
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

# --- the scenarios ------------------------------------------------------------------
# /pdio/scenarios/*.sh (tests/vm/scenarios/ in the tree): each defines its
# scenario_NAME functions (memory.sh several) on /pdio/lib/guest.sh.
for f in /pdio/scenarios/*.sh; do
    # shellcheck disable=SC1090 # copied in by run.sh
    . "$f"
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
    # nbdkit-NAME: scenario NAME with SERVER=nbdkit (nbdkit and pdio.so).
    for s in $SCENARIOS; do
        s0=$(uptime_s)
        SCENARIO=$s
        case $s in
        nbdkit-*) SERVER=nbdkit; "scenario_${s#nbdkit-}" ;;
        *) SERVER=$SERVER_DEFAULT; "scenario_$s" ;;
        esac
        tap_diag "scenario $s: $(($(uptime_s) - s0))s"
    done
    main_end
}

# (The systemd scenario's unit runs this after its own steps.)
main_end() {
    SERVER=$SERVER_DEFAULT SCENARIO=guest
    # The figures together, at the end of the report (served_fincore_zero's,
    # by server log name).
    for f in "$STATE"/fincore.pdio.*; do
        [ ! -f "$f" ] || tap_diag "fincore after ${f##*/fincore.pdio.} (pdio): $(cat "$f") pages"
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
