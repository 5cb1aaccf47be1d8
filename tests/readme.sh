#!/bin/sh
# readme.sh: the README as printed, as a test program of tests/run.sh. Every
# command block of README.md, then of doc/worker-guide.md, runs in order,
# twice (the second run finds what the first left, as a user trying again
# does), against one kvcached, in a copy of the files git tracks (what a
# fresh clone holds) with the build under test copied in as its build/ (so
# `make` finds it up to date, as it would after the README's own make).
#
#   ```sh       each block runs with sh -e from the top of the copy, stdin
#               /dev/null (an interpreter it starts reads nothing and exits)
#   ```python   typed into the interpreter the README starts
#               (PYTHONPATH=build/python /usr/bin/python3), as pasted: no
#               traceback, and no value echoed that print() did not ask for
#   others      (```c, a listing) are not commands
#
# An HTML comment right before a block (blank lines between allowed) says
# what the test does with it:
#   <!-- readme-test: skip REASON -->   not run: printed as SKIP with REASON
#                                       (root, systemd, the network)
#   <!-- readme-test: daemon -->        one command ending in &: the daemon
#                                       of both runs, started first (standing
#                                       in for make run's too), waited for
#                                       until it says it listens, stopped at
#                                       the end (it must exit 0)
#
# The environment is a user's, kept apart: HOME and XDG_RUNTIME_DIR are new
# directories, KVCACHED_SOCKET names a socket in the latter (the variable
# kvcached and every client read, so both sides' defaults are that path),
# PATH starts with the copy's build/ (where make install would put kvcached
# and kvcachectl), pip may not reach an index (none is reachable offline).
# Also checks that make run fetches no promtool (only the tests need it).
#
# Usage: tests/readme.sh BUILD_DIR [--list | NAME...]
build="$1"; shift
src="${KVC_SRCDIR:-$(pwd)}"
if [ "$1" = "--list" ]; then
  printf '%s\n' readme_first_run readme_second_run readme_make_run_fetches_no_promtool
  exit 0
fi
want="$*"
verdict() { # verdict PASS|FAIL|SKIP name [why]: printed if asked for
  if [ -z "$want" ] || printf ' %s ' "$want" | grep -q " $2 "; then echo "$*"; fi
}

