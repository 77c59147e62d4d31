# SPDX-License-Identifier: BSD-3-Clause
# --- names: /dev/disk/by-pdio/NAME -----------------------------------------------------
# udev as an initramfs runs it, without systemd: systemd-udevd --daemon,
# with the host's rules and pdio's (60-pdio.rules and pdio-name, which
# run.sh puts where make install does).  While a device is attached,
# /dev/disk/by-pdio/NAME leads to it (NAME-partN to its partitions), by
# default NAME from the image's file name, else --name; after detach
# nothing is left of them.  Invalid names and a name in use are refused.
# udevd is stopped again at the end: the other scenarios run without it.
# Broken variants: run.sh --break no-alias (no name in the identifier),
# any-name, name-unchecked, no-busy-retry (attach --device gives up on
# the kernel's first EBUSY).
NM_DIR=/scratch/names
NM_IMG=$NM_DIR/web-data.img
NM_PT=$NM_DIR/parted.disk.img

nm_udev_start() {
    mkdir -p "$NM_DIR"
    [ -f /lib/udev/rules.d/60-pdio.rules ] && [ -x /lib/udev/pdio-name ] ||
        { echo "pdio's udev rule is not installed"; return 1; }
    /lib/systemd/systemd-udevd --daemon --resolve-names=never
    wait_until 10 test -S /run/udev/control
    udevadm trigger --action=add --subsystem-match=block
    udevadm settle --timeout=60
    detail "systemd-udevd $(udevadm --version) as a daemon, $(ls /lib/udev/rules.d | wc -l) rule files"
}

nm_udev_stop() {
    udevadm control --exit
    wait_until 10 sh -c '! udevadm control --ping 2>/dev/null'
    # What udevd leaves in /run, for the later scenarios to run without it
    # (pdio waits for udev while /run/udev/control exists).
    rm -rf /run/udev
    [ ! -e /run/udev/control ]
}

# nm_link NAME: where /dev/disk/by-pdio/NAME leads, "" if nowhere.
nm_link() {
    if [ -L "/dev/disk/by-pdio/$1" ]; then readlink -f "/dev/disk/by-pdio/$1"; fi
}

# nm_links_gone: no /dev/disk/by-pdio link at all.
nm_links_gone() {
    left=$(ls /dev/disk/by-pdio 2>/dev/null || true)
    [ -z "$left" ] || { echo "left in /dev/disk/by-pdio: $left"; return 1; }
}

# nm_detached DEV: detached, udev done, no link, no state.
nm_detached() {
    udevadm settle --timeout=60
    pdio detach "$1"
    udevadm settle --timeout=60
    nm_links_gone
    srv_no_state
}

nm_default() {
    rm -f "$NM_IMG"
    truncate -s 64M "$NM_IMG"
    d=$(pdio attach "$NM_IMG")
    udevadm settle --timeout=60
    cat "/sys/block/${d#/dev/}/backend"
    ls -l /dev/disk/by-pdio || true
    [ "$(nm_link web-data)" = "$d" ] ||
        { echo "/dev/disk/by-pdio/web-data leads to '$(nm_link web-data)', not $d"; pdio detach "$d"; return 1; }
    pdio list --json | grep -F '"by-pdio": "/dev/disk/by-pdio/web-data"'
    nm_detached "$d"
    detail "$NM_IMG on $d: /dev/disk/by-pdio/web-data -> $d while attached, gone after detach"
}

nm_partitions() {
    rm -f "$NM_PT"
    truncate -s 96M "$NM_PT"
    printf 'label: gpt\nsize=24MiB\nsize=48MiB\n' | sfdisk -q "$NM_PT"
    d=$(pdio attach "$NM_PT")
    udevadm settle --timeout=60
    ls -l /dev/disk/by-pdio || true
    for l in parted.disk:"$d" parted.disk-part1:"${d}p1" parted.disk-part2:"${d}p2"; do
        [ "$(nm_link "${l%%:*}")" = "${l#*:}" ] ||
            { echo "/dev/disk/by-pdio/${l%%:*} leads to '$(nm_link "${l%%:*}")', not ${l#*:}"; pdio detach "$d"; return 1; }
    done
    nm_detached "$d"
    detail "$NM_PT on $d: by-pdio/parted.disk, parted.disk-part1, parted.disk-part2 while attached, gone after detach"
}

# --name.  (Not with --device past nbds_max: udev opens the device the
# kernel makes for it, which then is in use for the connect.)
nm_name() {
    rm -f "$NM_IMG"
    truncate -s 64M "$NM_IMG"
    d=$(pdio attach --name web.1_a-b "$NM_IMG")
    udevadm settle --timeout=60
    ls -l /dev/disk/by-pdio || true
    [ "$(nm_link web.1_a-b)" = "$d" ] ||
        { echo "/dev/disk/by-pdio/web.1_a-b leads to '$(nm_link web.1_a-b)', not $d"; pdio detach "$d"; return 1; }
    [ -z "$(nm_link web-data)" ] || { echo "the default name too"; pdio detach "$d"; return 1; }
    mkfs.ext4 -F -q /dev/disk/by-pdio/web.1_a-b
    mount /dev/disk/by-pdio/web.1_a-b "$MNT"
    echo named > "$MNT/f"
    umount "$MNT"
    nm_detached "$d"
    detail "--name web.1_a-b on $d: linked, mkfs/mount through the link; gone after detach"
}

