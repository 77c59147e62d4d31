#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Clients with libnbd's default strictness (as nbdcopy, nbdfuse, nbdsh and
# libnbd's examples use it) at arbitrary byte offsets and lengths: six
# threads on three connections, reads, writes, FUA writes, zeroes and
# structured reads checked chunk by chunk, against a shadow; then the image
# file must equal the shadow.  pdio must advertise minimum 1 (or libnbd
# refuses the odd offsets itself) and preferred = the alignment.  Plain,
# align=4096, and an image whose size is a multiple of no block size.
set -eu
. "$TESTS_SRCDIR/lib/common.sh"
make_tmpdir
pick_seed

make_image "$tmp/plain.img" $((8 * 1024 * 1024)) "$seed"
_client_run strict-plain strict_clients "-t 6 -c 3 -n 600 -p 512" "$tmp/plain.img"

make_image "$tmp/a4k.img" $((8 * 1024 * 1024)) "$seed"
_client_run strict-align4k strict_clients "-t 6 -c 3 -n 600 -p 4096" "$tmp/a4k.img" align=4096
v=$(stat_value "$tmp/strict-align4k.log" rmw_blocks)
[ "$v" -gt 0 ] || fail "rmw_blocks=$v with align=4096 after byte-offset writes"

make_image "$tmp/odd.img" $((8 * 1024 * 1024 + 1234)) "$seed"
_client_run strict-odd strict_clients "-t 6 -c 3 -n 600 -p 512" "$tmp/odd.img"
v=$(stat_value "$tmp/strict-odd.log" tail_writes)
[ "$v" -gt 0 ] || fail "tail_writes=$v: the odd image's last bytes were never written"
echo "strict libnbd clients: plain, align=4096 and odd-sized images match their shadows"
