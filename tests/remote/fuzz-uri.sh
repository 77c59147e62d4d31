#!/usr/bin/env bash
# libFuzzer over the NBD URI parser (fuzz_uri.c says which invariants it
# checks): the seeds of tests/remote/corpus-uri/, then 20 s of mutation
# (PDIO_FUZZ_SECONDS overrides), by robust/fuzz.sh (whose paths are
# relative to robust/).
FUZZ_TARGET=../remote/fuzz_uri FUZZ_CORPUS=../remote/corpus-uri \
    FUZZ_MAX_LEN=512 FUZZ_SECONDS=20 exec bash "$TESTS_SRCDIR/robust/fuzz.sh"