# nm_refused RC WHAT ARGS...: pdio attach ARGS exits RC, saying WHAT, and
# attaches nothing.
nm_refused() {
    want=$1 what=$2; shift 2
    rc=0
    pdio attach "$@" > "$STATE/nm.out" 2> "$STATE/nm.err" || rc=$?
    cat "$STATE/nm.err"
    if [ "$rc" != "$want" ] || ! grep -qF -- "$what" "$STATE/nm.err"; then
        echo "pdio attach $*: exit $rc, not $want with \"$what\""
        got=$(cat "$STATE/nm.out")
        [ -z "$got" ] || pdio detach "$got" || true
        return 1
    fi
}

nm_errors() {
    rm -f "$NM_IMG" "$NM_DIR/other.img"
    truncate -s 64M "$NM_IMG" "$NM_DIR/other.img"
    long=$(printf '%065d' 0)
    for bad in "" . .. a/b "x y" "a:b" "$long"; do
        nm_refused 2 "--name $bad: must be 1 to 64" --name "$bad" "$NM_IMG" || return 1
    done
    srv_no_state
    d=$(pdio attach --name shared "$NM_IMG")
    nm_refused 1 "/dev/disk/by-pdio/shared is $d's already" --name shared "$NM_DIR/other.img" ||
        { pdio detach "$d"; return 1; }
    udevadm settle --timeout=60
    [ "$(nm_link shared)" = "$d" ] ||
        { echo "by-pdio/shared leads to '$(nm_link shared)', not $d"; pdio detach "$d"; return 1; }
    # The refused attach left nothing: one record, one server.
    n=$(ls "$PDIO_RUN" | grep -c '\.rec$' || true)
    [ "$n" = 1 ] || { ls "$PDIO_RUN"; pdio detach "$d"; return 1; }
    # A default name in use: attached, with no name.
    mkdir -p "$NM_DIR/b"
    rm -f "$NM_DIR/b/shared.img"
    truncate -s 64M "$NM_DIR/b/shared.img"
    d2=$(pdio attach "$NM_DIR/b/shared.img" 2> "$STATE/nm.err")
    cat "$STATE/nm.err"
    udevadm settle --timeout=60
    ok=1
    grep -qF "gets no name" "$STATE/nm.err" || ok=0
    [ "$(nm_link shared)" = "$d" ] || ok=0
    pdio detach "$d2"
    nm_detached "$d"
    [ "$ok" = 1 ] || { echo "a default name in use: no warning, or the link moved"; return 1; }
    detail "--name '' . .. a/b 'x y' a:b and 65 characters: exit 2; --name in use: exit 1, nothing attached; default name in use: attached without one"
}

# attach --device of a device past nbds_max while udevd runs, five times
# without waiting for udev: each detach destroys the device and each
# attach makes it again, and udev's worker opens it (the event of its
# making, or of the last one going away) while attach connects it; the
# kernel calls it in use for that moment.  Every attach must succeed.
nm_device() {
    rm -f "$NM_IMG"
    truncate -s 64M "$NM_IMG"
    k=0 failed=0
    while [ $k -lt 5 ]; do
        if d=$(pdio attach --device /dev/nbd40 "$NM_IMG" 2> "$STATE/nm.dev"); then
            [ "$d" = /dev/nbd40 ] || failed=$((failed + 1))
            pdio detach "$d"
        else
            cat "$STATE/nm.dev"
            failed=$((failed + 1))
        fi
        k=$((k + 1))
    done
    udevadm settle --timeout=60
    nm_links_gone
    srv_no_state
    detail "5 attach --device /dev/nbd40 and detach under udevd: $failed failed"
    [ "$failed" = 0 ]
}

scenario_names() {
    step "names: systemd-udevd runs as a daemon with pdio's udev rule" nm_udev_start
    step "names: /dev/disk/by-pdio/NAME (the image's file name) leads to the device while attached, gone after detach" nm_default
    step "names: a partitioned image gets NAME-part1 and NAME-part2, gone after detach" nm_partitions
    step "names: attach --name NAME; the link mounts; gone after detach" nm_name
    step "names: --name refuses invalid names and a name in use; a default name in use is dropped" nm_errors
    step "names: attach --device /dev/nbd40 (made past nbds_max) 5 times under udevd: every one attaches" nm_device
    step "names: udevd stops, nothing of it left for the other scenarios" nm_udev_stop
}
