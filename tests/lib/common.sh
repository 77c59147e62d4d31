# SPDX-License-Identifier: BSD-3-Clause
# Shared helpers for pdio's shell tests on this machine.  Source it (bash)
# from a test:
#
#     . "$TESTS_SRCDIR/lib/common.sh"
#
# It sources tests/lib/tap.sh, the TAP emitter (tap_case, detail,
# tap_plan) and the helpers shared with the VM guest (wait_until,
# fincore_pages, fincore_zero, write_files, verify_files, fio_pass,
# server_log_clean, nbdkit_send_abort): see there.
#
# Environment (exported by `make check`, see tests/Makefile.am):
#   PDIO_PLUGIN       the plugin under test (plugin/.libs/pdio.so)
#   NBDKIT            the nbdkit binary
#   TESTS_SRCDIR      tests/ in the source tree; TESTS_BUILDDIR in the build
# Optional:
#   PDIO_TEST_PLUGIN  serve with this plugin instead (e.g. "file", to try a
#                     harness against nbdkit's own file plugin); tests of
#                     pdio-only behaviour will then fail, as they should
#   PDIO_TEST_SERVER  native (default): servers are pdio's own (pdio
#                     serve), given the plugin's parameters (file=,
#                     readonly=, backend=, align=) as its options; nbdkit:
#                     nbdkit with the plugin.  A test runs against either
#                     ($SERVER); make check runs the served suites with
#                     both (tests/Makefile.am, the nbdkit variant)
#   PDIO_TEST_TMPDIR  parent of the per-test temporary directory (default
#                     /var/tmp; refused if it is on tmpfs: the tests need a
#                     real file system with O_DIRECT, holes and a page cache)
#   PDIO_TEST_PDIO    test this pdio(1) (default: the build tree's)
#   PDIO_TEST_CLIENT_TIMEOUT  run_client's limit in seconds (default 180)
#
# Exit codes follow automake: 0 pass, 1 fail, 99 hard error (the test could
# not run).  Nothing here ever skips: a skipped test is a failed suite.
# A test that must run against one server names it: source this file
# with --server=nbdkit (or native).
# Sourcing it sets -eu and traps EXIT, INT and TERM: register clean-up
# with at_exit rather than with trap, or it will be lost.
#
# Helpers (all print what they do on stdout, which goes to the test's log):
#   fail MSG / hard_error MSG    report and exit 1 / 99
#   require_cmd CMD...           hard error if a command is missing
#   built FILE                   FILE, printed, or a hard error if make
#                                check has not built it
#   at_exit 'SHELL CODE'         run at exit (any exit), newest first
#   make_tmpdir                  $tmp = a fresh directory, removed at exit
#                                (also TAP_DIR, for tap_case)
#   make_image FILE SIZE SEED    pseudo-random, fully allocated, not cached
#   file_sum FILE                sha256 of FILE
#   file_size FILE               size in bytes
#   start_server LOG ARGS...     pdio serve --socket $sock with ARGS (the
#                                plugin and its parameters) translated, or
#                                with SERVER=nbdkit nbdkit -f -v -U $sock
#                                ARGS (in the background, output to LOG);
#                                waits until it serves; sets $server_pid
#                                $server_log $sock $uri.  Stopped at exit
#                                if still running.
#   stop_server                  SIGTERM, wait; fails unless it exits 0
#   stop_server_status           the same, but only sets $server_status
#   nbdkit_version               $NBDKIT's version, such as 1.32.5
#   expect_start_failure LOG ARGS...  the server must refuse to start
#   log_has LOG STRING...        LOG contains each STRING (fixed strings);
#                                fails showing the log otherwise
#   run_client CMD...            CMD with a timeout (a hung server fails the
#                                test instead of hanging make check)
#   umount_retry DIR             umount, retrying while busy (for at_exit)
#   drop_cache FILE              evict FILE's pages from the page cache
#   stats_line LOG               the last "stats:" line pdio logged
#   stat_value LOG KEY           KEY=N from that line, N printed
#   info_field JSON KEY          a number or boolean from nbdinfo --json
#   show_stats LOG               print the stats line with a label
#   all_paths_taken LOG          the stats line counts direct, bounced,
#                                read-modify-write and tail writes
#   sigterm_in_flight IMAGE      server/rawclient.py's writes in flight to
#                                the server started last (serving IMAGE),
#                                then SIGTERM; waits for it: exit status in
#                                $server_status, acknowledged writes listed
#                                in $tmp/acked
#   pick_seed                    $seed = $PDIO_TEST_SEED or a fresh one
#                                (printed: rerun with PDIO_TEST_SEED=N)
#   shadow_run LABEL IMAGE [PARAMS...]
#                                serve IMAGE with $PLUGIN PARAMS, run
#                                shadow_io $shadow_args on it, stop the
#                                server, check the image file equals the
#                                shadow and kept its size; the server log is
#                                $tmp/LABEL.log
#   interleave_run LABEL IMAGE [PARAMS...]
#                                the same with interleave_io $interleave_args
#   shadow_odd LABEL N [PARAMS...]
#                                shadow_run on $img, a fresh image of 10 MiB
#                                + 1234 bytes (no multiple of any block
#                                size), N requests over 4 connections x 8
#                                in flight
#   sanitized_rounds LABEL N HOSTILE CHECK
#                                for a sanitizer build of pdio serve
#                                ($PDIO_TEST_PDIO): shadow_run of N requests
#                                on $img (8 MiB + 1234 bytes), then a server
#                                queried by nbdinfo --map and HOSTILE
#                                raw-socket connections; CHECK LOG after
#                                each.  That server is left running.
#   tap_case DESC FUNCTION [ARGS...]
#                                for *.tap tests (tap.sh): FUNCTION in a
#                                subshell with set -e, its output to stderr
#                                (the log), then "ok N - DESC" or "not ok N
#                                - DESC".  Servers it starts die with it
#                                (--exit-with-parent).
#   server_exited_clean          after stop_server_status: server_log_clean
#                                (tap.sh) of the last server
#   tap_done                     print the plan ("1..N", tap_plan); call
#                                last
#   valgrind_logs_empty and valgrind_wrap: tests/lib/valgrind.sh
#
# Variables: $PLUGIN (plugin under test), $PDIO (pdio(1) under test),
# $SERVER (native or nbdkit), $tools (the directory of the built C
# clients: shadow_io, interleave_io, nbdreq, mkimage, strict_clients),
# $nbdkit_flags (-f -v and the quieting -D flag every server gets).

