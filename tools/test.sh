#!/usr/bin/env bash
# The whole test suite: the README's test command, and what CI runs.
# On a fresh Debian 12 machine (root) it installs what it needs (apt and pip
# packages, the real lmcache package), builds fx100io, boots the fabric lab
# (the Linux NVMe-oF target in a QEMU guest, inside a network namespace this
# script makes), runs pytest inside that namespace, stops the lab, and then
# runs the core suite again against an ASan+UBSan build.
# Extra arguments go to pytest (e.g. tools/test.sh -k store).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"

tools/setup.sh
tools/install_lmcache.sh "$PY"

# `run` starts the lab if it is not running, runs the command in the lab's
# network namespace (loopback is up there too), and stops what it started.
"$PY" tools/fabric_lab/lab.py run -- "$PY" -m pytest -q -ra tests "$@"

tools/asan_suite.sh
