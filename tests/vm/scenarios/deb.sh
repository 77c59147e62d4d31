# SPDX-License-Identifier: BSD-3-Clause
# --- deb: the Debian packages, installed -------------------------------------------------
# run.sh builds pdio and nbdkit-plugin-pdio (as make deb does) and puts
# them in /pdio/deb with dpkg.  The guest's own pdio(1), mount helpers,
# udev rule and plugin (the build tree's, which the other scenarios run)
# are moved aside first, so that every pdio file on the machine is the
# package's; the packages go into the guest's root with dpkg -i (with
# --force-depends: the guest's dpkg database knows none of the host
# packages its binaries come from, only a stand-in that owns its
# directories).  Then /usr/bin/pdio, by that path,
# attaches an image (mkfs, mount, a file, umount, detach), mount -t pdio
# runs the package's mount.pdio, nbdkit loads the package's plugin, and
# udev, with the package's rule, names the device.  dpkg -r then
# leaves the machine as it was before dpkg -i: every file dpkg -L listed
# gone, nothing new anywhere (the run directory's empty lock file
# aside), no pdio process.  The build tree's files come back at the end.
DEB_IMG=/scratch/deb/debdisk.img
DEB_STASH=/pdio/stash
DEB_PDIO=/usr/bin/pdio
# dpkg's own, not busybox's applet (which the guest's shell prefers).
DPKG=/usr/bin/dpkg
# What the build tree put where the packages install theirs.
DEB_OURS="/usr/bin/pdio /usr/sbin/mount.pdio /usr/sbin/umount.pdio
  /usr/lib/udev/rules.d/60-pdio.rules /usr/lib/udev/pdio-name"

# Every file and link outside what the tests and the kernel own, dpkg's
# database and log, and libmount's utab (/run/mount), which mount(8)
# makes for mount -t pdio.
deb_snapshot() {
    {
        find / -xdev \( -path /var/lib/dpkg -o -path /var/log/dpkg.log -o -path /pdio \) -prune -o -print
        find /run /tmp -xdev \( -path /run/pdio-test -o -path /run/udev -o -path /run/mount \) -prune -o -print
    } | grep -vx '/run/pdio\|/run/pdio/lock' | LC_ALL=C sort
}

# The directories the guest's root has, in dpkg's database as one
# stand-in package's, as base-files and the other packages of a Debian
# machine own them: dpkg -r removes a directory (or the merged /usr's
# /sbin and /lib links) only when no other package has it.
deb_guest_root() {
    cat > /var/lib/dpkg/status <<EOS
Package: guest-root
Status: install ok installed
Priority: required
Section: admin
Installed-Size: 0
Maintainer: pdio tests <root@localhost>
Architecture: amd64
Version: 1
Description: the test guest's root, as its initramfs made it

EOS
    {
        find / -xdev \( -path /var/lib/dpkg -o -path /pdio \) -prune -o -type d -print
        for l in /bin /sbin /lib /lib64; do [ ! -L "$l" ] || echo "$l"; done
    } | sed 's|^/$|/.|' | LC_ALL=C sort > /var/lib/dpkg/info/guest-root.list
}

deb_install() {
    ls -l /pdio/deb
    mkdir -p "$DEB_STASH" /scratch/deb
    for f in $DEB_OURS; do
        [ ! -e "$f" ] && [ ! -L "$f" ] || mv "$f" "$DEB_STASH/$(echo "$f" | tr / _)"
    done
    mkdir -p /var/lib/dpkg/info /var/lib/dpkg/updates /var/lib/dpkg/triggers /var/log
    deb_guest_root
    deb_snapshot > "$STATE/deb.before"
    $DPKG --force-depends -i /pdio/deb/pdio_*.deb /pdio/deb/nbdkit-plugin-pdio_*.deb
    $DPKG -l pdio nbdkit-plugin-pdio | grep '^ii'
    $DPKG -L pdio nbdkit-plugin-pdio | sort -u > "$STATE/deb.files"
    for f in $DEB_OURS; do
        [ -e "$f" ] || { echo "$f: not installed by the packages"; return 1; }
    done
    detail "$(cd /pdio/deb && echo pdio_*.deb nbdkit-plugin-pdio_*.deb): $(wc -l < "$STATE/deb.files") paths; $DEB_PDIO $($DEB_PDIO --version 2>&1 | head -n 1)"
}

