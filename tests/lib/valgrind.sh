# SPDX-License-Identifier: BSD-3-Clause
# Helpers for the valgrind tests (tests/*/valgrind.sh): memcheck with one
# set of options, over a program that the harness runs.  Sourced after
# tests/lib/common.sh, except by engine.sh, which needs only the options.
#
#   VALGRIND_MEMCHECK      the options: every error kind, --track-origins,
#                          definite leaks reported and counted as errors
#   valgrind_wrap REAL WRAPPER [NAME=VALUE...]
#                          write WRAPPER, a script that runs REAL under
#                          memcheck (with the NAME=VALUEs exported), exit
#                          status 97 on an error, each process's report in
#                          $tmp/valgrind.PID; at exit, any report is shown
#   valgrind_logs_empty DIR
#                          fail, showing it, on any non-empty valgrind.*
#                          report in DIR; sets vg_logs to how many there
#                          were, for the caller's own count check

VALGRIND_MEMCHECK="--quiet --track-origins=yes --leak-check=full \
--errors-for-leak-kinds=definite --show-leak-kinds=definite"

valgrind_wrap ()
{
    _real=$1 _wrapper=$2; shift 2
    {
        echo "#!/bin/sh"
        for _kv in "$@"; do echo "export $_kv"; done
        echo "exec valgrind $VALGRIND_MEMCHECK --error-exitcode=97 --log-file='$tmp/valgrind.%p' '$_real' \"\$@\""
    } > "$_wrapper"
    chmod +x "$_wrapper"
    # A report makes the program exit 97 and the helpers fail at once:
    # show it.
    at_exit 'for f in "$tmp"/valgrind.*; do [ -s "$f" ] && { echo "--- $f:"; cat "$f"; }; done'
}

valgrind_logs_empty ()
{
    vg_logs=0
    for f in "$1"/valgrind.*; do
        [ -e "$f" ] || continue
        vg_logs=$((vg_logs + 1))
        if [ -s "$f" ]; then
            cat "$f"
            fail "valgrind reported errors ($f)"
        fi
    done
}
