#!/usr/bin/env bash
# run.sh SECONDS NAME...: run each built fuzzer build/fuzz_NAME for SECONDS,
# FUZZ_JOBS at once (default: the CPUs), and print a summary (executions, exec/s, corpus).
# Seeds come from corpus/NAME/ (read only); what the fuzzer finds goes to
# build/corpus/NAME/, crash inputs to build/crashes/NAME/, the full log to
# build/log/NAME.log.  Exit status 1 if any fuzzer crashed or failed.
# Called by `make -C tests/fuzz run`.
set -uo pipefail
cd "$(dirname "$0")"
secs=${1:?usage: run.sh SECONDS NAME...}
shift
B=build
mkdir -p "$B/log"
# FUZZ_JOBS fuzzers at once (default: one per CPU): each is one process
jobs=${FUZZ_JOBS:-$(nproc)}
case $jobs in
  '' | *[!0-9]* | 0*) echo "run.sh: FUZZ_JOBS must be a positive integer, got '$jobs'" >&2; exit 2 ;;
esac

run_one() {
  local name=$1 bin=$B/fuzz_$1 out=$B/corpus/$1 crashes=$B/crashes/$1 log=$B/log/$1.log
  mkdir -p "$out" "$crashes"
  local dirs=("$out")
  [ -d "corpus/$name" ] && dirs+=("corpus/$name")
  # per-harness options from a /* fuzz-options: ... */ line
  local opts
  read -r -a opts <<<"$(sed -n 's|.*fuzz-options:\(.*\)\*/.*|\1|p' "fuzz_$name.c")"
  # -timeout: one input running 10 s is a hang, reported like a crash.
  # The outer timeout only guards against a fuzzer that never stops.
  timeout --kill-after=30 $((secs + 300)) "$bin" -max_total_time="$secs" -print_final_stats=1 \
    -timeout=10 -artifact_prefix="$crashes/" "${opts[@]}" "${dirs[@]}" >"$log" 2>&1
  echo $? >"$B/log/$name.rc"
}

for name in "$@"; do
  while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || true; done
  echo "== fuzz_$name: ${secs}s (log: tests/fuzz/$B/log/$name.log)"
  rm -f "$B/log/$name.rc"
  run_one "$name" &
done
wait

failed=0
rows=()
for name in "$@"; do
  out=$B/corpus/$name
  crashes=$B/crashes/$name
  log=$B/log/$name.log
  rc=$(cat "$B/log/$name.rc" 2>/dev/null || echo 99)
  stat() { sed -n "s/^stat::$1: *//p" "$log" | tail -1; }
  units=$(stat number_of_executed_units)
  eps=$(stat average_exec_per_sec)
  corp=$(find "$out" -type f | wc -l)
  seeds=0
  [ -d "corpus/$name" ] && seeds=$(find "corpus/$name" -type f | wc -l)
  if [ $rc -eq 0 ]; then
    result=ok
  else
    failed=1
    result="FAILED rc=$rc"
    echo "-- fuzz_$name failed; the end of its log:"
    # the report: from the first error line, and where the input went
    awk '/ERROR|^fuzz_|deadly signal|timeout after/ && !n {n=1} n && c++ < 40' "$log"
    ls -1 "$crashes" | sed "s|^|   crash input: tests/fuzz/$crashes/|"
  fi
  rows+=("$(printf '%-14s %6s %12s %8s %6s %6s  %s' "$name" "$secs" "${units:-?}" \
    "${eps:-?}" "$seeds" "$corp" "$result")")
done
echo
printf '%-14s %6s %12s %8s %6s %6s  %s\n' fuzzer seconds executions exec/s seeds found result
for r in "${rows[@]}"; do echo "$r"; done
exit $failed