# The helpers are bash; make check may run the scripts with another sh.
if [ -z "${BASH_VERSION:-}" ]; then
    exec bash "$0" "$@"
fi

set -eu
. "${TESTS_SRCDIR:?run from make check, or export TESTS_SRCDIR}/lib/tap.sh"

: "${NBDKIT:=nbdkit}"
: "${TESTS_BUILDDIR:?run from make check, or export TESTS_BUILDDIR}"
: "${TESTS_SRCDIR:?run from make check, or export TESTS_SRCDIR}"

PLUGIN=${PDIO_TEST_PLUGIN:-${PDIO_PLUGIN:?run from make check, or export PDIO_PLUGIN}}
SERVER=${PDIO_TEST_SERVER:-native}
# A test of nbdkit or of the plugin sources this file with --server=nbdkit:
# that is its server whatever the suite's.
case ${1:-} in --server=*) SERVER=${1#--server=}; export PDIO_TEST_SERVER=$SERVER ;; esac
case $SERVER in native|nbdkit) ;; *) echo "PDIO_TEST_SERVER=$SERVER: native or nbdkit" >&2; exit 99 ;; esac
# PDIO_TEST_PDIO: another build of pdio(1) (server/asan.sh's ASan build).
PDIO=${PDIO_TEST_PDIO:-${PDIO_BUILDDIR:-$TESTS_BUILDDIR/..}/src/cli/pdio}
tools=$TESTS_BUILDDIR/lib
# One debug line per request would bury the stats lines: keep the rest.
nbdkit_flags="-f -v -D nbdkit.backend.datapath=0"
client_timeout=${PDIO_TEST_CLIENT_TIMEOUT:-180}

fail ()
{
    echo "FAIL: $*" >&2
    exit 1
}

hard_error ()
{
    echo "ERROR: $*" >&2
    exit 99
}

require_cmd ()
{
    for _c in "$@"; do
        command -v "$_c" >/dev/null 2>&1 ||
            hard_error "required command not found: $_c"
    done
}

built ()
{
    [ -e "$1" ] || hard_error "$1 is not built (make check builds it)"
    echo "$1"
}

# Exit actions, run newest first.  Each is eval'd with errors ignored so
# that one failed cleanup step does not stop the others.
_at_exit_actions=""
at_exit ()
{
    _at_exit_actions="$1
$_at_exit_actions"
}

_run_at_exit ()
{
    _status=$?
    set +e
    while IFS= read -r _action; do
        [ -n "$_action" ] && eval "$_action"
    done <<EOF
$_at_exit_actions
EOF
    exit $_status
}
trap _run_at_exit EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

