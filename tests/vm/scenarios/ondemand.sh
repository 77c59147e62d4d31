# SPDX-License-Identifier: BSD-3-Clause
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
# demand gone.  The kernel removes them asynchronously after the
# disconnect, one by one: 62 took 32 s in a loaded TCG run, so the wait is
# only a deadlock guard and the time it took is a figure.
od_nothing_left() {
    left=$(od_state_left)
    [ -z "$left" ] || { echo "left in $PDIO_RUN: $left"; return 1; }
    srv_no_server
    t0=$(od_now)
    wait_until 120 od_none_made ||
        { echo "devices made on demand still there 120 s after: $(od_made | tr '\n' ' ')"; return 1; }
    od_gone=$(od_secs $(($(od_now) - t0)))
    echo "the devices made on demand gone $od_gone s after the detach (TCG)"
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
    srv_nothing_left || { echo "pdio state left by an earlier scenario"; return 1; }
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
        srv_connected "${d#/dev/nbd}" || { echo "$d not connected"; return 1; }
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
# locks its reserve and nothing more (as the cli scenario's cli_idle_memory).
OD_PSS_MAX_KIB=4096
# One reading of every device's PSS and pinned memory; true if each is
# within its bound.
od_pss_read() {
    total=0 n=0 max=0 maxdev= maxsplit= bad=0 first_bad= dead=0 thp=0
    while read -r i d; do
        s=$(od_field "$d" server_pid)
        v=$(od_field "$d" supervisor_pid)
        if [ "$(cat "/proc/$s/comm")" != pdio ] ||
           [ "$(cat "/proc/$v/comm")" != pdio-supervise ]; then
            dead=$((dead + 1))
            continue
        fi
        ps=$(od_pss_kib "$s") pv=$(od_pss_kib "$v")
        p=$((ps + pv))
        total=$((total + p))
        [ "$p" -le "$max" ] || {
            max=$p maxdev=$d
            maxsplit="server $ps KiB, supervisor $pv KiB, huge pages $(awk '/^AnonHugePages:/ { print $2 }' "/proc/$s/smaps_rollup") KiB"
        }
        # A 2 MiB transparent huge page, faulted in by one touch, would
        # double an idle server: both processes run with them disabled.
        for q in "$s" "$v"; do
            [ "$(awk '/^THP_enabled:/ { print $2 }' "/proc/$q/status")" = 0 ] ||
                thp=$((thp + 1))
        done
        pin=$(awk '/^VmPin:/ { print $2 }' "/proc/$s/status")
        lck=$(awk '/^VmLck:/ { print $2 }' "/proc/$s/status")
        if [ "$pin $lck" != "$SRV_RESERVE_PIN_KB $SRV_RESERVE_LCK_KB" ]; then
            bad=$((bad + 1))
            first_bad=${first_bad:-"$d: VmPin $pin kB, VmLck $lck kB"}
        fi
        n=$((n + 1))
    done < "$STATE/od.devs"
    [ "$dead" = 0 ] && [ "$max" -le "$OD_PSS_MAX_KIB" ] && [ "$bad" = 0 ] &&
        [ "$thp" = 0 ]
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
    detail "read $(od_secs $(($(od_now) - t0))) s after the last I/O (TCG); $n servers and supervisors alive, $dead dead; PSS $((total / 1024)) MiB in all, $(cat "$STATE/od.pss_kib") KiB per device, at most $max KiB ($maxdev: $maxsplit; limit $OD_PSS_MAX_KIB); $thp processes with transparent huge pages; each server's VmPin $SRV_RESERVE_PIN_KB kB and VmLck $SRV_RESERVE_LCK_KB kB${first_bad:+ but for $bad (first $first_bad)}"
    [ "$n" = "$OD_N" ]
    [ "$dead" = 0 ]
    [ "$max" -le "$OD_PSS_MAX_KIB" ]
    [ "$bad" = 0 ]
    [ "$thp" = 0 ]
}

od_detach_all() {
    pdio detach --all
    od_nothing_left
    kept=$(ls -d /sys/block/nbd* | wc -l)
    cached=$(od_fincore_zero "$OD_N")
    detail "no device, server, supervisor or state left; $kept devices stay (the module's), the $((OD_N - OD_NBDS_MAX)) made on demand are gone (in $od_gone s, TCG); fincore: $cached pages of the $OD_N images"
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
            srv_connected "${d#/dev/nbd}" || { echo "$d not connected"; return 1; }
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
    srv_connected 1
    srv_connected 40
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
    srv_nothing_left
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
