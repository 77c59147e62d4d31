#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# libFuzzer over the NBD URI parser (fuzz_uri.c says which invariants it
# checks): the seeds of tests/cli/corpus-uri/, then 20 s of mutation
# (PDIO_FUZZ_SECONDS overrides), by engine/fuzz.sh.
FUZZ_PART=cli FUZZ_TARGET=fuzz_uri FUZZ_CORPUS=corpus-uri FUZZ_MAX_LEN=512 \
    FUZZ_SECONDS=20 exec bash "$TESTS_SRCDIR/engine/fuzz.sh"
