#!/usr/bin/env bash
# Builds the virtual environment in which the SGLang HiCache backend is tested and
# benchmarked: the real sglang package, without its dependencies, plus the three modules
# that sglang.srt.mem_cache.hicache_storage and its backend factory import (pybase64,
# triton, starlette). See docs/sglang.md.
#
# Why a venv of its own: sglang pins CUDA builds of torch and dozens of packages; installed
# with them it would replace what the rest of the suite runs on. The venv sees the system
# site-packages (CPU torch, numpy, as tools/install_lmcache.sh leaves them) so that it
# costs no second torch; everything installed here goes into the venv only, --no-deps, so
# nothing in the main environment changes. Where the system has no torch, the CPU wheel
# is installed into the venv.
#
# fx100io itself is not installed: tests run the venv's python with the checkout on
# PYTHONPATH (its C extension is built for the same python3 that made the venv).
#
# Idempotent: when the venv already imports everything it only checks that.
# Usage: tools/install_sglang.sh [python]   (default: python3); prints the venv's python.
set -euo pipefail

PY="${1:-${PYTHON:-python3}}"
VENV="${FX100IO_SGLANG_VENV:-/var/cache/fx100io/venv-sglang}"
SGLANG_VERSION="0.5.23"
TORCH_VERSION="2.13.0"
VPY="$VENV/bin/python"

import_ok() {
  "$VPY" - "$SGLANG_VERSION" <<'PYEOF' >/dev/null 2>&1
import sys
from importlib.metadata import version
assert version("sglang") == sys.argv[1]
import torch  # noqa: F401
from sglang.srt.mem_cache.hicache_storage import HiCacheFile, HiCacheStorage  # noqa: F401
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory  # noqa: F401
PYEOF
}

# What the venv was checked with: the stamp lets a later call skip the import check
# (importing sglang and triton takes 10 to 20 s) while nothing it depends on changed.
# It holds the WANTED versions and the python (so changing SGLANG_VERSION or the python
# misses it) beside what is installed (so a package changed under it misses too).
STAMP="$VENV/.fx100io-ready"
stamp_key() {
  "$VPY" - "$SGLANG_VERSION" "$TORCH_VERSION" <<'PYEOF' 2>/dev/null
import sys
from importlib.metadata import version
print("want", *sys.argv[1:], sys.version,
      *(f"{d}={version(d)}" for d in
        ("sglang", "torch", "numpy", "pybase64", "triton", "starlette")))
PYEOF
}
same_python() {
  [ "$("$VPY" -c 'import sys; print(sys.version_info[:3])' 2>/dev/null)" \
    = "$("$PY" -c 'import sys; print(sys.version_info[:3])')" ]
}

# A venv made by another python (or half made) is rebuilt: checked before the fast path
if [ -e "$VENV" ] && ! same_python; then
  rm -rf "$VENV"
fi
if [ -x "$VPY" ] && [ -f "$STAMP" ] && [ "$(stamp_key)" = "$(cat "$STAMP")" ]; then
  echo "$VPY"
  exit 0
fi
if [ -x "$VPY" ] && import_ok; then
  stamp_key >"$STAMP"
  echo "install_sglang: sglang ${SGLANG_VERSION} ready in $VENV" >&2
  echo "$VPY"
  exit 0
fi
rm -f "$STAMP"

mkdir -p "$(dirname "$VENV")"
[ -x "$VPY" ] || "$PY" -m venv --system-site-packages "$VENV"

pip_install() {  # pip's own exit status is the function's; only its noise is filtered
  local log rc=0
  log="$(mktemp)"
  "$VPY" -m pip install --quiet --disable-pip-version-check --root-user-action=ignore \
    --no-deps "$@" >"$log" 2>&1 || rc=$?
  grep -v "is ignored: it is neither a file nor a directory" "$log" >&2 || true
  rm -f "$log"
  return "$rc"
}

if ! "$VPY" -c 'import torch' >/dev/null 2>&1; then
  # the CPU wheel (the default index's torch is the CUDA build): the local wheel
  # directory (pip.conf find-links) has it, else PyTorch's CPU index
  pip_install --extra-index-url https://download.pytorch.org/whl/cpu "torch==${TORCH_VERSION}+cpu"
fi
pip_install "sglang==${SGLANG_VERSION}" pybase64 triton starlette

if ! import_ok; then
  echo "install_sglang: sglang's storage modules still do not import:" >&2
  "$VPY" -c 'import sglang.srt.mem_cache.storage.backend_factory' >&2 || true
  exit 1
fi
stamp_key >"$STAMP"
echo "install_sglang: sglang ${SGLANG_VERSION} installed in $VENV" >&2
echo "$VPY"
