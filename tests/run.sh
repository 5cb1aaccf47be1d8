#!/bin/sh
# run.sh: runs every test binary of the given build directories and ends with
# "N passed, N failed" (", N skipped" when a test could not run here).
# Usage: tests/run.sh [--only NAME] [--it-only] BUILD_DIR...
# (--it-only: the integration tests alone, as the ThreadSanitizer build runs them)
# Integration tests find the daemon through KVC_BUILD (the build directory)
# and the sources through KVC_SRCDIR (the current directory by default).
only=""
if [ "$1" = "--only" ]; then only="$2"; shift 2; fi
itonly=""
if [ "$1" = "--it-only" ]; then itonly=1; shift; fi
[ $# -gt 0 ] || set -- build
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
export KVC_SRCDIR="${KVC_SRCDIR:-$(pwd)}"
pass=0; fail=0; skip=0; failed_names=""
out=$(mktemp); trap 'rm -f "$out"' EXIT
for dir in "$@"; do
  for bin in "$dir"/tests/unit_* "$dir"/tests/it_* "$dir"/tests/fuzz_*; do
    [ -x "$bin" ] || continue
    case "$bin" in */it_*) ;; *) [ -n "$itonly" ] && continue ;; esac
    if [ -n "$only" ]; then
      "$bin" --list | grep -qx "$only" || continue
      set -- "$only"
    else
      set --
    fi
    KVC_BUILD="$dir" "$bin" "$@" > "$out" 2>"$out.err"
    rc=$?
    label="$dir/$(basename "$bin")"
    while read -r verdict name rest; do
      case "$verdict" in
        PASS) pass=$((pass + 1)); echo "ok    $label $name" ;;
        FAIL) fail=$((fail + 1)); echo "FAIL  $label $name $rest"
              failed_names="$failed_names $label:$name" ;;
        SKIP) skip=$((skip + 1)); echo "skip  $label $name $rest" ;;
      esac
    done < "$out"
    if [ $rc -ne 0 ] && ! grep -q '^FAIL' "$out"; then
      fail=$((fail + 1)); echo "FAIL  $label (exit $rc, no test verdict)"
    fi
    if grep -q '^FAIL' "$out" || [ $rc -ne 0 ]; then
      sed 's/^/      | /' "$out.err" | tail -40
    fi
    rm -f "$out.err"
  done
done
[ -n "$failed_names" ] && echo "failed:$failed_names"
if [ $skip -gt 0 ]; then
  echo "$pass passed, $fail failed, $skip skipped"
else
  echo "$pass passed, $fail failed"
fi
[ $fail -eq 0 ] && [ $pass -gt 0 ]
