#!/bin/sh
# The second front end for the shared suites: `make check` runs each test
# listed in NATIVE_SH_TESTS or NATIVE_TAP_TESTS (tests/Makefile.am) twice,
# once as itself (nbdkit with pdio.so) and once through this script against
# pdio's own server (pdio serve).
# Its argument is a stub, native/DIR/NAME.nsh or .ntap, whose one line is
# the test it stands for (DIR/NAME.sh or .tap, relative to tests/); the
# test picks its server from PDIO_TEST_FRONTEND (tests/lib/common.sh).
set -eu
stub=$1
test=$(cat "$stub")
PDIO_TEST_FRONTEND=native
export PDIO_TEST_FRONTEND
exec ${SHELL:-/bin/sh} "$TESTS_SRCDIR/$test"
