#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Two writers on one image destroy it: the second nbdkit pdio of an image
# must fail at once, naming the server that holds it, and a reader too;
# read-only servers share the image, and a writer is refused while any
# reader holds it.  (tests/engine/test_engine.c checks the engine's lock
# through its API; this is the user's view, through nbdkit.)
# PDIO_TEST_PLUGIN=file makes this fail: nbdkit's file plugin takes no lock.
set -eu
# The holders are nbdkit with pdio.so (the lock is the engine's, whoever
# serves; pdio serve's refusal is cli.tap's).
. "$TESTS_SRCDIR/lib/common.sh" --server=nbdkit
make_tmpdir
pick_seed

img=$tmp/img
make_image "$img" $((4 * 1024 * 1024)) "$seed"

echo "== a writer holds the image"
start_server "$tmp/writer.log" "$PLUGIN" file="$img"
holder=$server_pid
expect_start_failure "$tmp/second-writer.log" "$PLUGIN" file="$img"
log_has "$tmp/second-writer.log" "$img: is in use: pid $holder (nbdkit)" \
    "(is it already served or attached?)"
expect_start_failure "$tmp/reader.log" "$PLUGIN" file="$img" readonly=true
log_has "$tmp/reader.log" "$img: is in use: pid $holder (nbdkit)"
# Through another path to the same file: a hard link.
ln "$img" "$tmp/link"
expect_start_failure "$tmp/link.log" "$PLUGIN" file="$tmp/link"
log_has "$tmp/link.log" "is in use: pid $holder (nbdkit)"
# The holder still serves, on two connections at once (multi-conn).
run_client "$tools/nbdreq" "$sock" write:0:4096:1 read:0:4096:1 > /dev/null &
run_client "$tools/nbdreq" "$sock" write:8192:4096:2 read:8192:4096:2 > /dev/null
wait $! || fail "I/O on the holder failed"
stop_server

echo "== two readers share it; a writer is refused"
start_server "$tmp/reader1.log" "$PLUGIN" file="$img" readonly=true
r1=$server_pid r1_pidfile=$server_pidfile r1_sock=$sock
start_server "$tmp/reader2.log" "$PLUGIN" file="$img" readonly=true
r2=$server_pid
run_client "$tools/nbdreq" "$r1_sock" read:0:4096:1 > /dev/null ||
    fail "reading through the first reader failed"
expect_start_failure "$tmp/writer2.log" "$PLUGIN" file="$img"
log_has "$tmp/writer2.log" "$img: is in use: pid "
grep -qE "is in use: pid ($r1|$r2) \\(nbdkit\\)" "$tmp/writer2.log" ||
    fail "the message does not name either reader ($r1, $r2)"
stop_server
server_pidfile=$r1_pidfile server_pid=$r1 server_log=$tmp/reader1.log
stop_server

echo "== once they have exited, a writer starts at once"
start_server "$tmp/writer3.log" "$PLUGIN" file="$img"
stop_server
echo "the lock refused a second writer and a reader while a writer served, shared the image between readers, and was gone as soon as they exited"
