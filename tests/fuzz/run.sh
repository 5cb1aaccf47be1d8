#!/bin/sh
# run.sh: runs each libFuzzer target for a fixed time and prints its figures.
# Usage: tests/fuzz/run.sh BUILD_DIR SECONDS TARGET...
# Each target starts from the checked-in seeds and regression inputs; what it
# finds goes to BUILD_DIR/corpus/TARGET (kept between runs, never committed),
# crashes to BUILD_DIR/artifacts/. The last line per target is libFuzzer's
# final count: executions, coverage (cov: edges) and features (ft:).
b="$1"; secs="$2"; shift 2
status=0
summary=""
for t in "$@"; do
  mkdir -p "$b/corpus/$t" "$b/artifacts" "tests/fuzz/regress/$t"
  log="$b/fuzz-$t.log"
  echo "== fuzz $t for ${secs}s (log $log)"
  ASAN_OPTIONS="detect_leaks=1:abort_on_error=1" UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1" \
  "$b/fuzz/$t" -max_total_time="$secs" -print_final_stats=1 -max_len=8192 \
      -artifact_prefix="$b/artifacts/$t-" -timeout=10 -rss_limit_mb=2048 \
      "$b/corpus/$t" "tests/fuzz/corpus/$t" "tests/fuzz/regress/$t" > "$log" 2>&1
  rc=$?
  done_line=$(grep -E '^#[0-9]+ +DONE' "$log" | tail -1)
  [ -n "$done_line" ] || done_line=$(grep -E '^#[0-9]+' "$log" | tail -1)
  execs=$(grep -E '^stat::number_of_executed_units' "$log" | awk '{print $2}')
  line="$t: rc=$rc executions=${execs:-?} $(echo "$done_line" | grep -oE 'cov: [0-9]+ ft: [0-9]+ corp: [0-9]+/[0-9a-zA-Z]+' ) $(echo "$done_line" | grep -oE 'exec/s: [0-9]+')"
  echo "$line"
  summary="$summary$line
"
  if [ $rc -ne 0 ]; then
    status=1
    grep -E 'ERROR|invariant|SUMMARY|Test unit written' "$log" | head -20
  fi
done
echo "== fuzz summary"
printf '%s' "$summary"
exit $status
