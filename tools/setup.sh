#!/usr/bin/env bash
# Installs what fx100io needs on Debian 12 (root) and builds it in place.
# Idempotent: packages already present are not touched.  Used by `make demo`
# and by tools/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"

need=()
# RDMA: the NVMe/RDMA transport links libibverbs/librdmacm (ibverbs-providers has
# soft-RoCE's rxe); python3-pyverbs lists devices (fx100io rdma-devices); nvme-cli and
# the verbs utilities are what the lab guest's userland (this host's root) runs;
# libssl-dev: DH-HMAC-CHAP authentication uses OpenSSL's libcrypto;
# redis-server: the index of SharedChunkStore (its tests start their own on a loopback
# port, never the system service)
for p in liburing-dev fio gcc make util-linux pkg-config libibverbs-dev librdmacm-dev libssl-dev redis-server \
    rdma-core ibverbs-providers python3-pyverbs nvme-cli ibverbs-utils rdmacm-utils; do
  dpkg -s "$p" >/dev/null 2>&1 || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
  echo "setup: apt-get install ${need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi

"$PY" -m pip install --quiet --disable-pip-version-check numpy "Cython>=3.0" setuptools wheel \
  "pytest>=9" pytest-asyncio redis
# --no-build-isolation: build against the Cython just installed, offline-friendly
"$PY" -m pip install --quiet --disable-pip-version-check --no-build-isolation -e .
# Byte-compile the package (an editable install leaves it as sources): a CLI
# start then does not compile every module again where .pyc files cannot be
# written (PYTHONDONTWRITEBYTECODE, a read-only checkout).
"$PY" -m compileall -q fx100io
# (fx100io._core: `import fx100io` alone no longer loads the C extension)
"$PY" -c "import fx100io, fx100io._core; print('setup: fx100io', fx100io.__version__, 'built')"
