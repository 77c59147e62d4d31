#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# libFuzzer over the request -> plan -> dio_args -> executor mapping
# (fuzz_plan.c says which invariants it checks).  First every input of the
# committed seed corpus (tests/engine/corpus/) must pass as it is; then
# libFuzzer mutates from there for a bounded time: 60 s by default
# (PDIO_FUZZ_SECONDS), with a seed printed for the record.  New inputs go
# to a scratch corpus, never into the source tree.
#
# On a failure the crashing input is kept in tests/engine/fuzz-artifacts/
# (build tree) and its bytes are printed; replay it with
#     tests/engine/fuzz_plan tests/engine/fuzz-artifacts/crash-...
#
# Other targets reuse this script (protocol/fuzz-server.sh, cli/fuzz-uri.sh): FUZZ_PART names
# the folder of the target and its corpus, FUZZ_TARGET the
# program, FUZZ_CORPUS its seed directory, FUZZ_MAX_LEN the longest input
# and FUZZ_SECONDS its default time.
set -eu
. "$TESTS_SRCDIR/lib/common.sh"
make_tmpdir
pick_seed

target=${FUZZ_TARGET:-fuzz_plan}
# The part whose folder holds the target and its corpus.
part=${FUZZ_PART:-engine}
fuzz=$TESTS_BUILDDIR/$part/$target
corpus=$TESTS_SRCDIR/$part/${FUZZ_CORPUS:-corpus}
secs=${PDIO_FUZZ_SECONDS:-${FUZZ_SECONDS:-60}}
[ -x "$fuzz" ] || hard_error "$fuzz is not built (make check builds it with clang)"
n=$(find "$corpus" -type f | wc -l)
[ "$n" -gt 0 ] || hard_error "the seed corpus $corpus is empty"
artifacts=$TESTS_BUILDDIR/$part/fuzz-artifacts

show_crash ()
{
    for f in "$tmp"/crash-* "$tmp"/leak-* "$tmp"/timeout-* "$tmp"/oom-*; do
        [ -e "$f" ] || continue
        mkdir -p "$artifacts"
        cp "$f" "$artifacts/"
        echo "--- $(basename "$f") (kept in $artifacts):"
        od -An -tx1 "$f"
        echo "replay: $fuzz $artifacts/$(basename "$f")"
    done
}

echo "== the $n seeds of $corpus, once each"
st=0
"$fuzz" -runs=0 -artifact_prefix="$tmp/" "$corpus" > "$tmp/seeds.log" 2>&1 || st=$?
if [ $st != 0 ]; then
    tail -n 40 "$tmp/seeds.log"
    show_crash
    fail "a seed of the committed corpus breaks an invariant"
fi
grep -E 'INITED|DONE' "$tmp/seeds.log" || :

echo "== fuzzing for $secs s (libFuzzer -seed=$seed)"
mkdir "$tmp/corpus"
st=0
"$fuzz" -max_total_time="$secs" -seed="$seed" -max_len="${FUZZ_MAX_LEN:-64}" \
    -print_final_stats=1 -artifact_prefix="$tmp/" -close_fd_mask=1 \
    "$tmp/corpus" "$corpus" > "$tmp/fuzz.log" 2>&1 || st=$?
grep -E 'INITED|DONE|^stat::' "$tmp/fuzz.log" || :
if [ $st != 0 ]; then
    tail -n 60 "$tmp/fuzz.log"
    show_crash
    fail "$target found an input that breaks an invariant (libFuzzer seed $seed)"
fi
execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$tmp/fuzz.log")
[ -n "$execs" ] && [ "$execs" -gt 0 ] || fail "libFuzzer ran no input"
echo "$target: $execs executions in $secs s, $(find "$tmp/corpus" -type f | wc -l) new corpus entries, no invariant broken"
