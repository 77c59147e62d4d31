#!/usr/bin/env bash
# pdio's own server built with ThreadSanitizer (server/pdio_tsan: pdio(1),
# the server and the engine compiled in; halt_on_error, exit 66 on a
# report, from lib/tsan_options.c) with two workers: shadow_io over 4
# connections (so both workers serve, and overlapping writes from two
# workers meet in the range lock), 300 hostile connections handed out by
# the accept thread, and SIGTERM while writes are in flight.  A report
# makes the server exit non-zero, which fails the test.
set -eu
export PDIO_TEST_SERVER=native
export PDIO_TEST_PDIO=$TESTS_BUILDDIR/server/pdio_tsan
. "$TESTS_SRCDIR/lib/common.sh"
require_cmd python3
make_tmpdir
pick_seed
[ -x "$PDIO_TEST_PDIO" ] || hard_error "$PDIO_TEST_PDIO is not built"
raw=$TESTS_SRCDIR/server/rawclient.py

no_report ()
{
    if grep -q 'WARNING: ThreadSanitizer' "$1"; then
        grep -A 30 'WARNING: ThreadSanitizer' "$1" | head -n 60
        fail "ThreadSanitizer report in $1 (above)"
    fi
}

img=$tmp/img
make_image "$img" $((8 * 1024 * 1024 + 1234)) "$seed"
shadow_args="-n 2000 -c 4 -q 8"
shadow_run tsan "$img"
no_report "$tmp/tsan.log"

start_server "$tmp/tsan2.log" "$PLUGIN" file="$img"
run_client python3 "$raw" hostile "$sock" 300 "$seed" > /dev/null ||
    fail "a hostile connection got a wrong reply"
sigterm_in_flight "$img"
no_report "$tmp/tsan2.log"
[ $server_status = 0 ] || fail "pdio_tsan exited $server_status after SIGTERM"
echo "no ThreadSanitizer report; every server exited 0"
