#!/usr/bin/env bash
# tools/fuzz.sh [SECONDS] [NAME...]: the coverage-guided fuzzers
# (tests/fuzz/fuzz_*.c, libFuzzer + ASan + UBSan), each for SECONDS
# (default 60), one after the other; fails if any crashes.  Installs
# Debian 12's clang 14 and its libFuzzer runtime if missing (idempotent, as
# tools/setup.sh).  `make fuzz FUZZ_SECONDS=N` runs this.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-60}
shift || true

need=()
for p in clang libclang-rt-14-dev liburing-dev libssl-dev make; do
  dpkg -s "$p" >/dev/null 2>&1 || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
  echo "fuzz: apt-get install ${need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi

if [ $# -gt 0 ]; then
  exec make -s -j"$(nproc)" -C tests/fuzz run FUZZ_SECONDS="$secs" FUZZERS="$*"
fi
exec make -s -j"$(nproc)" -C tests/fuzz run FUZZ_SECONDS="$secs"
