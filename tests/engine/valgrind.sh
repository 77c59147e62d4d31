#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
# valgrind memcheck over the engine's own workload (tests/engine/test_engine
# with PDIO_TEST_VALGRIND=1: the psync backend, see test_engine.c): no
# invalid access, no use of uninitialised memory, no definite leak.
set -eu
command -v valgrind >/dev/null || { echo "valgrind is not installed (apt-get install valgrind)"; exit 1; }
. "${TESTS_SRCDIR:?run from make check, or export TESTS_SRCDIR}/lib/valgrind.sh"
# shellcheck disable=SC2086 # the options are words
PDIO_TEST_VALGRIND=1 exec valgrind $VALGRIND_MEMCHECK --error-exitcode=1 \
    "${TESTS_BUILDDIR:-.}/engine/test_engine"
