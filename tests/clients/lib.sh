# tests/clients/lib.sh — shared by the host-side client scenarios (sourced).
#
# TAP in the same shape as the VM guest: call plan_steps with the number of
# steps, then "step DESC FUNCTION ARGS..." for each; every step body runs in
# a subshell with set -e (any failing command fails the step) and may call
# detail to add a figure to its result line.  State that outlives a step
# goes in $STATE.  finish prints the summary and gives the exit status.

: "${NBDKIT:=nbdkit}"
TESTS_SRCDIR=${TESTS_SRCDIR:-$(cd "$(dirname "$0")/.." && pwd)}
PDIO_PLUGIN=${PDIO_PLUGIN:-$TESTS_SRCDIR/../plugin/.libs/pdio.so}

n=0 pass=0 fail=0

plan_steps() { echo "1..$1"; }

step() {
    desc=$1; shift
    n=$((n + 1))
    echo "# === step $n: $desc" >&2
    rm -f "$STATE/detail"
    t0=$(date +%s)
    # set +e around the subshell: in a conditional context its set -e would
    # be ignored, and with the caller's set -e a failure would end the test.
    set +e
    ( set -e; "$@" ) >&2
    rc=$?
    set -e
    t=$(($(date +%s) - t0))
    detail=""
    [ -s "$STATE/detail" ] && detail=": $(cat "$STATE/detail")"
    if [ "$rc" = 0 ]; then
        pass=$((pass + 1))
        echo "ok $n - $desc$detail (${t}s)"
    else
        fail=$((fail + 1))
        echo "not ok $n - $desc$detail (exit $rc, ${t}s)"
    fi
}

detail() { echo "$*" > "$STATE/detail"; }

finish() {
    echo "# $pass passed, $fail failed"
    [ "$fail" = 0 ]
}

# A work directory on a real filesystem (O_DIRECT does not work on tmpfs),
# removed on success, kept for diagnosis on failure.
make_workdir() {
    base=${TESTS_BUILDDIR:-${TMPDIR:-/var/tmp}}
    WORK=$(mktemp -d "$base/$1.XXXXXX")
    STATE=$WORK/state
    mkdir -p "$STATE"
}

# serve TAG IMAGE SIZE [PLUGIN-ARGS...]: a fresh sparse image, nbdkit with
# pdio.so in the foreground under a wrapper that records its exit status, on
# $WORK/nbd.sock, logging to $WORK/nbdkit-TAG.log.
serve() {
    tag=$1 img=$2 size=$3; shift 3
    rm -f "$img" "$WORK/nbd.sock" "$STATE/nbdkit.rc" "$STATE/nbdkit.pid"
    truncate -s "$size" "$img"
    echo "$img" > "$STATE/img"
    log=$WORK/nbdkit-$tag.log
    echo "$log" > "$STATE/log"
    echo "$NBDKIT -f -U $WORK/nbd.sock $PDIO_PLUGIN file=$img $*"
    sh -c 'nbdkit=$1 sock=$2 pidfile=$3 rcfile=$4; shift 4
           "$nbdkit" -f -U "$sock" -P "$pidfile" "$@"; echo $? > "$rcfile"' \
        nbdkit-wrapper "$NBDKIT" "$WORK/nbd.sock" "$STATE/nbdkit.pid" "$STATE/nbdkit.rc" \
        "$PDIO_PLUGIN" "file=$img" "$@" 2> "$log" &
    i=0
    while [ ! -S "$WORK/nbd.sock" ] || [ ! -s "$STATE/nbdkit.pid" ]; do
        [ -f "$STATE/nbdkit.rc" ] && { cat "$log"; return 1; }
        i=$((i + 1)); [ $i -lt 100 ] || return 1
        sleep 0.1
    done
    nbdinfo --no-content --json "nbd+unix:///?socket=$WORK/nbd.sock" > "$STATE/info.json"
    min=$(sed -n 's/.*"block_size_minimum": *\([0-9]*\).*/\1/p' "$STATE/info.json")
    mc=$(sed -n 's/.*"can_multi_conn": *\([a-z]*\).*/\1/p' "$STATE/info.json")
    detail "block size minimum $min, multi-conn $mc"
    [ -n "$min" ] && [ "$mc" = true ]
}

# SIGTERM, then the server must exit 0 with nothing alarming in its log.
stop_server() {
    [ -s "$STATE/nbdkit.pid" ] || return 1
    kill -TERM "$(cat "$STATE/nbdkit.pid")" 2>/dev/null || true
    i=0
    while [ ! -f "$STATE/nbdkit.rc" ]; do
        i=$((i + 1)); [ $i -lt 300 ] || { echo "nbdkit did not exit"; return 1; }
        sleep 0.1
    done
    rc=$(cat "$STATE/nbdkit.rc")
    log=$(cat "$STATE/log")
    cat "$log"
    # Debian 12's nbdkit 1.32.5 can abort when a client hangs up with replies
    # queued (fixed upstream in 1.33.10): name it, still a failure.
    if grep -q "raw_send_socket: Assertion .sock >= 0. failed" "$log"; then
        detail "nbdkit $($NBDKIT --version | awk '{print $2}') aborted in raw_send_socket (known nbdkit 1.32.4-1.33.9 server bug)"
        return 1
    fi
    # Errors fail the step; warnings are counted for the record only.
    errors=$(grep -ci 'error\|assert\|abort\|segmentation\|corrupt' "$log" || true)
    warnings=$(grep -ci 'warning' "$log" || true)
    detail "exit status $rc, $errors error and $warnings warning lines in its log"
    [ "$rc" = 0 ] && [ "$errors" = 0 ]
}

# pdio keeps the image out of this machine's page cache.
fincore_zero() {
    img=$(cat "$STATE/img")
    pages=$(fincore -rno PAGES "$img")
    detail "fincore: $pages pages of the image resident"
    [ "$pages" = 0 ]
}

# Kill whatever is still running from this test (by recorded pid only).
kill_server() {
    if [ -s "${STATE:-/nonexistent}/nbdkit.pid" ] && [ ! -f "$STATE/nbdkit.rc" ]; then
        kill -TERM "$(cat "$STATE/nbdkit.pid")" 2>/dev/null || true
        i=0
        while [ ! -f "$STATE/nbdkit.rc" ] && [ $i -lt 100 ]; do
            i=$((i + 1)); sleep 0.1
        done
    fi
}
