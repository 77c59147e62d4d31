#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The README's first command ends in scripts/demo: it must serve the demo
# image with pdio's own server and print a working URI and an nbd-client
# command with the image's block size (512 here, never the minimum of 1).
set -eu
. "$TESTS_SRCDIR/lib/common.sh"
make_tmpdir
out=$tmp/demo.out
PDIO_CLI=$PDIO PDIO_DEMO_DIR=$tmp/demo PDIO_DEMO_SIZE=64M PDIO_DEMO_ONCE=1 \
    timeout 60 sh "$PDIO_SRCDIR/scripts/demo" > "$out" 2>&1 ||
    { cat "$out"; fail "scripts/demo failed"; }
cat "$out"
grep -qxF "uri: nbd+unix:///?socket=$tmp/demo/nbd.sock" "$out" || fail "no URI line"
grep -qxF "attach: nbd-client -unix $tmp/demo/nbd.sock /dev/nbd0 -b 512 -C 1" "$out" ||
    fail "no nbd-client line with -b 512"
grep -q "block sizes 1/512/33554432" "$out" || fail "the block sizes are not 1/512/32M"
[ "$(fincore_pages "$tmp/demo/disk.img")" = 0 ] || fail "the demo image is in the page cache"