# pdio attach, mkfs, mount, a file, umount, detach: all by the package's
# pdio, and its udev rule names the device.
deb_attach() {
    unset PDIO_PLUGIN
    rm -f "$DEB_IMG"
    truncate -s 128M "$DEB_IMG"
    nm_udev_start
    d=$($DEB_PDIO attach "$DEB_IMG")
    udevadm settle --timeout=60
    ok=1
    [ "$(nm_link debdisk)" = "$d" ] || { echo "no /dev/disk/by-pdio/debdisk -> $d"; ok=0; }
    # The supervisor and the server are the package's program.
    sup=$(sed -n 's/^supervisor_pid=//p' "$PDIO_RUN/${d#/dev/}.rec")
    srv=$(sed -n 's/^server_pid=//p' "$PDIO_RUN/${d#/dev/}.rec")
    for p in "$sup" "$srv"; do
        exe=$(readlink "/proc/$p/exe")
        [ "$exe" = "$DEB_PDIO" ] || { echo "pid $p runs $exe, not $DEB_PDIO"; ok=0; }
    done
    mkfs.ext4 -F -q "$d"
    mount -t ext4 "$d" "$MNT"
    echo from-the-package > "$MNT/f"
    umount "$MNT"
    udevadm settle --timeout=60
    $DEB_PDIO detach "$d"
    udevadm settle --timeout=60
    nm_links_gone || ok=0
    nm_udev_stop
    srv_no_state
    [ "$ok" = 1 ]
    detail "$DEB_PDIO attach: $d (by-pdio/debdisk), supervisor and server $DEB_PDIO, ext4 mkfs/mount/write/umount, detach"
}

# mount -t pdio runs the package's /sbin/mount.pdio; nbdkit loads the
# package's plugin from its own plugin directory.
deb_mount_nbdkit() {
    unset PDIO_PLUGIN
    $MOUNT -t pdio "$DEB_IMG" "$MNT"
    grep -qx from-the-package "$MNT/f"
    $UMOUNT "$MNT"
    srv_all_gone "$DEB_IMG"
    d=$($DEB_PDIO attach --nbdkit "$DEB_IMG")
    srv=$(sed -n 's/^server_pid=//p' "$PDIO_RUN/${d#/dev/}.rec")
    plugin=$(grep -o '[^ ]*nbdkit-pdio-plugin.so' "/proc/$srv/maps" | head -n 1)
    grep -qxF "$plugin" "$STATE/deb.files" || { echo "nbdkit maps '$plugin', not the package's"; $DEB_PDIO detach "$d"; return 1; }
    mount -t ext4 "$d" "$MNT"
    grep -qx from-the-package "$MNT/f"
    umount "$MNT"
    $DEB_PDIO detach "$d"
    srv_no_state
    detail "mount -t pdio (mount.pdio from the package) and umount; attach --nbdkit with $plugin"
}

deb_remove() {
    ok=1
    [ -s "$STATE/deb.files" ] ||
        { echo "dpkg -L listed nothing: no packages installed"; ok=0; : > "$STATE/deb.files"; }
    $DPKG -r pdio nbdkit-plugin-pdio || ok=0
    if $DPKG -l pdio nbdkit-plugin-pdio 2>/dev/null | grep -q '^ii'; then
        echo "still installed"; ok=0
    fi
    while read -r f; do
        # A directory that stays is another package's too (guest-root):
        # the snapshot below says whether one that was not stayed.
        [ -d "$f" ] && continue
        if [ -e "$f" ] || [ -L "$f" ]; then echo "left behind: $f"; ok=0; fi
    done < "$STATE/deb.files"
    deb_snapshot > "$STATE/deb.after"
    if ! cmp -s "$STATE/deb.before" "$STATE/deb.after"; then
        echo "the machine differs from before dpkg -i:"
        diff "$STATE/deb.before" "$STATE/deb.after" || true
        ok=0
    fi
    left=$(ls "$PDIO_RUN" 2>/dev/null | grep -vx lock || true)
    [ -z "$left" ] || { echo "left in $PDIO_RUN: $left"; ok=0; }
    srv_no_server || ok=0
    # The build tree's files back, for the scenarios after this one.
    for f in $DEB_OURS; do
        s=$DEB_STASH/$(echo "$f" | tr / _)
        [ ! -e "$s" ] && [ ! -L "$s" ] || mv "$s" "$f"
    done
    [ "$ok" = 1 ]
    detail "dpkg -r: none of the $(wc -l < "$STATE/deb.files") paths dpkg -L listed left but shared directories, the $(wc -l < "$STATE/deb.after") paths of the root as before dpkg -i, no pdio process"
}

scenario_deb() {
    step "deb: dpkg -i installs the pdio and nbdkit-plugin-pdio packages built from this tree" deb_install
    step "deb: the package's /usr/bin/pdio attaches, mkfs, mounts and detaches; its udev rule names the device" deb_attach
    step "deb: mount -t pdio runs the package's mount.pdio; attach --nbdkit loads the package's plugin" deb_mount_nbdkit
    step "deb: dpkg -r leaves nothing: no file dpkg -L listed, nothing new, no process" deb_remove
}
