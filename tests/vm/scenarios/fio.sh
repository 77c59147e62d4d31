# SPDX-License-Identifier: BSD-3-Clause
# tests/vm/scenarios/fio.sh: scenario fio (and nbdkit-fio) of the VM
# guest: tests/fio/verify.fio with io_uring on /dev/nbd0 over two
# connections, then its read-only --verify_only pass.
scenario_fio() {
    l=$SCENARIO
    serve_attach "$l" 2 "with 2 connections (-C 2)"
    fio_round_trip "$l" io_uring
    step "$l: nbd-client -d detaches" detach
    server_end "$l"
}
