#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# pdio's own server built with ASan+UBSan (server/pdio_asan: pdio(1), the
# server and the engine compiled in), leak checking on, under the loads
# that exercise every path of a connection: shadow_io over 4 connections
# (reads, writes, zero, trim, flush, FUA; unaligned), base:allocation
# queries (nbdinfo --map), 600 hostile raw-socket connections (broken
# handshakes, floods, refused and abandoned requests, hang-ups with
# replies queued), SIGTERM with writes in flight, and TLS (x509 made with
# certtool: shadow_io over TLS, 300 hostile TLS connections of
# tlsclient.py, then SIGTERM).  Any sanitizer
# report, or a server that does not exit 0 (ASan exits non-zero on a
# leak), fails.
set -eu
export PDIO_TEST_SERVER=native
export PDIO_TEST_PDIO=$TESTS_BUILDDIR/server/pdio_asan
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:exitcode=66
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1:exitcode=67
. "$TESTS_SRCDIR/lib/common.sh"
require_cmd nbdinfo python3 certtool
make_tmpdir
pick_seed

clean_log ()
{
    if grep -E 'ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:' "$1"; then
        fail "sanitizer report in $1 (above)"
    fi
}

sanitized_rounds asan 3000 600 clean_log
stop_server
clean_log "$server_log"

start_server "$tmp/asan3.log" "$PLUGIN" file="$img"
sigterm_in_flight "$img"
[ $server_status = 0 ] || { cat "$tmp/asan3.log"; fail "pdio_asan exited $server_status after SIGTERM"; }
clean_log "$tmp/asan3.log"
# TLS: the session's buffers, GnuTLS's state, and a connection dying in
# every TLS state.
pki=$tmp/pki
mkdir -p "$pki/server" "$pki/client"
certtool --generate-privkey --outfile "$pki/ca-key.pem" 2> /dev/null
printf 'cn = asan CA\nca\ncert_signing_key\n' > "$pki/ca.info"
certtool --generate-self-signed --load-privkey "$pki/ca-key.pem" --template "$pki/ca.info" \
    --outfile "$pki/server/ca-cert.pem" 2> /dev/null
certtool --generate-privkey --outfile "$pki/server/server-key.pem" 2> /dev/null
printf 'cn = localhost\ndns_name = localhost\ntls_www_server\nencryption_key\nsigning_key\n' > "$pki/server.info"
certtool --generate-certificate --load-ca-certificate "$pki/server/ca-cert.pem" \
    --load-ca-privkey "$pki/ca-key.pem" --load-privkey "$pki/server/server-key.pem" \
    --template "$pki/server.info" --outfile "$pki/server/server-cert.pem" 2> /dev/null
cp "$pki/server/ca-cert.pem" "$pki/client/"
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
server_log=$tmp/asan4.log
server_pidfile=$tmp/asan4.pid
"$PDIO" serve --exit-with-parent --port "$port" --tls-certificates "$pki/server" \
    --tls=on "$img" > "$server_log" 2>&1 &
server_pid=$!
echo $server_pid > "$server_pidfile"
at_exit "kill $server_pid 2>/dev/null"
wait_until 30 grep -q '^uri: ' "$server_log" || { cat "$server_log"; fail "pdio_asan with TLS did not start"; }
cp "$img" "$tmp/ref"
run_client "$tools/shadow_io" -s "$seed" -i "$tmp/ref" -o "$tmp/shadow" -n 1000 -c 2 -q 8 \
    "nbds://localhost:$port/?tls-certificates=$pki/client"
run_client python3 "$TESTS_SRCDIR/server/tlsclient.py" hostile "$port" "$pki/client" 300 "$seed" > /dev/null ||
    fail "a hostile TLS connection got a wrong reply"
stop_server
clean_log "$server_log"
cmp "$tmp/shadow" "$img" || fail "over TLS under ASan, the image differs from the shadow"
echo "no sanitizer report; every server exited 0"
