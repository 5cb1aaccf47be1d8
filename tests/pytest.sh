#!/bin/sh
# pytest.sh: the Python package's tests (client/python/tests) as a test
# program of tests/run.sh: prints "PASS name", "FAIL name why" or
# "SKIP name why" per pytest test, the name being the test's function and
# parameters (test_put_get_roundtrip, test_decoder_matches_torch_cache[f32-get]).
# Usage: tests/pytest.sh BUILD_DIR [--list | NAME...]
# The extension comes from BUILD_DIR/python (the Makefile builds it there in
# the optimized build only); the daemon the tests start is BUILD_DIR/kvcached.
build="$1"; shift
py=/usr/bin/python3
src="${KVC_SRCDIR:-$(pwd)}"
export KVC_BUILD="$build" KVC_SRCDIR="$src" PYTHONPATH="$build/python" PYTHONDONTWRITEBYTECODE=1
if [ "$1" = "--list" ]; then
  $py -m pytest "$src/client/python/tests" -q --collect-only -p no:cacheprovider 2>/dev/null |
    sed -n 's/^.*::\([^ ]*\)$/\1/p'
  exit 0
fi
# Names select by their function (-k takes no brackets); the lines printed
# are then those of the names asked for.
sel=""
for n in "$@"; do sel="$sel${sel:+ or }${n%%\[*}"; done
log=$(mktemp); trap 'rm -f "$log" "$log.v"' EXIT
# -rA: one summary line per test (PASSED/FAILED/ERROR/SKIPPED file::name - why).
COLUMNS=250 $py -m pytest "$src/client/python/tests" -q -rA -p no:cacheprovider \
  ${sel:+-k "$sel"} > "$log" 2>&1
rc=$?
sed -n -e 's/^PASSED [^:]*::\([^ ]*\).*$/PASS \1/p' \
  -e 's/^FAILED [^:]*::\([^ ]*\)\( - \)\{0,1\}\(.*\)$/FAIL \1 \3/p' \
  -e 's/^ERROR [^:]*::\([^ ]*\)\( - \)\{0,1\}\(.*\)$/FAIL \1 (error) \3/p' \
  -e 's/^SKIPPED \[[0-9]*\] [^:]*:[0-9]*: \(.*\)$/SKIP python \1/p' "$log" > "$log.v"
if [ $# -gt 0 ]; then
  for n in "$@"; do awk -v n="$n" '$2 == n' "$log.v"; done
else
  cat "$log.v"
fi
if [ $rc -ne 0 ] && [ $rc -ne 5 ]; then
  grep -q '^\(FAILED\|ERROR\) ' "$log" || echo "FAIL pytest (exit $rc)"
  # The failures' details go to stderr, whose tail run.sh shows.
  sed -n '/^=* \(FAILURES\|ERRORS\) =*$/,/^=* short test summary/p' "$log" | tail -60 >&2
fi
exit 0
