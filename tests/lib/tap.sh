# SPDX-License-Identifier: BSD-3-Clause
# tests/lib/tap.sh: the suite's one TAP emitter, and the helpers that the
# tests on this machine and the VM guest share.  Plain POSIX sh: bash
# sources it through tests/lib/common.sh, busybox ash in the guest through
# tests/vm/guest-init.sh (tests/vm/run.sh copies tests/lib into the
# initramfs as /pdio/lib, and emits its own results with it too; the
# guest's own helpers are in guest.sh).  It only defines
# functions and the tap_* counters; it sets no shell option and no trap.
#
# Settings, read when used:
#   TAP_DIR     directory for the emitter's one file, .tap-detail (common.sh's
#               make_tmpdir sets it to $tmp; the guest to its state directory)
#   TAP_OUT     file to append the TAP lines to (the guest's serial port); the
#               lines are then also printed on standard output, the log.
#               Unset: TAP on standard output
#   TAP_DRY     1: tap_case and tap_diag only count (a dry pass for a plan
#               printed first)
#
# The emitter:
#   tap_case DESC CMD [ARGS...]
#               run CMD in a subshell with set -e, its output to standard
#               error (or, with TAP_OUT set, standard output), and print
#               "ok N - DESC[: DETAIL] (Ts)" or
#               "not ok N - DESC[: DETAIL] (exit S, Ts)".  Traps do not run
#               in the subshell: set up what needs cleaning outside it
#   detail TEXT inside a case: TEXT goes on its result line (the last wins)
#   tap_result STATUS DESC
#               a result found otherwise: "ok N - DESC" if STATUS is 0, else
#               "not ok N - DESC"
#   tap_diag TEXT    "# TEXT"
#   tap_plan [N]     "1..N", by default the number of results so far (a
#                    plan printed last)
#   tap_summary      "P passed, F failed" (the guest's last line)
#   tap_n, tap_pass, tap_fail: results so far, passed, failed
#
# Shared helpers (each prints what it checks; the ones that judge set a
# detail):
#   wait_until TIMEOUT_S CMD [ARGS...]
#               run CMD every 0.1 s until it succeeds; after TIMEOUT_S
#               seconds (and at least TIMEOUT_S * 10 tries, so that slow
#               polls on a loaded machine do not eat the time) say so on
#               standard error and return 1.  CMD runs in this shell: it
#               may fail the test itself (a server that died while waited
#               for)
#   fincore_pages FILE   pages of FILE in this machine's page cache
#   fincore_zero FILE    none of them (detail: how many)
#   write_files DIR COUNT SUMS
#               COUNT files of random data in DIR, of awkward sizes (1 byte
#               to 192 KiB, most not a multiple of 512, a few in
#               subdirectories), their sha256sums in SUMS, then sync; sets
#               files_kib to what they take (du -sk)
#   verify_files DIR COUNT SUMS
#               every one of the COUNT checksums in SUMS matches (output in
#               SUMS.check)
#   fio_pass MODE OUT LABEL FIO-ARGS... JOBFILE
#               fio's verify workload: MODE write (random writes, crc32c
#               verify with FIO_BACKLOG=256) or verify (--verify_only, a
#               read-only pass, FIO_BACKLOG=0); output in OUT; passes if fio
#               exits 0 and OUT has no error line (fio_errors)
#   fio_errors OUT       error lines in fio's output OUT
#   LOG_ERRORS           what counts as an error line in a server's log
#                        (extended regex, case-insensitive)
#   server_log_clean STATUS LOG
#               the server exited with STATUS 0 and LOG has no error line;
#               warning lines are counted for the record only
#   nbdkit_send_abort LOG VERSION
#               LOG shows the abort of nbdkit 1.32.4 to 1.33.9 (VERSION,
#               such as 1.32.5, is one of them) when a client hangs up with
#               replies queued (an assertion in raw_send_socket)

tap_n=0 tap_pass=0 tap_fail=0

_tap_emit ()
{
    if [ -n "${TAP_OUT:-}" ]; then
        printf '%s\n' "$*" >> "$TAP_OUT"
    fi
    printf '%s\n' "$*"
}

_tap_detail_file ()
{
    echo "${TAP_DIR:?set TAP_DIR (make_tmpdir does) before a case}/.tap-detail"
}

detail ()
{
    echo "$*" > "$(_tap_detail_file)"
}

tap_result ()
{
    tap_n=$((tap_n + 1))
    if [ "$1" = 0 ]; then
        tap_pass=$((tap_pass + 1))
        _tap_emit "ok $tap_n - $2"
    else
        tap_fail=$((tap_fail + 1))
        _tap_emit "not ok $tap_n - $2"
    fi
}

