#!/bin/sh
# run.sh: runs every test binary of the given build directories, and the
# suite's own checks (tests/deps.pl), and ends with "N passed, N failed"
# (", N skipped" when a test could not run here).
# Usage: tests/run.sh [--only 'NAME...'] [--repeat N] [--it-only] BUILD_DIR...
# (--only: these tests alone, a space-separated list of names;
#  --repeat N: every selected test N times, each run counted;
#  --it-only: the integration tests alone, as the ThreadSanitizer build runs them)
# tests/callgraph.py checks each build's object files for call loops.
# The Python package's tests (tests/pytest.sh) and the README's
# (tests/readme.sh: its command blocks, as printed) run where the build made
# the package ($dir/python: the optimized build).
# Integration tests find the daemon through KVC_BUILD (the build directory)
# and the sources through KVC_SRCDIR (the current directory by default).
only=""; repeat=1; itonly=""
while [ $# -gt 0 ]; do
  case "$1" in
    --only) only="$2"; shift 2 ;;
    --repeat) repeat="$2"; shift 2 ;;
    --it-only) itonly=1; shift ;;
    *) break ;;
  esac
done
[ $# -gt 0 ] || set -- build
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
export KVC_SRCDIR="${KVC_SRCDIR:-$(pwd)}"
pass=0; fail=0; skip=0; failed_names=""
out=$(mktemp); trap 'rm -f "$out" "$out.err"' EXIT

# Runs one test program (label, then the command) and counts the verdict
# lines it prints: PASS name, FAIL name why, SKIP name why.
run_one() {
  label="$1"; shift
  "$@" > "$out" 2>"$out.err"
  rc=$?
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
    failed_names="$failed_names $label"
  fi
  if grep -q '^FAIL' "$out" || [ $rc -ne 0 ]; then
    sed 's/^/      | /' "$out.err" | tail -40
  fi
  rm -f "$out.err"
}

# The names of $only that the program lists, or nothing.
selected() {
  list=$("$@" --list)
  for n in $only; do
    printf '%s\n' "$list" | grep -qx -- "$n" && printf '%s ' "$n"
  done
}

i=0
while [ $i -lt "$repeat" ]; do
  i=$((i + 1))
  # The suite's own checks run once per round, not per build.
  if [ -z "$itonly" ]; then
    names=""
    [ -n "$only" ] && names=$(selected tests/deps.pl)
    if [ -z "$only" ] || [ -n "$names" ]; then
      # shellcheck disable=SC2086 # names is a list of words
      run_one tests/deps.pl tests/deps.pl $names
    fi
  fi
  for dir in "$@"; do
    # The build's object files call one another in no loop (src/ and
    # daemon/, doc/design.md's module graph): tests/callgraph.py.
    if [ -z "$itonly" ]; then
      names=""
      [ -n "$only" ] && names=$(selected tests/callgraph.py)
      if [ -z "$only" ] || [ -n "$names" ]; then
        # shellcheck disable=SC2086 # names is a list of words
        run_one "$dir/callgraph" tests/callgraph.py "$dir" $names
      fi
    fi
    for bin in "$dir"/tests/unit_* "$dir"/tests/it_* "$dir"/tests/fuzz_*; do
      [ -x "$bin" ] || continue
      case "$bin" in */it_*) ;; *) [ -n "$itonly" ] && continue ;; esac
      names=""
      if [ -n "$only" ]; then
        names=$(selected "$bin")
        [ -n "$names" ] || continue
      fi
      # shellcheck disable=SC2086 # names is a list of words
      KVC_BUILD="$dir"; export KVC_BUILD
      run_one "$dir/$(basename "$bin")" "$bin" $names
    done
    # The Python package's pytest suite, where the build made the package
    # (the optimized build): each pytest test is one verdict line.
    if [ -z "$itonly" ] && [ -d "$dir/python/kvcache" ]; then
      names=""
      [ -n "$only" ] && names=$(selected tests/pytest.sh "$dir")
      if [ -z "$only" ] || [ -n "$names" ]; then
        KVC_BUILD="$dir"; export KVC_BUILD
        # shellcheck disable=SC2086 # names is a list of words
        run_one "$dir/python" tests/pytest.sh "$dir" $names
      fi
      names=""
      [ -n "$only" ] && names=$(selected tests/readme.sh "$dir")
      if [ -z "$only" ] || [ -n "$names" ]; then
        # shellcheck disable=SC2086 # names is a list of words
        run_one "$dir/readme" tests/readme.sh "$dir" $names
      fi
    fi
  done
done
[ -n "$failed_names" ] && echo "failed:$failed_names"
if [ $skip -gt 0 ]; then
  echo "$pass passed, $fail failed, $skip skipped"
else
  echo "$pass passed, $fail failed"
fi
[ $fail -eq 0 ] && [ $pass -gt 0 ]
