#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# valgrind memcheck over nbdkit serving pdio.so (the ordinary build) for
# one short integration run: shadow_io on an odd-sized image, 2
# connections.  backend=psync: valgrind cannot see what the kernel writes
# into memory for io_uring (it would call every byte a read fills
# "uninitialised"), while preadv2/pwritev2 are syscalls it models.  Passes
# only if memcheck reports no error at all: invalid reads or writes, use
# of uninitialised values (--track-origins), bad frees, and definite
# leaks (nbdkit keeps the plugin loaded at exit with NBDKIT_VALGRIND=1, so
# leaks in pdio are attributed; nbdkit 1.32.5 itself has none here).
set -eu
# The plugin is what is tested: nbdkit serves it, whatever the suite default.
. "$TESTS_SRCDIR/lib/common.sh" --server=nbdkit
. "$TESTS_SRCDIR/lib/valgrind.sh"
require_cmd valgrind
make_tmpdir
pick_seed

valgrind_wrap "$NBDKIT" "$tmp/nbdkit-valgrind" NBDKIT_VALGRIND=1
NBDKIT=$tmp/nbdkit-valgrind
# Everything is slower under valgrind.
client_timeout=600

img=$tmp/odd.img
make_image "$img" $((2 * 1024 * 1024 + 1234)) "$seed"
shadow_args="-n 800 -c 2 -q 4 -m 262144"
shadow_run valgrind-psync "$img" backend=psync
log_has "$tmp/valgrind-psync.log" "backend psync"

valgrind_logs_empty "$tmp"
[ $vg_logs -ge 1 ] || fail "valgrind wrote no log: did nbdkit run under it?"
echo "valgrind memcheck: no errors, no definite leaks ($vg_logs process log(s), all empty)"
