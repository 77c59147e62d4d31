#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
# The layering of the parts, with the include flags the product is built
# with (src/parts.mk, handed over by tests/Makefile.am in
# common/layering.env):
#
#   - each part's build names its own flags (src/Makefile.am,
#     plugin/Makefile.am);
#   - from each part, src/common's headers and the public headers of the
#     parts it uses compile on their own; every other part's public header
#     and every other part's internal header is not found ("No such file
#     or directory": any other error would prove nothing);
#   - no file of src/ or plugin/ reaches around the flags with a path in
#     a quoted #include ("../server/internal.h", or "src/server/internal.h"
#     through the -I of config.h's folder, the top of the tree).
#
#   common  <  engine, protocol  <  server  <  cli;   plugin -> engine
#
# Exit-code protocol: 0 pass, 1 fail, 99 hard error.
set -u

env_file=${TESTS_BUILDDIR:-.}/common/layering.env
srcdir=${PDIO_SRCDIR:-..}
if [ ! -r "$env_file" ]; then
    echo "layering: no $env_file (make builds it)" >&2
    exit 99
fi
. "$env_file"

tmp=$(mktemp -d) || exit 99
trap 'rm -rf "$tmp"' EXIT
fails=0 checks=0

fail () {
    echo "FAIL: $*"
    fails=$((fails + 1))
}

# The flags of a part, by name.
flags_of () {
    case $1 in
        engine) echo "$ENGINE" ;; protocol) echo "$PROTOCOL" ;;
        server) echo "$SERVER" ;; cli) echo "$CLI" ;; plugin) echo "$PLUGIN" ;;
    esac
}

# The public headers each part may include, besides its own.
uses () {
    case $1 in
        engine|protocol) echo "" ;;
        server|cli) echo "engine.h proto.h server.h" ;;
        plugin) echo "engine.h" ;;
    esac
}

# compile PART HEADER: 0 if a file holding only #include "HEADER" compiles
# with PART's flags; the compiler's messages in $tmp/err.
compile () {
    printf '#include <config.h>\n#include "%s"\n' "$2" > "$tmp/t.c"
    # shellcheck disable=SC2046
    $CC $(flags_of "$1") $CFLAGS -c "$tmp/t.c" -o "$tmp/t.o" 2> "$tmp/err"
}

sees () {
    checks=$((checks + 1))
    if ! compile "$1" "$2"; then
        fail "$1 cannot include $2:"
        sed 's/^/    /' "$tmp/err"
    fi
}

blind () {
    checks=$((checks + 1))
    if compile "$1" "$2"; then
        fail "$1 can include $3 $2"
    elif ! grep -q "$2: No such file or directory" "$tmp/err"; then
        fail "$1 including $2 fails, but not for want of the file:"
        sed 's/^/    /' "$tmp/err"
    fi
}

# Each product build uses its part's flags.
for t in "src/Makefile.am engine_libengine_la_CPPFLAGS ENGINE" \
         "src/Makefile.am protocol_libprotocol_la_CPPFLAGS PROTOCOL" \
         "src/Makefile.am server_libserver_la_CPPFLAGS SERVER" \
         "src/Makefile.am cli_pdio_CPPFLAGS CLI" \
         "plugin/Makefile.am pdio_la_CPPFLAGS PLUGIN"; do
    set -- $t
    checks=$((checks + 1))
    grep -Eq "^$2 = \\\$\\($3_PART_CPPFLAGS\\)\$" "$srcdir/$1" ||
        fail "$1: $2 is not \$($3_PART_CPPFLAGS)"
done

for part in engine protocol server cli plugin; do
    own=$srcdir/src/$part
    [ "$part" = plugin ] && own=$srcdir/plugin
    for h in "$srcdir"/src/common/*.h; do
        sees $part "${h##*/}"
    done
    for q in engine protocol server; do
        pub=$(cd "$srcdir/src/$q/include" && echo *.h)
        case " $(uses $part) " in
            *" $pub "*) ok=1 ;;
            *) ok=0 ;;
        esac
        if [ "$q" = "$part" ] || [ $ok = 1 ]; then
            sees $part "$pub"
        else
            blind $part "$pub" "the public header of $q,"
        fi
    done
    for q in engine protocol server cli; do
        [ "$q" = "$part" ] && continue
        for h in "$srcdir"/src/$q/*.h; do
            [ -e "$h" ] || continue
            # A header of the same name in the part's own folder is its own.
            [ -e "$own/${h##*/}" ] && continue
            blind $part "${h##*/}" "the internal header of $q,"
        done
    done
done

# Around the flags: a path in a quoted include.
checks=$((checks + 1))
if grep -rnE '^[[:space:]]*#[[:space:]]*include[[:space:]]*"[^"]*/' \
        "$srcdir/src" "$srcdir/plugin" --include='*.c' --include='*.h'; then
    fail "a path in a quoted #include in src/ or plugin/ (above)"
fi

echo "$checks checks, $fails failed"
[ "$fails" = 0 ]
