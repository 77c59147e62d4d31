#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# bench/tls.sh — what TLS costs pdio's own server, beside its peers with
# TLS (run as root, by hand; never part of "make check"):
#
#   bench/tls.sh [REPEAT]
#
# Serves one image (BENCH_SIZE, default 1G, in BENCH_DIR, default
# /var/tmp/pdio-bench-tls) over loopback TCP, in turn: pdio serve in plain
# text, pdio serve with x509 (fio's nbd engine cannot be given a PSK
# file: libnbd refuses local files in its URIs), nbdkit file cache=none with
# --tls=require (x509), and qemu-nbd --cache=none --aio=io_uring with
# --tls-creds (x509); and runs fio's nbd engine on each: 4 KiB random
# reads at QD32 (rr4k) and 1 MiB sequential reads at QD8 (sr1m), for
# BENCH_RUNTIME seconds (default 10).  Prints one line per server and job
# and repetition: IOPS and MiB/s.  Compare ratios within one run: the
# client and the server share this machine's cores.
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
pdio=${PDIO:-$here/src/cli/pdio}
dir=${BENCH_DIR:-/var/tmp/pdio-bench-tls}
size=${BENCH_SIZE:-1G}
runtime=${BENCH_RUNTIME:-10}
repeat=${1:-1}
mkdir -p "$dir"
img=$dir/img
[ -f "$img" ] || { truncate -s "$size" "$img"; fio --name=fill --filename="$img" --rw=write --bs=1M --direct=1 --size="$size" > /dev/null; }

pki=$dir/pki
if [ ! -f "$pki/server/server-cert.pem" ]; then
    mkdir -p "$pki/server" "$pki/client" "$pki/home/.pki"
    certtool --generate-privkey --outfile "$pki/ca-key.pem" 2> /dev/null
    printf 'cn = bench CA\nca\ncert_signing_key\n' > "$pki/ca.info"
    certtool --generate-self-signed --load-privkey "$pki/ca-key.pem" --template "$pki/ca.info" --outfile "$pki/server/ca-cert.pem" 2> /dev/null
    certtool --generate-privkey --outfile "$pki/server/server-key.pem" 2> /dev/null
    printf 'cn = localhost\ndns_name = localhost\nip_address = 127.0.0.1\ntls_www_server\nencryption_key\nsigning_key\n' > "$pki/server.info"
    certtool --generate-certificate --load-ca-certificate "$pki/server/ca-cert.pem" --load-ca-privkey "$pki/ca-key.pem" \
        --load-privkey "$pki/server/server-key.pem" --template "$pki/server.info" --outfile "$pki/server/server-cert.pem" 2> /dev/null
    cp "$pki/server/ca-cert.pem" "$pki/client/"
    cp -r "$pki/client" "$pki/home/.pki/libnbd"
    psktool -u bench -p "$pki/keys.psk" > /dev/null
    mkdir -p "$pki/qpsk" && cp "$pki/keys.psk" "$pki/qpsk/"
fi
port=10909
pid=
trap '[ -z "$pid" ] || kill $pid 2> /dev/null' EXIT

start ()
{
    case $1 in
    plain) exec "$pdio" serve --port $port "$img" ;;
    x509) exec "$pdio" serve --port $port --tls-certificates "$pki/server" "$img" ;;
    psk) exec "$pdio" serve --port $port --tls-psk "$pki/keys.psk" "$img" ;;
    nbdkit-x509) exec nbdkit -f -p $port -i 127.0.0.1 --tls=require --tls-certificates "$pki/server" file "$img" cache=none ;;
    qemu-x509) exec qemu-nbd -f raw --cache=none --aio=io_uring -t -e 16 -b 127.0.0.1 -p $port \
        --object tls-creds-x509,id=tls0,dir="$pki/server",endpoint=server,verify-peer=off --tls-creds tls0 "$img" ;;
    esac > "$dir/$1.log" 2>&1 &
    pid=$!
    for _ in $(seq 100); do
        python3 -c "import socket; socket.create_connection(('127.0.0.1', $port), 1)" 2> /dev/null && return
        sleep 0.1
    done
    echo "$1 did not start" >&2; cat "$dir/$1.log" >&2; exit 1
}

uri ()
{
    case $1 in
    plain) echo "nbd://localhost:$port/" ;;
    psk) echo "nbds://bench@localhost:$port/?tls-psk-file=$pki/keys.psk" ;;
    *) echo "nbds://localhost:$port/" ;;
    esac
}

job ()
{
    # fio's nbd engine takes no local-file URI parameters but for PSK:
    # x509 clients find the CA in $HOME/.pki/libnbd.
    HOME=$pki/home fio --name="$2" --ioengine=nbd --uri="$(uri "$1")" --size="$size" \
        --time_based --runtime="$runtime" --ramp_time=2 --output-format=json "${@:3}" |
        python3 -c '
import json, sys
out = sys.stdin.read()
r = json.loads(out[out.index("{"):])["jobs"][0]["read"]
print("%-12s %-5s %8d IOPS %8.1f MiB/s" % (sys.argv[1], sys.argv[2], r["iops"], r["bw"] / 1024))
' "$1" "$2"
}

for r in $(seq "$repeat"); do
    for s in plain x509 nbdkit-x509 qemu-x509; do
        start $s
        job $s rr4k --rw=randread --bs=4k --iodepth=32
        job $s sr1m --rw=read --bs=1M --iodepth=8
        kill $pid; wait $pid 2> /dev/null || :
    done
done