tap_case ()
{
    _tap_desc=$1; shift
    if [ "${TAP_DRY:-0}" = 1 ]; then
        tap_n=$((tap_n + 1))
        return 0
    fi
    _tap_file=$(_tap_detail_file)
    rm -f "$_tap_file"
    _tap_t0=$(date +%s)
    # set -e would not apply inside the subshell if it were a condition
    # ("if", "&&"), so run it as a plain command with -e off out here.
    _tap_e=; case $- in *e*) _tap_e=1 ;; esac
    set +e
    if [ -n "${TAP_OUT:-}" ]; then
        echo "# ---- $((tap_n + 1)): $_tap_desc"
        ( set -e; "$@" )
    else
        echo "# ---- $((tap_n + 1)): $_tap_desc" >&2
        ( set -e; "$@" ) >&2
    fi
    _tap_st=$?
    [ -z "$_tap_e" ] || set -e
    _tap_t=$(($(date +%s) - _tap_t0))
    _tap_detail=
    [ ! -s "$_tap_file" ] || _tap_detail=": $(cat "$_tap_file")"
    if [ "$_tap_st" = 0 ]; then
        tap_result 0 "$_tap_desc$_tap_detail (${_tap_t}s)"
    else
        tap_result 1 "$_tap_desc$_tap_detail (exit $_tap_st, ${_tap_t}s)"
    fi
}

tap_diag ()
{
    [ "${TAP_DRY:-0}" = 1 ] || _tap_emit "# $*"
}

tap_plan ()
{
    _tap_emit "1..${1:-$tap_n}"
}

tap_summary ()
{
    _tap_emit "$tap_pass passed, $tap_fail failed"
}

wait_until ()
{
    _wu_timeout=$1; shift
    _wu_end=$(($(date +%s) + _wu_timeout))
    _wu_tries=0
    until "$@"; do
        _wu_tries=$((_wu_tries + 1))
        if [ "$_wu_tries" -ge $((_wu_timeout * 10)) ] &&
           [ "$(date +%s)" -ge "$_wu_end" ]; then
            echo "wait_until: gave up after ${_wu_timeout} s waiting for: $*" >&2
            return 1
        fi
        sleep 0.1
    done
}

fincore_pages ()
{
    fincore -rno PAGES "$1"
}

fincore_zero ()
{
    _tap_pages=$(fincore_pages "$1")
    detail "fincore: $_tap_pages pages of $1 resident"
    [ "$_tap_pages" = 0 ]
}

write_files ()
{
    _wf_i=0
    mkdir -p "$1/d1/d2"
    while [ "$_wf_i" -lt "$2" ]; do
        case $((_wf_i % 10)) in
        0) _wf_f=$1/d1/f$_wf_i ;;
        1) _wf_f=$1/d1/d2/f$_wf_i ;;
        *) _wf_f=$1/f$_wf_i ;;
        esac
        head -c $(((_wf_i * 7919) % 196608 + 1)) /dev/urandom > "$_wf_f"
        _wf_i=$((_wf_i + 1))
    done
    (cd "$1" && find . -type f | sort | xargs sha256sum) > "$3"
    sync
    files_kib=$(du -sk "$1" | cut -f1)
    detail "$2 files, $files_kib KiB"
}

verify_files ()
{
    (cd "$1" && sha256sum -c "$3") > "$3.check"
    _vf_ok=$(grep -c ': OK$' "$3.check")
    detail "$_vf_ok of $2 checksums match"
    [ "$_vf_ok" = "$2" ]
}

# The warning fio prints for every verify job with numjobs > 1 on one file
# is moot: offset_increment gives each job its own region.
fio_errors ()
{
    grep -v 'fio: multiple writers may overwrite blocks' "$1" |
        grep -ci 'err= *[1-9]\|bad magic\|verify failed\|fio: ' || :
}

fio_pass ()
{
    _fp_mode=$1 _fp_out=$2 _fp_label=$3; shift 3
    if [ "$_fp_mode" = write ]; then
        FIO_BACKLOG=256 fio --output="$_fp_out" "$@" && _fp_rc=0 || _fp_rc=$?
    else
        # verify_only regenerates the write pass's offsets from the same
        # seed and reads everything back without writing.
        FIO_BACKLOG=0 fio --verify_only --output="$_fp_out" "$@" &&
            _fp_rc=0 || _fp_rc=$?
    fi
    cat "$_fp_out"
    _fp_errs=$(fio_errors "$_fp_out")
    _fp_rw=$(grep -E '^ +(READ|WRITE):' "$_fp_out" |
        sed 's/^ *//; s/ (.*io=/ io=/; s/, run=.*//' | tr '\n' ' ')
    detail "$_fp_label: $_fp_rw"
    [ "$_fp_rc" = 0 ] && [ "$_fp_errs" = 0 ]
}

LOG_ERRORS='error|assert|abort|segmentation|corrupt'

server_log_clean ()
{
    _sl_errors=$(grep -ciE "$LOG_ERRORS" "$2" || :)
    _sl_warnings=$(grep -ci 'warning' "$2" || :)
    detail "exit status $1, $_sl_errors error and $_sl_warnings warning lines in its log"
    [ "$1" = 0 ] && [ "$_sl_errors" = 0 ]
}

nbdkit_send_abort ()
{
    grep -qF "raw_send_socket: Assertion \`sock >= 0' failed" "$1" || return 1
    case $2 in
    1.32.[4-9]*|1.33.[0-9]) return 0 ;;
    esac
    return 1
}
