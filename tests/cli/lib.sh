# SPDX-License-Identifier: BSD-3-Clause
# Helpers for the pdio(1) tests (sourced after tests/lib/common.sh).
#
# pdio runs with its state in $tmp/run (PDIO_RUNDIR) and, where a test
# needs the nbd driver to look present on this machine (whose kernel has
# none), with a fake sysfs (PDIO_SYSFS), which only the test build reads
# (vm/pdio-broken, with no break point set).  pdio attaches over netlink,
# which cannot be faked: attaching for real runs in the VM guest
# (tests/vm, scenarios cli, recover, mount, partitions).

# common.sh's $PDIO: PDIO_TEST_PDIO tests another build (e.g. a
# deliberately broken one), which then runs with the fake sysfs too.
pdio=$PDIO
[ -x "$pdio" ] || hard_error "pdio(1) not built: $pdio"
pdio_fakes=${PDIO_TEST_PDIO:-$TESTS_BUILDDIR/vm/pdio-broken}
[ -x "$pdio_fakes" ] || hard_error "the test build of pdio(1) not built: $pdio_fakes"

# srv_setup: $tmp/run, a fake sysfs with nbd0..nbd3 free.
srv_setup ()
{
    export PDIO_RUNDIR=$tmp/run
    fakesys=$tmp/sys
    mkdir -p "$fakesys/module/nbd"
    for _n in 0 1 2 3; do
        mkdir -p "$fakesys/block/nbd$_n"
        echo 0 > "$fakesys/block/nbd$_n/size"
    done
    at_exit kill_leftovers
}

# At exit, even when a test failed half way (or a broken build of pdio
# left a server behind): stop every process whose command line names this
# test's directory (servers of its images, pdio serve), by pid.
kill_leftovers ()
{
    _pids=$(pgrep -f -- "$tmp/" || true)
    [ -n "$_pids" ] || return 0
    echo "stopping leftover processes: $_pids"
    # shellcheck disable=SC2086
    kill -TERM $_pids 2>/dev/null
    sleep 1
    # shellcheck disable=SC2086
    kill -KILL $_pids 2>/dev/null
}

# with_fakes CMD...: run CMD with the fake sysfs, the test build of pdio
# in place of $pdio in it.
with_fakes ()
{
    local _a _cmd=()
    for _a; do
        [ "$_a" = "$pdio" ] && _a=$pdio_fakes
        _cmd+=("$_a")
    done
    PDIO_SYSFS=$fakesys PDIO_TEST_BREAK= "${_cmd[@]}"
}

# expect_status N LOG CMD...: CMD exits with N; its stdout+stderr in LOG.
expect_status ()
{
    _want=$1 _log=$2; shift 2
    _st=0
    "$@" > "$_log" 2>&1 || _st=$?
    cat "$_log"
    [ "$_st" = "$_want" ] || fail "exit status $_st, expected $_want: $*"
}

# No pdio state left: nothing but the lock file in $PDIO_RUNDIR.
no_state ()
{
    _left=$(ls "$PDIO_RUNDIR" 2>/dev/null | grep -v '^lock$' || true)
    [ -z "$_left" ] || fail "left in $PDIO_RUNDIR: $_left"
}

# No nbdkit serving FILE.
no_server_of ()
{
    _left=$(pgrep -af "nbdkit.*file=$1|pdio serve .*$1" || true)
    [ -z "$_left" ] || fail "a server still serves $1: $_left"
}

# The image's lock is free: a writer can serve it.
lock_free ()
{
    "$NBDKIT" -U - "$PLUGIN" file="$1" --run true ||
        fail "$1 is still locked"
}

# PID is a live process (a zombie is not: an exited daemon waits for
# whoever adopted it to reap it).
alive ()
{
    [ -r "/proc/$1/stat" ] || return 1
    _state=$(sed 's/^[^)]*) \(.\).*/\1/' "/proc/$1/stat" 2>/dev/null) || return 1
    [ -n "$_state" ] && [ "$_state" != Z ]
}

dead () { ! alive "$1"; }

# What PR_SET_IO_FLUSHER left on PID's threads (field 9 of
# /proc/PID/task/TID/stat, PF_MEMALLOC_NOIO 0x80000 | PF_LOCAL_THROTTLE
# 0x100000): "all" if every thread has both, "none" if none has either,
# else "some".
io_flusher_of ()
{
    _all=1 _none=1
    for _t in /proc/"$1"/task/*/stat; do
        _f=$(sed 's/^.*) //' "$_t" 2>/dev/null | cut -d' ' -f7) || continue
        [ -n "$_f" ] || continue
        case $(( _f & 0x180000 )) in
        $((0x180000))) _none=0 ;;
        0) _all=0 ;;
        *) _all=0 _none=0 ;;
        esac
    done
    if [ $_all = 1 ]; then echo all
    elif [ $_none = 1 ]; then echo none
    else echo some
    fi
}

# Root in a container may lack CAP_SYS_RESOURCE, which PR_SET_IO_FLUSHER
# and a negative oom_score_adj need: pdio must then say so (once) and
# serve all the same.  True if this process has it.
has_sys_resource ()
{
    _eff=$(sed -n 's/^CapEff:[[:space:]]*//p' /proc/self/status)
    [ $(( (0x$_eff >> 24) & 1 )) = 1 ]
}