work=$(mktemp -d /tmp/kvcreadme-XXXXXX)
daemon_pid=""
cleanup() {
  if [ -n "$daemon_pid" ] && kill -0 "$daemon_pid" 2>/dev/null; then
    kill -TERM "$daemon_pid" 2>/dev/null
    wait "$daemon_pid" 2>/dev/null
  fi
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---- the copy: the tracked files, the build under test as its build/ ----
copy="$work/kvcached"
mkdir -p "$copy" "$work/home" "$work/run" "$work/blocks"
chmod 700 "$work/run"
if ! git -C "$src" ls-files -z >"$work/files" 2>"$work/git.err"; then
  verdict FAIL readme_first_run "$src is no git checkout: $(head -1 "$work/git.err")"
  exit 0
fi
(cd "$src" && tar --null -T "$work/files" --ignore-failed-read -cf - 2>/dev/null) |
  tar -xf - -C "$copy"
case "$build" in /*) ;; *) build="$src/$build" ;; esac
cp -a "$build" "$copy/build"

# ---- the blocks, with their markers ----------------------------------------
# One line each in the index: N LANG FILE:LINE MARK [REASON], the text of
# block N in $work/blocks/N.
for doc in README.md doc/worker-guide.md; do
  if ! awk -v doc="$doc" -v dir="$work/blocks" -v start="$(ls "$work/blocks" | wc -l)" \
       -f "$src/tests/readme.awk" "$copy/$doc" >>"$work/index" 2>"$work/awk.err"; then
    verdict FAIL readme_first_run "$(cat "$work/awk.err")"
    exit 0
  fi
done

# The user's environment, apart from this machine's.
unset MAKEFLAGS MFLAGS MAKELEVEL KVC_BUILD KVC_SRCDIR PYTHONPATH
export HOME="$work/home" XDG_RUNTIME_DIR="$work/run" KVCACHED_SOCKET="$work/run/kvcached.sock"
export PATH="$copy/build:$PATH" PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1
export PYTHONDONTWRITEBYTECODE=1

# ---- make run fetches no promtool ------------------------------------------
if (cd "$copy" && make -n run) >"$work/make-run" 2>&1 &&
   ! grep -q -i 'prometheus\|promtool' "$work/make-run" &&
   (cd "$copy" && make -n test-deps) 2>&1 | grep -q 'apt-get download prometheus'; then
  verdict PASS readme_make_run_fetches_no_promtool
else
  verdict FAIL readme_make_run_fetches_no_promtool "make -n run mentions promtool, or make -n test-deps does not fetch it"
  sed 's/^/make -n run: /' "$work/make-run" | grep -i 'prometheus\|promtool' | head -5 >&2
fi

# ---- the daemon: the block marked daemon, started once ---------------------
dline=$(awk '$4 == "daemon" { print; exit }' "$work/index")
if [ -z "$dline" ]; then
  verdict FAIL readme_first_run "README.md has no block marked <!-- readme-test: daemon -->"
  exit 0
fi
set -- $dline
cmd=$(sed -e 's/[[:space:]]#.*$//' -e 's/[[:space:]]*&[[:space:]]*$//' "$work/blocks/$1")
if [ "$(printf '%s\n' "$cmd" | grep -c .)" -ne 1 ] || ! grep -q '&[[:space:]]*\(#.*\)\{0,1\}$' "$work/blocks/$1"; then
  verdict FAIL readme_first_run "$3: a daemon block is one command ending in &"
  exit 0
fi
(cd "$copy" && exec sh -c "exec $cmd" </dev/null >"$work/daemon.out" 2>"$work/daemon.log") &
daemon_pid=$!
# Ready when it says it listens (after READY=1); a deadline, not a pace.
waited=0
until grep -q ' listening on ' "$work/daemon.out" 2>/dev/null; do
  if ! kill -0 "$daemon_pid" 2>/dev/null || [ $waited -ge 1200 ]; then
    verdict FAIL readme_first_run "$3: '$cmd' did not start listening"
    tail -20 "$work/daemon.log" >&2
    exit 0
  fi
  sleep 0.05
  waited=$((waited + 1))
done

# ---- the runs ----------------------------------------------------------------
# Runs block N (lang, where): 0, or 1 with why on stderr.
run_block() {
  n="$1"; lang="$2"; where="$3"; out="$work/out.$n"
  if [ "$lang" = sh ]; then
    (cd "$copy" && timeout 300 sh -e "$work/blocks/$n") </dev/null >"$out" 2>&1 && return 0
    echo "$where: sh block failed (exit $?):" >&2
    sed 's/^/    /' "$work/blocks/$n" >&2
    tail -20 "$out" | sed 's/^/  | /' >&2
    return 1
  fi
  # Python, as pasted into the interpreter: a display hook reports what the
  # prompt would echo (a value no print() asked for).
  { printf '%s\n' 'import sys' \
      'sys.displayhook = lambda v: v is None or sys.stderr.write("README-ECHO %s\n" % type(v).__name__)' ''
    cat "$work/blocks/$n"; printf '\n\n'; } >"$work/in.$n"
  (cd "$copy" && PYTHONPATH=build/python timeout 300 /usr/bin/python3 -i \
     <"$work/in.$n") >"$out" 2>"$out.err"
  rc=$?
  if [ $rc -eq 0 ] && ! grep -q -e 'Traceback (most recent' -e 'Error: ' -e 'README-ECHO' "$out.err"; then
    return 0
  fi
  if grep -q 'README-ECHO' "$out.err"; then
    echo "$where: pasted into the interpreter, the block echoes a value no print() asked for:" \
      "$(grep -o 'README-ECHO [A-Za-z_]*' "$out.err" | sed 's/README-ECHO //' | tr '\n' ' ')" >&2
  else
    echo "$where: python block failed (exit $rc):" >&2
    grep -v '^\(>>>\|\.\.\.\) *$' "$out.err" | sed 's/>>> //g; s/\.\.\. //g' | tail -20 | sed 's/^/  | /' >&2
  fi
  return 1
}

for run in first second; do
  failed=""
  while read -r n lang where mark reason; do
    case "$mark" in
      daemon) continue ;;
      skip)
        [ $run = first ] && verdict SKIP "readme_block" "$where: $reason"
        continue ;;
      run) ;;
      *) echo "$where: unknown marker '$mark $reason'" >&2; failed="$failed $where"; continue ;;
    esac
    run_block "$n" "$lang" "$where" || failed="$failed $where"
  done <"$work/index"
  if [ -n "$failed" ]; then
    verdict FAIL "readme_${run}_run" "blocks that did not work as printed:$failed"
  else
    verdict PASS "readme_${run}_run"
  fi
done

# The daemon of both runs stops cleanly.
kill -TERM "$daemon_pid" 2>/dev/null
wait "$daemon_pid"
rc=$?
daemon_pid=""
if [ $rc -ne 0 ]; then
  echo "the README's daemon exited $rc at SIGTERM:" >&2
  tail -20 "$work/daemon.log" >&2
  verdict FAIL readme_second_run "the README's daemon exited $rc at SIGTERM"
fi
exit 0
