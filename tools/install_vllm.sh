#!/usr/bin/env bash
# Builds the virtual environment in which the fx100io vLLM tier is tested and benchmarked
# against the real vllm package: /var/cache/fx100io/venv-vllm (FX100IO_VLLM_VENV overrides).
#
# Why a venv of its own: vllm 0.33.0 pins a CUDA build of torch and about eighty
# packages (CUDA kernels, servers) that neither fit nor work on a CPU-only machine, and that
# would break the packages the rest of the suite uses. The tiering contract (its
# SecondaryTierFactory, the TieringOffloadingSpec, the built-in fs tier) is plain Python, so
# the venv holds: the CPU build of torch ${TORCH_VERSION} (below), vllm and xgrammar without
# their dependencies, and the modules that importing vllm's kv_offload/tiering package needs.
#
# Where the CPU torch wheel comes from, explicitly: a local wheel directory when it holds
# one (FX100IO_TORCH_WHEELS, default /opt/wheels), else PyTorch's CPU index
# (FX100IO_TORCH_INDEX, default https://download.pytorch.org/whl/cpu).
#
# Idempotent: a venv that already imports the tiering modules at the pinned versions is left
# alone (a few seconds). The wheels are kept in /var/cache/fx100io/wheels.
# Exit status: 0 ready; 1 broken; 3 could not download (offline machine: the caller decides
# whether the vLLM tests are skipped). FX100IO_VLLM_CHECK_ONLY=1 installs nothing and
# exits 1 when the venv is not ready.
# Usage: tools/install_vllm.sh [python]   (default: python3; the venv uses that interpreter)
set -euo pipefail

PY="${1:-${PYTHON:-python3}}"
VENV="${FX100IO_VLLM_VENV:-/var/cache/fx100io/venv-vllm}"
WHEELS=/var/cache/fx100io/wheels
VLLM_VERSION="0.33.0"
XGRAMMAR_VERSION="0.2.8"
TORCH_VERSION="2.13.0"
TORCH_WHEELS="${FX100IO_TORCH_WHEELS:-/opt/wheels}"
TORCH_INDEX="${FX100IO_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}"
CHECK_ONLY="${FX100IO_VLLM_CHECK_ONLY:-0}"

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
assert vllm.__version__ == "'"$VLLM_VERSION"'", vllm.__version__
assert torch.__version__.split("+")[0] == "'"$TORCH_VERSION"'", torch.__version__'

import_ok() { [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "$IMPORTS" >/dev/null 2>&1; }

# Importing vllm takes 10 to 40 s here, so a stamp records what the venv was last checked
# with; while none of that changed, a repeat call only compares it (under a second).
# The stamp holds what this script wants (versions, the list of dependencies, the imports)
# and what is installed; it fails (no key) when an installed version is not the wanted one.
STAMP="$VENV/.fx100io-ready"
WANTED="vllm=${VLLM_VERSION} xgrammar=${XGRAMMAR_VERSION} torch=${TORCH_VERSION} deps=$(
  printf '%s\n' "${DEPS[@]}" "$IMPORTS" | sha256sum | cut -c1-16)"
stamp_key() {
  "$VENV/bin/python" - "$VLLM_VERSION" "$XGRAMMAR_VERSION" "$TORCH_VERSION" <<'PYEOF' 2>/dev/null
import sys
from importlib.metadata import version
want = dict(zip(("vllm", "xgrammar", "torch"), sys.argv[1:4]))
for dist, v in want.items():
    if version(dist).split("+")[0] != v:
        sys.exit(1)
print(sys.version, *(f"{d}={version(d)}" for d in ("vllm", "xgrammar", "torch", "numpy",
                                                     "transformers")))
PYEOF
}
write_stamp() {  # only a complete key: a failing check leaves no stamp, never an empty one
  local key
  if key="$(stamp_key)" && [ -n "$key" ]; then
    printf '%s %s\n' "$WANTED" "$key" >"$STAMP"
  else
    rm -f "$STAMP"
  fi
}
stamp_ok() {
  local key
  [ -x "$VENV/bin/python" ] && [ -f "$STAMP" ] && key="$(stamp_key)" \
    && [ "$WANTED $key" = "$(cat "$STAMP")" ]
}

