#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The plugin and the engine built with ASan+UBSan (plugin/pdio_asan.la,
# see tests/Makefile.am) under the integration clients: shadow_io (io_uring,
# 512-byte alignment, odd image size; then psync with align=4096 and the
# bounce canary on) and interleave_io (concurrent read-modify-writes of
# shared blocks).  Passes only if every client run passes and the server
# logs no sanitizer report and exits 0.
#
# How nbdkit runs it: nbdkit itself is not instrumented, so ASan's runtime
# must be the first library in the process: LD_PRELOAD of gcc's
# libasan.so (the one the module was linked with).  NBDKIT_VALGRIND=1 makes
# nbdkit keep the plugin loaded at exit (no dlclose), so that leak reports
# can name pdio's functions.  Leak checking stays on: nbdkit 1.32.5 leaks
# nothing in these runs (checked: a clean LeakSanitizer pass), so no
# suppression is needed and a leak in pdio fails the test.  UBSan stops at
# the first report (-fno-sanitize-recover=all in SANITIZE_CFLAGS).
set -eu
# The plugin is what is tested: nbdkit serves it, whatever the suite default.
. "$TESTS_SRCDIR/lib/common.sh" --server=nbdkit
make_tmpdir
pick_seed

PLUGIN=$(built "$TESTS_BUILDDIR/plugin/.libs/pdio_asan.so")
libasan=$(${CC:-gcc} -print-file-name=libasan.so)
[ -f "$libasan" ] || hard_error "gcc's libasan.so not found ($libasan)"
ldd "$PLUGIN" | grep -q libasan || fail "$PLUGIN is not linked with ASan"

real_nbdkit=$NBDKIT
NBDKIT=$tmp/nbdkit-asan
cat > "$NBDKIT" <<EOF
#!/bin/sh
export LD_PRELOAD="$libasan"
export ASAN_OPTIONS="detect_leaks=1:halt_on_error=1:abort_on_error=0:exitcode=23:strict_string_checks=1:detect_stack_use_after_return=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export NBDKIT_VALGRIND=1
exec "$real_nbdkit" "\$@"
EOF
chmod +x "$NBDKIT"

no_reports ()
{
    if grep -E 'ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:|SUMMARY: (Address|Undefined)' "$1"; then
        fail "sanitizer report in $1"
    fi
    echo "$1: no sanitizer report"
}

# The sanitizers are really in the server process.
img=$tmp/probe.img
make_image "$img" $((1024 * 1024)) "$seed"
start_server "$tmp/probe.log" "$PLUGIN" file="$img"
maps=$(cat "/proc/$(cat "$server_pidfile")/maps")
stop_server
case $maps in *libasan*) ;; *) fail "libasan is not mapped in nbdkit" ;; esac
case $maps in *pdio_asan.so*) ;; *) fail "pdio_asan.so is not mapped in nbdkit" ;; esac
case $maps in *libubsan*) ;; *) fail "libubsan is not mapped in nbdkit" ;; esac
echo "nbdkit runs with libasan, libubsan and pdio_asan.so mapped"

img=$tmp/odd.img
make_image "$img" $((6 * 1024 * 1024 + 1234)) "$seed"
shadow_args="-n 4000 -c 4 -q 8"
shadow_run asan-uring "$img"
no_reports "$tmp/asan-uring.log"

shadow_args="-n 2000 -c 4 -q 8"
saved_flags=$nbdkit_flags
nbdkit_flags="$nbdkit_flags -D pdio.canary=1"
shadow_run asan-psync-4k "$img" backend=psync align=4096
nbdkit_flags=$saved_flags
no_reports "$tmp/asan-psync-4k.log"

img=$tmp/small.img
make_image "$img" $((192 * 1024 + 1234)) "$seed"
interleave_args="-c 4 -q 16 -n 3000"
interleave_run asan-interleave "$img" align=4096
no_reports "$tmp/asan-interleave.log"
