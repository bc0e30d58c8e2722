#!/usr/bin/env bash
# The whole test suite: the README's test command, and what CI runs.
# On a fresh Debian 12 machine (root) it installs what it needs (apt and pip
# packages, the real lmcache package), builds fx100io, boots the fabric lab
# (the Linux NVMe-oF target in a QEMU guest, inside a network namespace this
# script makes), runs pytest inside that namespace, stops the lab, and then
# runs the core suite again against an ASan+UBSan build (and the RDMA tests
# under it, in the lab guest), runs each fuzzer for
# 30 s (FUZZ_SECONDS), then ruff and mypy.
# Extra arguments go to pytest (e.g. tools/test.sh -k store).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
# each phase's start in the log, with the seconds spent so far (the whole run
# must stay under 45 minutes: this says where they go)
phase() { echo "== tools/test.sh: $1 (at ${SECONDS}s)"; }

tools/setup.sh
# Peers the tests talk to or decode with: tshark (an independent NVMe/TCP
# dissector), iperf3 (benchmarks), matplotlib (bench --plot), ruff/mypy,
# clang-format (the C house style).
need=()
for p in tshark iperf3 clang-format; do dpkg -s "$p" >/dev/null 2>&1 || need+=("$p"); done
if [ ${#need[@]} -gt 0 ]; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
"$PY" -m pip install --quiet --disable-pip-version-check matplotlib ruff mypy hypothesis
tools/install_lmcache.sh "$PY"
# The real sglang package in a venv of its own (tests/contrib/test_sglang.py).
tools/install_sglang.sh "$PY" >/dev/null
# vllm 0.33.0's tiering modules in a venv of their own (its torch pin is a CUDA build).
# Exit 3: vllm could not be downloaded (offline); tests/contrib/test_vllm_tier.py then skips, saying so.
rc=0; tools/install_vllm.sh "$PY" >/dev/null || rc=$?
[ "$rc" = 0 ] || [ "$rc" = 3 ] || exit "$rc"

# tests/c programs that tests run against live targets (tests/guest runs
# rdma_connect_check in the lab guest, where the checkout is read-only).
make -C tests/c -s all

# (Checked here, after the installs above, which fill the same disk.)
# The suite writes device images of up to a few GB at a time (pytest keeps only
# failed tests' tmp_path, see pyproject.toml); stop at once, saying why, rather
# than fail half an hour in with ENOSPC.
tmp_dir="${TMPDIR:-/tmp}"
free_kib=$(df -Pk "$tmp_dir" | awk 'NR==2 {print $(NF-2)}')
if [ -n "$free_kib" ] && [ "$free_kib" -lt $((6 * 1024 * 1024)) ]; then
  echo "tools/test.sh: only $((free_kib / 1024)) MiB free under $tmp_dir; the suite needs 6 GiB" >&2
  exit 1
fi

# `run` starts the lab if it is not running, runs the command in the lab's
# network namespace (loopback is up there too), and stops what it started.
# (The hostile NVMe/RDMA peer's module, minutes in the guest under TCG, runs
# once: under ASan+UBSan below, where a key's misuse would show first.)
phase "the suite, in the lab"
"$PY" tools/fabric_lab/lab.py run --rdma -- "$PY" -m pytest -q -ra --durations=25 tests \
  --ignore=tests/guest/test_rdma_command_keys.py "$@"

phase "the ASan+UBSan suite"
tools/asan_suite.sh
# The NVMe/RDMA tests (tests/guest) under ASan+UBSan too, in the lab guest.
phase "the ASan+UBSan guest tests"
tools/asan_guest.sh

# Coverage-guided fuzzers (tests/fuzz: index segments, discovery log, target
# string, the initiator's and the target's PDU receive paths, the initiator's
# DH-HMAC-CHAP exchange, the TLS record layer), 30 s each, one per CPU at a time, so the whole run
# stays well under 45 minutes; the long runs are `make fuzz FUZZ_SECONDS=600`.
# tools/fuzz.sh installs clang 14 + libFuzzer if missing.
phase "the fuzzers"
tools/fuzz.sh "${FUZZ_SECONDS:-30}"

# House style (docs/architecture.md rule 12): lint and type-check the Python,
# and the C as .clang-format says.
phase "lint and types"
"$PY" -m ruff check .
"$PY" -m mypy fx100io
tools/check_c_format.sh
phase "done"
