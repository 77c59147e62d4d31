#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
# The engine on block devices: loop devices with 512- and 4096-byte
# sectors (BLKSSZGET geometry, fallocate/BLKDISCARD zero and trim, the
# block device's page cache left empty).  Needs root, as the suite does.
set -eu
dir=$(mktemp -d "${TESTS_BUILDDIR:-.}/tmp-blockdev-XXXXXX")
loops=""
cleanup() {
    for l in $loops; do losetup -d "$l" 2>/dev/null || true; done
    rm -rf "$dir"
}
trap cleanup EXIT

for sector in 512 4096; do
    truncate -s 192M "$dir/backing-$sector"   # sparse; room for a trim in pieces
    dev=$(losetup -f --show --sector-size "$sector" "$dir/backing-$sector")
    loops="$loops $dev"
    echo "== $dev, $sector-byte sectors"
    "${TESTS_BUILDDIR:-.}/engine/test_engine" "$dev"
done
