#!/bin/sh
# valgrind memcheck over the engine's own workload (psync backend; see
# test_engine.c): no invalid access, no use of uninitialised memory, no
# definite leak.
set -eu
command -v valgrind >/dev/null || { echo "valgrind is not installed (apt-get install valgrind)"; exit 1; }
PDIO_TEST_VALGRIND=1 exec valgrind --quiet --error-exitcode=1 \
    --leak-check=full --errors-for-leak-kinds=definite --show-leak-kinds=definite \
    --track-origins=yes "${TESTS_BUILDDIR:-.}/unit/test_engine"
