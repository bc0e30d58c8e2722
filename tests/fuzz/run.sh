#!/usr/bin/env bash
# run.sh SECONDS NAME...: run each built fuzzer build/fuzz_NAME for SECONDS,
# one after the other, and print a summary (executions, exec/s, corpus).
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
failed=0
rows=()
for name in "$@"; do
  bin=$B/fuzz_$name
  out=$B/corpus/$name
  crashes=$B/crashes/$name
  log=$B/log/$name.log
  mkdir -p "$out" "$crashes"
  dirs=("$out")
  [ -d "corpus/$name" ] && dirs+=("corpus/$name")
  # per-harness options from a /* fuzz-options: ... */ line
  read -r -a opts <<<"$(sed -n 's|.*fuzz-options:\(.*\)\*/.*|\1|p' "fuzz_$name.c")"
  echo "== fuzz_$name: ${secs}s (log: tests/fuzz/$log)"
  # -timeout: one input running 10 s is a hang, reported like a crash.
  # The outer timeout only guards against a fuzzer that never stops.
  timeout --kill-after=30 $((secs + 300)) "$bin" -max_total_time="$secs" -print_final_stats=1 \
    -timeout=10 -artifact_prefix="$crashes/" "${opts[@]}" "${dirs[@]}" >"$log" 2>&1
  rc=$?
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
