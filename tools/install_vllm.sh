#!/usr/bin/env bash
# Builds the virtual environment in which the fx100io vLLM tier is tested and benchmarked
# against the real vllm package: /var/cache/fx100io/venv-vllm (FX100IO_VLLM_VENV overrides).
#
# Why a venv of its own: vllm 0.33.0 pins a CUDA build of torch 2.14.0 and about eighty
# packages (CUDA kernels, servers) that neither fit nor work on a CPU-only machine, and that
# would break the packages the rest of the suite uses. The tiering contract (its
# SecondaryTierFactory, the TieringOffloadingSpec, the built-in fs tier) is plain Python, so
# the venv holds: the CPU torch wheel, vllm and xgrammar without their dependencies, and the
# modules that importing vllm's kv_offload/tiering package really needs.
#
# Idempotent: a venv that already imports the tiering modules at the pinned versions is left
# alone (a few seconds). The wheels are kept in /var/cache/fx100io/wheels.
# Usage: tools/install_vllm.sh [python]   (default: python3; the venv uses that interpreter)
set -euo pipefail

PY="${1:-${PYTHON:-python3}}"
VENV="${FX100IO_VLLM_VENV:-/var/cache/fx100io/venv-vllm}"
WHEELS=/var/cache/fx100io/wheels
VLLM_VERSION="0.33.0"
XGRAMMAR_VERSION="0.2.8"
TORCH_VERSION="2.13.0"

# What `import vllm.v1.kv_offload.tiering...` needs at import time (vllm's own list names
# many more: GPU kernels, servers, tokenizers we never load).
DEPS=(
  numpy regex requests packaging msgspec psutil pyzmq cbor2 aiohttp openai openai-harmony
  pillow pybase64 cachetools cloudpickle uvloop py-cpuinfo prometheus_client
  "apache-tvm-ffi==0.1.11" "transformers>=5.16.1,<5.21.0" fastapi partial-json-parser
  "llguidance>=1.7.0,<1.8.0" pyyaml
)

IMPORTS='import vllm, torch
from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory
from vllm.v1.kv_offload.tiering.fs.manager import FileSystemTierManager
from vllm.v1.kv_offload.tiering.base import SecondaryTierManager
assert vllm.__version__.startswith("'"$VLLM_VERSION"'"), vllm.__version__'

import_ok() { [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "$IMPORTS" >/dev/null 2>&1; }

# Importing vllm takes 10 to 40 s here, so a stamp records what the venv was last checked
# with; while none of that changed, a repeat call only compares it (under a second).
STAMP="$VENV/.fx100io-ready"
stamp_key() {
  "$VENV/bin/python" - <<'PYEOF' 2>/dev/null
import sys
from importlib.metadata import version
print(sys.version, *(f"{d}={version(d)}" for d in ("vllm", "xgrammar", "torch", "numpy",
                                                     "transformers")))
PYEOF
}

# The tests run the checkout's compiled core inside this venv: same interpreter version.
if [ -x "$VENV/bin/python" ] && [ "$("$VENV/bin/python" -c 'import sys; print(sys.version_info[:2])')" \
     != "$("$PY" -c 'import sys; print(sys.version_info[:2])')" ]; then
  echo "install_vllm: ${VENV} was made by another python version; rebuilding it" >&2
  rm -rf "$VENV"
fi
if [ -x "$VENV/bin/python" ] && [ -f "$STAMP" ] && [ "$(stamp_key)" = "$(cat "$STAMP")" ]; then
  echo "install_vllm: vllm ${VLLM_VERSION} ready in ${VENV} (checked before)"
  exit 0
fi
if import_ok; then
  stamp_key >"$STAMP"
  echo "install_vllm: vllm ${VLLM_VERSION} tiering modules already import in ${VENV}"
  exit 0
fi
rm -f "$STAMP"

pip_q() {  # quiet pip in the venv; the lines about vllm's skipped dependencies are expected
  local log
  log="$(mktemp)"
  if ! "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --root-user-action=ignore "$@" >"$log" 2>&1; then
    cat "$log" >&2
    rm -f "$log"
    return 1
  fi
  grep -v -e "^vllm [0-9.]* requires " -e "^xgrammar [0-9.]* requires " \
    -e "dependency resolver does not currently" -e "^WARNING: Location " "$log" >&2 || true
  rm -f "$log"
}

mkdir -p "$WHEELS"
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
# The CPU torch wheel comes from the machine's local wheel directory (pip's find-links); the
# constraint keeps every later step from swapping it for a CUDA build.
CONSTRAINTS="$(mktemp)"
trap 'rm -f "$CONSTRAINTS"' EXIT
printf 'torch==%s\n' "$TORCH_VERSION" >"$CONSTRAINTS"
pip_q -c "$CONSTRAINTS" "torch==${TORCH_VERSION}"
if ! ls "$WHEELS"/vllm-"$VLLM_VERSION"-*.whl >/dev/null 2>&1 \
   || ! ls "$WHEELS"/xgrammar-"$XGRAMMAR_VERSION"-*.whl >/dev/null 2>&1; then
  "$VENV/bin/python" -m pip download --quiet --disable-pip-version-check --no-deps \
    -d "$WHEELS" "vllm==${VLLM_VERSION}" "xgrammar==${XGRAMMAR_VERSION}"
fi
pip_q --no-deps "$WHEELS"/vllm-"$VLLM_VERSION"-*.whl "$WHEELS"/xgrammar-"$XGRAMMAR_VERSION"-*.whl
pip_q -c "$CONSTRAINTS" "${DEPS[@]}"

if ! import_ok; then
  echo "install_vllm: the vllm tiering modules still do not import:" >&2
  "$VENV/bin/python" -c "$IMPORTS" >&2 || true
  exit 1
fi
stamp_key >"$STAMP"
echo "install_vllm: vllm ${VLLM_VERSION} with torch ${TORCH_VERSION} ready in ${VENV}"
