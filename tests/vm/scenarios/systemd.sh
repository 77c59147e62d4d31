# SPDX-License-Identifier: BSD-3-Clause
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
    srv_all_gone "$SD_IMG"
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
    gone=yes
    srv_all_gone "$SD_IMG" || gone=no
    left=""
    if [ -f "/sys/fs/cgroup$cg/cgroup.procs" ]; then
        left=$(tr '\n' ' ' < "/sys/fs/cgroup$cg/cgroup.procs")
    fi
    # The scope goes once it is empty.
    scope=$(cat "$STATE/sd.scope" 2>/dev/null || echo "pdio-$sup.scope")
    wait_until 10 sh -c '! systemctl is-active --quiet "$1"' _ "$scope" || true
    scope_state=$(systemctl is-active "$scope" || true)
    detail "systemctl stop took $(echo "$t0 $t1" | awk '{printf "%.1f", $2 - $1}') s: $SD_UNIT $state (result $result) ${still:-unmounted}; device, server $server, supervisor $sup, state all gone: $gone; left in $cg: ${left:-nothing}; $scope $scope_state; pdio.slice MemoryMin $(sd_prop MemoryMin pdio.slice); fincore $(cat "$STATE/all_gone.pages" 2>/dev/null) pages"
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
    srv_all_gone "$SD_IMG"
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
    wait_until 15 srv_nothing_left || true
    # /scratch back for the rest of the run.
    if ! grep -q " /scratch " /proc/mounts; then systemctl start scratch.mount; fi
    detail "systemctl start $SD_UNIT mounted $dev again; systemctl stop scratch.mount (as at shutdown) took $(echo "$t0 $t1" | awk '{printf "%.1f", $2 - $1}') s: $SD_UNIT $m, scratch.mount $sc (result $sr)"
    [ "$m" = inactive ]
    [ "$sc" = inactive ]
    [ "$sr" = success ]
    srv_no_state
    srv_no_server
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
    if srv_connected "$i"; then connected=yes; fi
    fs=$(udevadm info --query=property "$d" | sed -n 's/^ID_FS_TYPE=//p')
    used="not mounted"
    if [ "$connected" = yes ]; then
        $MOUNT -t ext4 -o ro "$d" "$MNT"
        (cd "$MNT" && sha256sum -c "$STATE/sd.new")
        $UMOUNT "$MNT"
        used="mounted, written-under-systemd checked, unmounted"
    fi
    gone=yes
    srv_all_gone "$SD_IMG" || gone=no
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
