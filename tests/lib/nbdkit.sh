#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
# The nbdkit variant of the served suites: `make check` runs each test
# named in NBDKIT_STUBS (tests/Makefile.am) twice, once as itself (pdio
# serve) and once through this script against nbdkit with pdio.so.
# Its argument is a stub, nbdkit/DIR/NAME.nsh or .ntap, whose one line is
# the test it stands for (DIR/NAME.sh or .tap, relative to tests/); the
# test picks its server from PDIO_TEST_SERVER (tests/lib/common.sh).
set -eu
stub=$1
test=$(cat "$stub")
PDIO_TEST_SERVER=nbdkit
export PDIO_TEST_SERVER
exec ${SHELL:-/bin/sh} "$TESTS_SRCDIR/$test"