make_tmpdir ()
{
    _parent=${PDIO_TEST_TMPDIR:-/var/tmp}
    [ "$(stat -f -c %T "$_parent")" != tmpfs ] ||
        hard_error "$_parent is on tmpfs; set PDIO_TEST_TMPDIR to a directory on a disk file system"
    tmp=$(mktemp -d "$_parent/pdio-test.XXXXXX")
    TAP_DIR=$tmp
    at_exit "rm -rf '$tmp'"
    echo "temporary directory: $tmp"
}

make_image ()
{
    "$tools/mkimage" "$1" "$2" "$3" || hard_error "mkimage $*"
}

file_sum ()
{
    sha256sum < "$1" | cut -d' ' -f1
}

file_size ()
{
    stat -c %s "$1"
}

# The plugin's parameters (ARGS after the plugin) as pdio serve options,
# in $_native_args (an array).
_native_argv ()
{
    _native_args=()
    _image=
    shift                       # the plugin
    for _a in "$@"; do
        case $_a in
        file=*) _image=${_a#file=} ;;
        readonly=true|readonly=1) _native_args+=(--read-only) ;;
        readonly=false|readonly=0) ;;
        backend=*) _native_args+=(--backend "${_a#backend=}") ;;
        align=*) _native_args+=(--align "${_a#align=}") ;;
        *) hard_error "pdio serve has no equivalent of '$_a'" ;;
        esac
    done
    [ -n "$_image" ] || hard_error "no file= in: $*"
    _native_args+=("$_image")
}

# The native server announces itself ("uri: ...") once it listens.
_start_native ()
{
    _native_argv "$@"
    # nbdkit's -D pdio.canary=1 is the environment's PDIO_BOUNCE_CANARY=1,
    # which only the test build reads (vm/pdio-broken: pdio with its break
    # points and test settings), unless PDIO_TEST_PDIO names another.
    _canary=0 _pdio=$PDIO
    case " $nbdkit_flags " in *" -D pdio.canary=1 "*) _canary=1 ;; esac
    if [ $_canary = 1 ] && [ -z "${PDIO_TEST_PDIO:-}" ]; then
        _pdio=$TESTS_BUILDDIR/vm/pdio-broken
    fi
    echo "starting: PDIO_BOUNCE_CANARY=$_canary $_pdio serve --exit-with-parent --socket $sock ${_native_args[*]}"
    PDIO_SERVER_DEBUG=1 PDIO_BOUNCE_CANARY=$_canary PDIO_TEST_BREAK= \
        "$_pdio" serve --exit-with-parent --socket "$sock" \
        "${_native_args[@]}" > "$server_log" 2>&1 &
    server_pid=$!
    echo $server_pid > "$server_pidfile"
    at_exit "kill $server_pid 2>/dev/null"
    uri="nbd+unix:///?socket=$sock"
    wait_until 20 _serving "pdio serve" grep -q '^uri: ' "$server_log" ||
        { cat "$server_log" >&2; fail "pdio serve did not start in 20 s"; }
}

# _serving NAME CMD...: CMD says the server started last is serving; fails
# the test if the server has exited.  For wait_until.
_serving ()
{
    _name=$1; shift
    "$@" && return 0
    kill -0 "$server_pid" 2>/dev/null && return 1
    cat "$server_log" >&2
    fail "$_name exited before serving: $_server_args"
}

# start_server LOG ARGS...: ARGS are what follows the socket on nbdkit's
# command line (plugin and parameters).
start_server ()
{
    server_log=$1; shift
    sock=$tmp/nbd.sock.$$.${_server_no:=0}
    _server_no=$((_server_no + 1))
    server_pidfile=$tmp/nbdkit.pid.$_server_no
    rm -f "$sock" "$server_pidfile"
    _server_args="$*"
    if [ "$SERVER" = native ]; then
        _start_native "$@"
        return
    fi
    # -D pdio.canary=1 is read only by the plugin's test build
    # (plugin/pdio_test.la), loaded in place of $PLUGIN for it unless
    # PDIO_TEST_PLUGIN names another.
    local _a _nbdkit_args=()
    for _a; do
        case " $nbdkit_flags " in *" -D pdio.canary=1 "*)
            if [ "$_a" = "$PLUGIN" ] && [ -z "${PDIO_TEST_PLUGIN:-}" ]; then
                _a=$TESTS_BUILDDIR/plugin/.libs/pdio_test.so
            fi ;;
        esac
        _nbdkit_args+=("$_a")
    done
    echo "starting: $NBDKIT $nbdkit_flags --exit-with-parent -U $sock -P $server_pidfile ${_nbdkit_args[*]}"
    # shellcheck disable=SC2086
    "$NBDKIT" $nbdkit_flags --exit-with-parent -U "$sock" -P "$server_pidfile" \
        "${_nbdkit_args[@]}" > "$server_log" 2>&1 &
    server_pid=$!
    at_exit "kill $server_pid 2>/dev/null"
    uri="nbd+unix:///?socket=$sock"
    # nbdkit writes the pid file once the socket is listening.
    wait_until 20 _serving nbdkit test -s "$server_pidfile" ||
        { cat "$server_log" >&2; fail "nbdkit did not start in 20 s"; }
}

