#!/usr/bin/env bash
# pdio's own server built with ASan+UBSan (server/pdio_asan: pdio(1), the
# server and the engine compiled in), leak checking on, under the loads
# that exercise every path of a connection: shadow_io over 4 connections
# (reads, writes, zero, trim, flush, FUA; unaligned), base:allocation
# queries (nbdinfo --map), 600 hostile raw-socket connections (broken
# handshakes, floods, refused and abandoned requests, hang-ups with
# replies queued), and SIGTERM with writes in flight.  Any sanitizer
# report, or a server that does not exit 0 (ASan exits non-zero on a
# leak), fails.
set -eu
export PDIO_TEST_FRONTEND=native
export PDIO_TEST_PDIO=$TESTS_BUILDDIR/server/pdio_asan
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:exitcode=66
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1:exitcode=67
. "$TESTS_SRCDIR/lib/common.sh"
require_cmd nbdinfo python3
make_tmpdir
pick_seed
[ -x "$PDIO_TEST_PDIO" ] || hard_error "$PDIO_TEST_PDIO is not built"
raw=$TESTS_SRCDIR/server/rawclient.py

clean_log ()
{
    if grep -E 'ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:' "$1"; then
        fail "sanitizer report in $1 (above)"
    fi
}

img=$tmp/img
make_image "$img" $((8 * 1024 * 1024 + 1234)) "$seed"
shadow_args="-n 3000 -c 4 -q 8"
shadow_run asan "$img"
clean_log "$tmp/asan.log"

start_server "$tmp/asan2.log" "$PLUGIN" file="$img"
nbdinfo --map "$uri" > /dev/null
run_client python3 "$raw" hostile "$sock" 600 "$seed" > /dev/null ||
    fail "a hostile connection got a wrong reply"
stop_server
clean_log "$tmp/asan2.log"

start_server "$tmp/asan3.log" "$PLUGIN" file="$img"
sigterm_in_flight "$img"
[ $server_status = 0 ] || { cat "$tmp/asan3.log"; fail "pdio_asan exited $server_status after SIGTERM"; }
clean_log "$tmp/asan3.log"
echo "no sanitizer report; every server exited 0"
