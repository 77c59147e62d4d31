#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# libFuzzer over the native server's handshake and request parser
# (fuzz_server.c says what it feeds and which invariants it checks): the
# seeds of tests/protocol/corpus-server/ (mkcorpus-server.py wrote them),
# then 20 s of mutation (PDIO_FUZZ_SECONDS overrides), by fuzz.sh.
FUZZ_PART=protocol FUZZ_TARGET=fuzz_server FUZZ_CORPUS=corpus-server FUZZ_MAX_LEN=8192 \
    FUZZ_SECONDS=20 exec bash "$TESTS_SRCDIR/engine/fuzz.sh"
