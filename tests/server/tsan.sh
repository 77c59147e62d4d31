#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# pdio's own server built with ThreadSanitizer (server/pdio_tsan: pdio(1),
# the server and the engine compiled in; halt_on_error, exit 66 on a
# report, from lib/tsan_options.c) with two workers: shadow_io over 4
# connections (so both workers serve, and overlapping writes from two
# workers meet in the range lock), base:allocation queries, 300 hostile
# connections handed out by
# the accept thread, and SIGTERM while writes are in flight.  A report
# makes the server exit non-zero, which fails the test.
set -eu
export PDIO_TEST_SERVER=native
export PDIO_TEST_PDIO=$TESTS_BUILDDIR/server/pdio_tsan
. "$TESTS_SRCDIR/lib/common.sh"
require_cmd nbdinfo python3
make_tmpdir
pick_seed

no_report ()
{
    if grep -q 'WARNING: ThreadSanitizer' "$1"; then
        grep -A 30 'WARNING: ThreadSanitizer' "$1" | head -n 60
        fail "ThreadSanitizer report in $1 (above)"
    fi
}

sanitized_rounds tsan 2000 300 no_report
sigterm_in_flight "$img"
no_report "$server_log"
[ $server_status = 0 ] || fail "pdio_tsan exited $server_status after SIGTERM"
echo "no ThreadSanitizer report; every server exited 0"