# The tests run the checkout's compiled core inside this venv: same interpreter version.
if [ -x "$VENV/bin/python" ] && [ "$("$VENV/bin/python" -c 'import sys; print(sys.version_info[:2])')" \
     != "$("$PY" -c 'import sys; print(sys.version_info[:2])')" ]; then
  if [ "$CHECK_ONLY" = 1 ]; then
    echo "install_vllm: ${VENV} was made by another python version" >&2
    exit 1
  fi
  echo "install_vllm: ${VENV} was made by another python version; rebuilding it" >&2
  rm -rf "$VENV"
fi
if stamp_ok; then
  echo "install_vllm: vllm ${VLLM_VERSION} ready in ${VENV} (checked before)"
  exit 0
fi
# No stamp yet (a venv made by hand or by an older script): adopt it if it imports at the
# wanted versions. A stamp that differs means this script changed: install again.
if [ ! -f "$STAMP" ] && import_ok; then
  write_stamp
  echo "install_vllm: vllm ${VLLM_VERSION} tiering modules already import in ${VENV}"
  exit 0
fi
if [ "$CHECK_ONLY" = 1 ]; then
  echo "install_vllm: ${VENV} does not hold vllm ${VLLM_VERSION} with torch ${TORCH_VERSION}" >&2
  exit 1
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
# The CPU torch wheel: from the local wheel directory when it has it, else PyTorch's CPU
# index (never PyPI's torch, a CUDA build). The constraint keeps every later step from
# swapping it for a CUDA build.
CONSTRAINTS="$(mktemp)"
trap 'rm -f "$CONSTRAINTS"' EXIT
printf 'torch==%s\n' "$TORCH_VERSION" >"$CONSTRAINTS"
if ls "$TORCH_WHEELS"/torch-"$TORCH_VERSION"+cpu-*.whl >/dev/null 2>&1; then
  TORCH_SRC=(--find-links "$TORCH_WHEELS" "torch==${TORCH_VERSION}+cpu")
else
  TORCH_SRC=(--extra-index-url "$TORCH_INDEX" "torch==${TORCH_VERSION}+cpu")
fi
if ! "$VENV/bin/python" -c "import torch, sys; sys.exit(torch.__version__ != '${TORCH_VERSION}+cpu')" \
     2>/dev/null && ! pip_q -c "$CONSTRAINTS" "${TORCH_SRC[@]}"; then
  echo "install_vllm: cannot get the CPU torch ${TORCH_VERSION} wheel (offline?)" >&2
  exit 3
fi
if ! ls "$WHEELS"/vllm-"$VLLM_VERSION"-*.whl >/dev/null 2>&1 \
   || ! ls "$WHEELS"/xgrammar-"$XGRAMMAR_VERSION"-*.whl >/dev/null 2>&1; then
  if ! "$VENV/bin/python" -m pip download --quiet --disable-pip-version-check --no-deps \
      -d "$WHEELS" "vllm==${VLLM_VERSION}" "xgrammar==${XGRAMMAR_VERSION}"; then
    echo "install_vllm: cannot download vllm ${VLLM_VERSION} (offline?)" >&2
    exit 3
  fi
fi
pip_q --no-deps "$WHEELS"/vllm-"$VLLM_VERSION"-*.whl "$WHEELS"/xgrammar-"$XGRAMMAR_VERSION"-*.whl
pip_q -c "$CONSTRAINTS" "${DEPS[@]}"

if ! import_ok; then
  echo "install_vllm: the vllm tiering modules still do not import:" >&2
  "$VENV/bin/python" -c "$IMPORTS" >&2 || true
  exit 1
fi
write_stamp
echo "install_vllm: vllm ${VLLM_VERSION} with torch ${TORCH_VERSION} ready in ${VENV}"
