#!/usr/bin/env bash
# Installs the real lmcache package on a CPU-only machine, for the fx100io LMCache plugin
# and its tests (docs/lmcache.md, "Install").
#
# Why not a plain `pip install lmcache`: its declared dependencies pull CUDA builds of torch
# and its native extension is for GPUs. The plugin contract only needs lmcache's Python
# layers, so we install the CPU torch wheel, lmcache itself without dependencies, and then the
# modules that `import lmcache` really needs. numpy is pinned because lmcache 0.5.6 caps it.
#
# Idempotent: when everything is already at the right version it only checks the import.
# Usage: tools/install_lmcache.sh [python]   (default: python3)
set -euo pipefail

PY="${1:-${PYTHON:-python3}}"
TORCH_VERSION="2.13.0"
LMCACHE_VERSION="0.5.6"
NUMPY_CAP="2.2.6"

# The import-time needs of lmcache 0.5.6 (its own list also names GPU-only packages we skip).
DEPS=(
  "numpy<=${NUMPY_CAP}" pyyaml msgspec pyzmq psutil "prometheus_client<=0.24.1" aiofiles
  aiofile sortedcontainers blake3 aiohttp safetensors cachetools py-cpuinfo nvtx redis
  requests numba transformers cryptography
  # `lmcache server` (the multi-process mode, tests/contrib/test_lmcache_mp_server.py): its HTTP
  # stack; lmcache 0.5.6 caps opentelemetry at 1.40
  "opentelemetry-api<=1.40.0" "opentelemetry-sdk<=1.40.0" fastapi uvicorn httpx
)

# pip's resolver lists every dependency lmcache declares but we skip on purpose (CUDA
# packages, servers); those lines are expected here and would only hide real errors.
pip_install() {
  local log
  log="$(mktemp)"
  if ! "$PY" -m pip install --quiet --root-user-action=ignore "$@" >"$log" 2>&1; then
    cat "$log" >&2
    rm -f "$log"
    return 1
  fi
  grep -v -e "^lmcache [0-9.]* requires " -e "dependency resolver does not currently" "$log" >&2 || true
  rm -f "$log"
}

have_version() {  # have_version DIST VERSION-PREFIX: true if DIST is installed at that version
  "$PY" - "$1" "$2" <<'PYEOF'
import sys
from importlib.metadata import version, PackageNotFoundError
try:
    v = version(sys.argv[1])
except PackageNotFoundError:
    sys.exit(1)
sys.exit(0 if v == sys.argv[2] or v.startswith(sys.argv[2] + "+") else 1)
PYEOF
}

import_ok() {
  "$PY" -c 'import lmcache, numpy, torch
from lmcache.v1.storage_backend.abstract_backend import StoragePluginInterface
from lmcache.v1.cache_engine import LMCacheEngineBuilder
from lmcache.v1.multiprocess.http_server import run_http_server' >/dev/null 2>&1
}

numpy_ok() {  # numpy installed and not above the cap
  "$PY" - "$NUMPY_CAP" <<'PYEOF'
import sys
from importlib.metadata import version, PackageNotFoundError
try:
    v = version("numpy")
except PackageNotFoundError:
    sys.exit(1)
as_tuple = lambda s: tuple(int(p) for p in s.split(".")[:3] if p.isdigit())
sys.exit(0 if as_tuple(v) <= as_tuple(sys.argv[1]) else 1)
PYEOF
}

if have_version torch "$TORCH_VERSION" && have_version lmcache "$LMCACHE_VERSION" \
   && numpy_ok && import_ok; then
  echo "install_lmcache: lmcache ${LMCACHE_VERSION} and torch ${TORCH_VERSION} already work"
  exit 0
fi

# A constraint file keeps every later resolver step (transformers, numba...) from lifting
# numpy above the cap that lmcache accepts.
CONSTRAINTS="$(mktemp)"
trap 'rm -f "$CONSTRAINTS"' EXIT
printf 'numpy<=%s\ntorch==%s\n' "$NUMPY_CAP" "$TORCH_VERSION" >"$CONSTRAINTS"

if ! have_version torch "$TORCH_VERSION"; then
  # The CPU wheel lies in the local wheel directory; pip prefers it via find-links.
  pip_install -c "$CONSTRAINTS" "torch==${TORCH_VERSION}"
fi
# --no-deps: lmcache's metadata asks for CUDA packages that cannot work here.
if ! have_version lmcache "$LMCACHE_VERSION"; then
  pip_install --no-deps "lmcache==${LMCACHE_VERSION}"
fi
pip_install -c "$CONSTRAINTS" "${DEPS[@]}"

if ! numpy_ok; then
  echo "install_lmcache: numpy is above ${NUMPY_CAP} after install" >&2
  exit 1
fi
if ! import_ok; then
  echo "install_lmcache: 'import lmcache' still fails:" >&2
  "$PY" -c 'import lmcache.v1.cache_engine' >&2 || true
  exit 1
fi
echo "install_lmcache: lmcache ${LMCACHE_VERSION} with torch ${TORCH_VERSION} ready"
