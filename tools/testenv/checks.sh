# Output checks for the build scripts, immune to SIGPIPE (sourced by build.sh and prometheus.sh).
#
# Why: `binary --version | grep -q X` under `set -o pipefail` fails at random. grep -q exits at its first
# match, the binary's next write gets SIGPIPE, and the pipeline's status becomes 141 although the check
# matched (3 of 20 etcd checks failed this way on a fresh machine). These helpers capture the whole output
# first and match it in bash, with no pipe at all, so the result depends on the output alone.
#
# Usage: output_has PATTERN CMD [ARGS...]        any line of CMD's stdout+stderr contains PATTERN
#        output_has_line LINE CMD [ARGS...]      some line equals LINE exactly
#        output_has_prefix PREFIX CMD [ARGS...]  some line starts with PREFIX
#        file_has PATTERN FILE                   a line of FILE contains PATTERN (fixed string)
#        first_line CMD [ARGS...]                print the first line of CMD's output

_tandem_output() {  # run CMD, keep all of its output; a failing CMD fails the check
  local __out rc=0
  __out=$("$@" 2>&1) || rc=$?
  [ "$rc" -eq 0 ] || { printf 'check: %s exited %d\n' "$*" "$rc" >&2; return "$rc"; }
  printf '%s' "$__out"
}

_tandem_match() {  # MODE PATTERN TEXT: one bash pattern match over the whole text (no loop, no pipe)
  local mode=$1 pat=$2 text=$'\n'$3$'\n'
  case "$mode" in
    has) [[ $text == *"$pat"* ]] ;;
    line) [[ $text == *$'\n'"$pat"$'\n'* ]] ;;
    prefix) [[ $text == *$'\n'"$pat"* ]] ;;
    *) return 2 ;;
  esac
}

output_has() { local p=$1 o; shift; o=$(_tandem_output "$@") || return 1; _tandem_match has "$p" "$o" || { printf 'check: no line of `%s` contains %q\n' "$*" "$p" >&2; return 1; }; }
output_has_line() { local p=$1 o; shift; o=$(_tandem_output "$@") || return 1; _tandem_match line "$p" "$o" || { printf 'check: no line of `%s` is %q\n' "$*" "$p" >&2; return 1; }; }
output_has_prefix() { local p=$1 o; shift; o=$(_tandem_output "$@") || return 1; _tandem_match prefix "$p" "$o" || { printf 'check: no line of `%s` starts with %q\n' "$*" "$p" >&2; return 1; }; }
file_has() { [ -f "$2" ] && _tandem_match has "$1" "$(<"$2")"; }
first_line() { local o; o=$(_tandem_output "$@") || return 1; printf '%s\n' "${o%%$'\n'*}"; }
