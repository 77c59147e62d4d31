# SPDX-License-Identifier: BSD-3-Clause
# Helpers for the storage-fault tests (tests/engine/*.tap), on top of tests/lib/common.sh (source
# that first).  Everything here cleans up after itself through at_exit.
#
#   faults_bin                   the directory of faultfs and faultreq
#   start_faultfs BACKING MNT [OPTS...]
#                                mount faultfs (BACKING as MNT/image, rules
#                                in MNT/control); sets $faultfs_pid,
#                                $control; unmounted at exit
#   stop_faultfs MNT             unmount it now and wait for the daemon
#   fired_total                  how many faults fired since the last
#                                "clear" (from $control)
#   expect_fired N               exactly N faults fired, each rule at least
#                                once; fails showing the control file
#   error_lines                  "error:" lines in $server_log so far
#   expect_new_errors BEFORE N   exactly N more error lines than BEFORE
#   make_loop_fs FILE SIZE MNT   a fresh ext4 of SIZE on a loop device over
#                                FILE, mounted on MNT; sets $loopdev; all
#                                undone at exit

faults_bin=$TESTS_BUILDDIR/engine
# A hung server or a leaked lock should fail a case quickly, not after the
# default three minutes.
client_timeout=${PDIO_TEST_CLIENT_TIMEOUT:-60}

start_faultfs ()
{
    _backing=$1 _mnt=$2; shift 2
    mkdir -p "$_mnt"
    _flog=$tmp/faultfs.$(basename "$_mnt").log
    echo "faultfs: $_backing on $_mnt $*"
    "$faults_bin/faultfs" "$_backing" "$_mnt" -f -o fsname=pdio-faultfs "$@" \
        > "$_flog" 2>&1 &
    faultfs_pid=$!
    # Lazy unmount: a server that still has the image open must not keep
    # the mount (and the test) alive.
    at_exit "umount -l '$_mnt' 2>/dev/null; kill $faultfs_pid 2>/dev/null; wait $faultfs_pid 2>/dev/null"
    wait_until 10 _faultfs_up "$_mnt" ||
        { cat "$_flog" >&2; hard_error "faultfs did not mount $_mnt in 10 s"; }
    control=$_mnt/control
}

# _faultfs_up MNT: faultfs serves MNT; a hard error if it has exited.
_faultfs_up ()
{
    [ -e "$1/control" ] && return 0
    kill -0 "$faultfs_pid" 2>/dev/null && return 1
    cat "$_flog" >&2
    hard_error "faultfs exited before mounting $1"
}

stop_faultfs ()
{
    umount "$1" || umount -l "$1"
    wait "$faultfs_pid" 2>/dev/null || :
}

fired_total ()
{
    grep -c '^fired ' "$control" || :
}

expect_fired ()
{
    _status=$(cat "$control")
    _n=$(printf '%s\n' "$_status" | grep -c '^fired ' || :)
    if [ "$_n" -ne "$1" ] || printf '%s\n' "$_status" | grep -q '^rule .* fired=0$'; then
        printf '%s\n' "$_status" >&2
        fail "expected exactly $1 injected faults to fire, each rule at least once; $_n fired"
    fi
    echo "faults fired as planned ($1):"
    printf '%s\n' "$_status" | grep -E '^(rule|fired) ' | sed 's/^/  /'
}

error_lines ()
{
    grep -c ': error: ' "$server_log" || :
}

expect_new_errors ()
{
    _now=$(error_lines)
    if [ $((_now - $1)) -ne "$2" ]; then
        grep ': error: ' "$server_log" | tail -n 20 >&2
        fail "expected $2 new error lines in the server log, found $((_now - $1))"
    fi
    echo "server logged $2 error line(s), one per failed request"
}

make_loop_fs ()
{
    _file=$1 _size=$2 _mnt=$3
    truncate -s "$_size" "$_file"
    mkfs.ext4 -q -F -b 4096 -E nodiscard "$_file" ||
        hard_error "mkfs.ext4 $_file"
    loopdev=$(losetup --find --show "$_file") || hard_error "losetup $_file"
    at_exit "losetup -d '$loopdev' 2>/dev/null"
    mkdir -p "$_mnt"
    mount "$loopdev" "$_mnt" || hard_error "mount $loopdev $_mnt"
    at_exit "umount -l '$_mnt' 2>/dev/null"
    echo "ext4 of $_size on $loopdev ($_file), mounted on $_mnt"
}