# Stops the server started last and checks that it shut down cleanly.
# stop_server_status only sets $server_status (for use where failing at
# once is not wanted).  The pid file names nbdkit itself even when it runs
# under a wrapper such as strace.
stop_server_status ()
{
    kill -TERM "$(cat "$server_pidfile")" 2>/dev/null || :
    server_status=0
    wait "$server_pid" || server_status=$?
    if [ $server_status -ne 0 ]; then
        cat "$server_log" >&2
        # Our clients only hang up with replies queued after failing.
        if nbdkit_send_abort "$server_log" "$(nbdkit_version)"; then
            echo "NOTE: this is the known crash of nbdkit $(nbdkit_version) when a client hangs up with replies queued, not pdio's doing" >&2
        fi
        echo "nbdkit exited with status $server_status" >&2
    fi
}

# The version of $NBDKIT, such as 1.32.5.
nbdkit_version ()
{
    "$NBDKIT" --version | sed -n 's/^nbdkit //p'
}

stop_server ()
{
    stop_server_status
    [ $server_status -eq 0 ] || fail "nbdkit exited with status $server_status"
}

# expect_start_failure LOG ARGS...: nbdkit with ARGS must exit non-zero
# without serving.  --run true would succeed if it did serve.
expect_start_failure ()
{
    _log=$1; shift
    _status=0
    if [ "$SERVER" = native ]; then
        _native_argv "$@"
        timeout 30 "$PDIO" serve --socket "$tmp/refused.sock" \
            "${_native_args[@]}" > "$_log" 2>&1 || _status=$?
        [ $_status -ne 0 ] || fail "pdio serve started although it should have refused: $*"
        [ $_status -ne 124 ] || fail "pdio serve hung instead of refusing: $*"
        return
    fi
    # shellcheck disable=SC2086
    timeout 30 "$NBDKIT" $nbdkit_flags -U - "$@" --run true > "$_log" 2>&1 ||
        _status=$?
    if [ $_status -eq 0 ]; then
        cat "$_log" >&2
        fail "nbdkit started although it should have refused: $*"
    fi
    [ $_status -ne 124 ] || fail "nbdkit hung instead of refusing: $*"
}

log_has ()
{
    _log=$1; shift
    for _s in "$@"; do
        if ! grep -qF -- "$_s" "$_log"; then
            echo "--- $_log:" >&2
            grep -v ': debug: ' "$_log" >&2 || :
            fail "'$_s' not found in $_log"
        fi
    done
    echo "$_log has: $*"
}

run_client ()
{
    _status=0
    timeout "$client_timeout" "$@" || _status=$?
    [ $_status -ne 124 ] || fail "timed out after ${client_timeout}s: $*"
    return $_status
}

# A file system that held a served image can stay busy for some tens of
# milliseconds after nbdkit exits (io_uring rings are torn down
# asynchronously and their registered files with them), so retry for up
# to 10 s, then detach it lazily rather than leave it mounted.
umount_retry ()
{
    if ! wait_until 10 umount "$1" 2>/dev/null; then
        echo "WARNING: $1 still busy after 10 s: lazy unmount" >&2
        umount -l "$1"
    fi
}

# Writes back nothing (count=0), syncs, then fadvise(DONTNEED) on the whole
# file: the pages are clean after fdatasync, so all of them go.
drop_cache ()
{
    dd if=/dev/null of="$1" oflag=nocache conv=notrunc,fdatasync count=0 \
        status=none
}

stats_line ()
{
    grep 'stats:' "$1" | tail -n 1
}

