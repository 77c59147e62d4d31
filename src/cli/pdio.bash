# SPDX-License-Identifier: BSD-3-Clause
# bash completion for pdio(1), installed as
# $(datadir)/bash-completion/completions/pdio.
#
# The commands and their options are read from pdio's own --help, so this
# file names none of them and cannot fall behind the program.  Attached
# devices and images come from `pdio list`.

# The commands: the lines under "Commands:" that start with one word.
_pdio_commands()
{
    "$1" --help 2>/dev/null |
        awk '/^Commands:/ { on = 1; next }
             on && /^$/ { exit }
             on && /^  [a-z]/ { print $1 }'
}

# A command's options, one a line: "NAME" or "NAME ARG" where the option
# takes an argument (ARG as --help spells it: N, PATH, off|on|require...).
# An option's line starts with at most 6 spaces; a description that goes
# on to the next line is indented further, and may start with an option.
_pdio_options()
{
    "$1" "$2" --help 2>/dev/null |
        awk 'match($0, /^ +-/) && RLENGTH <= 8 {
                 arg = ""; n = 0
                 for (i = 1; i <= NF; i++) {
                     f = $i; sub(/,$/, "", f)
                     if (f ~ /^-/) { names[++n] = f; continue }
                     if (f ~ /^[A-Z][A-Z_]*$/ || f ~ /^[a-z0-9]+(\|[a-z0-9]+)+$/)
                         arg = f
                     break
                 }
                 for (i = 1; i <= n; i++)
                     print names[i] (arg == "" ? "" : " " arg)
             }'
}

# What is attached: each device (/dev/nbdN) and its image.
_pdio_attached()
{
    "$1" list 2>/dev/null | awk 'NR > 1 { print "/dev/" $1; print $2 }'
}

_pdio()
{
    local cur prev words cword
    _init_completion || return

    local pdio=${words[0]} cmd= i
    for ((i = 1; i < cword; i++)); do
        case ${words[i]} in
        -*) ;;
        *) cmd=${words[i]}; break ;;
        esac
    done

    if [[ -z $cmd ]]; then
        COMPREPLY=($(compgen -W "$(_pdio_commands "$pdio") --help --version" -- "$cur"))
        return
    fi

    local opts arg
    opts=$(_pdio_options "$pdio" "$cmd")

    # The argument of the option before the cursor.
    if [[ $prev == -* ]]; then
        arg=$(awk -v o="$prev" '$1 == o { print $2 }' <<<"$opts")
        case $arg in
        '') ;;
        *'|'*)
            COMPREPLY=($(compgen -W "${arg//|/ }" -- "$cur"))
            return ;;
        PATH | FILE | PLUGIN)
            _filedir
            return ;;
        DIR)
            _filedir -d
            return ;;
        DEV)
            COMPREPLY=($(compgen -W "$(ls -d /dev/nbd* 2>/dev/null | grep -v p)" -- "$cur"))
            return ;;
        *)
            return ;;           # a number, a name, an address
        esac
    fi

    if [[ $cur == -* ]]; then
        COMPREPLY=($(compgen -W "$(awk '{ print $1 }' <<<"$opts") --help" -- "$cur"))
        return
    fi

    case $cmd in
    attach | serve)
        _filedir ;;
    detach | restart | resize | stats)
        COMPREPLY=($(compgen -W "$(_pdio_attached "$pdio")" -- "$cur")) ;;
    esac
}
complete -F _pdio pdio