stat_value ()
{
    _line=$(stats_line "$1")
    [ -n "$_line" ] || fail "no 'stats:' line in $1"
    _v=$(printf '%s\n' "$_line" | sed -n "s/.*[: ]$2=\\([0-9][0-9]*\\).*/\\1/p")
    [ -n "$_v" ] || fail "no $2= in the stats line: $_line"
    echo "$_v"
}

show_stats ()
{
    _line=$(stats_line "$1")
    [ -n "$_line" ] || fail "no 'stats:' line in $1"
    echo "engine stats: ${_line#*stats:}"
}

all_paths_taken ()
{
    for _key in direct bounced rmw_blocks tail_writes; do
        _v=$(stat_value "$1" $_key)
        [ "$_v" -gt 0 ] || fail "$_key=$_v after an unaligned workload: that path was never taken"
    done
}

sigterm_in_flight ()
{
    run_client python3 "$TESTS_SRCDIR/server/rawclient.py" sigterm "$sock" \
        "$server_pid" "$1" "$tmp/acked"
    server_status=0
    wait "$server_pid" || server_status=$?
}

# info_field JSON KEY: the value of "KEY": N (or true/false) in nbdinfo
# --json output for the first export.
info_field ()
{
    sed -n "s/^[[:space:]]*\"$2\": *\\([0-9a-z]*\\),\\{0,1\\}\$/\\1/p" "$1" |
        head -n 1
}

pick_seed ()
{
    seed=${PDIO_TEST_SEED:-$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')}
    echo "seed: $seed (rerun with PDIO_TEST_SEED=$seed)"
}

# _client_run LABEL CLIENT CLIENT-ARGS IMAGE PARAMS...: see shadow_run.
_client_run ()
{
    _label=$1 _client=$2 _cargs=$3 _image=$4
    shift 4
    _size_before=$(file_size "$_image")
    echo "== $_label: $_client over $PLUGIN file=$_image $*"
    start_server "$tmp/$_label.log" "$PLUGIN" file="$_image" "$@"
    _status=0
    # shellcheck disable=SC2086
    run_client "$tools/$_client" -s "$seed" -i "$_image" \
        -o "$tmp/$_label.shadow" $_cargs "$sock" || _status=$?
    if [ $_status -ne 0 ]; then
        stop_server_status
        echo "--- server log ($tmp/$_label.log), last 30 lines:"
        tail -n 30 "$tmp/$_label.log"
        fail "$_label: $_client exited with status $_status (seed $seed)"
    fi
    stop_server
    show_stats "$tmp/$_label.log"
    [ "$(file_size "$_image")" = "$_size_before" ] ||
        fail "$_label: the image changed size: $_size_before -> $(file_size "$_image")"
    cmp "$tmp/$_label.shadow" "$_image" ||
        fail "$_label: after the server exited, the image file differs from the shadow (seed $seed)"
    echo "$_label: the image file equals the shadow, size $_size_before unchanged"
    rm -f "$tmp/$_label.shadow"
}

shadow_run ()
{
    _l=$1 _i=$2; shift 2
    _client_run "$_l" shadow_io "-r ${shadow_args:-}" "$_i" "$@"
}

interleave_run ()
{
    _l=$1 _i=$2; shift 2
    _client_run "$_l" interleave_io "${interleave_args:-}" "$_i" "$@"
}

shadow_odd ()
{
    _l=$1 _n=$2; shift 2
    img=$tmp/odd.img
    make_image "$img" $((10 * 1024 * 1024 + 1234)) "$seed"
    shadow_args="-n $_n -c 4 -q 8"
    shadow_run "$_l" "$img" "$@"
}

sanitized_rounds ()
{
    _l=$1 _n=$2 _hostile=$3 _check=$4
    [ -x "$PDIO_TEST_PDIO" ] || hard_error "$PDIO_TEST_PDIO is not built"
    img=$tmp/img
    make_image "$img" $((8 * 1024 * 1024 + 1234)) "$seed"
    shadow_args="-n $_n -c 4 -q 8"
    shadow_run "$_l" "$img"
    "$_check" "$tmp/$_l.log"
    start_server "$tmp/${_l}2.log" "$PLUGIN" file="$img"
    nbdinfo --map "$uri" > /dev/null
    run_client python3 "$TESTS_SRCDIR/server/rawclient.py" hostile "$sock" \
        "$_hostile" "$seed" > /dev/null ||
        fail "a hostile connection got a wrong reply"
    "$_check" "$server_log"
}

# After stop_server_status (not inside a tap_case: a subshell cannot wait
# for the server).
server_exited_clean ()
{
    server_log_clean "$server_status" "$server_log"
}

tap_done ()
{
    tap_plan
}
