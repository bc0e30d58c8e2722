#!/usr/bin/env bash
# A venv for tools/bench_lmcache_mp.py: the system python's lmcache (tools/install_lmcache.sh)
# plus LMCache's Rust raw-block extension, which its `raw_block` L2 adapter needs. The
# extension is a binary wheel, so it goes into a venv of its own, not the system python.
# Idempotent: prints the venv's python and exits when it is already there.
# Usage: tools/install_lmcache_bench.sh   -> prints the python to run the benchmark with
set -euo pipefail

VENV="${FX100IO_LMCACHE_BENCH_VENV:-/var/cache/fx100io/venv-lmcache-bench}"
RAW_BLOCK="lmcache-rust-raw-block-io==0.5.7rc2"

here="$(cd "$(dirname "$0")" && pwd)"
bash "$here/install_lmcache.sh" python3 >&2

if [ ! -x "$VENV/bin/python" ]; then
  mkdir -p "$(dirname "$VENV")"
  python3 -m venv --system-site-packages "$VENV" >&2
fi
if ! "$VENV/bin/python" -c 'import lmcache_rust_raw_block_io' >/dev/null 2>&1; then
  "$VENV/bin/python" -m pip install --quiet --root-user-action=ignore --no-deps "$RAW_BLOCK" >&2
fi
"$VENV/bin/python" -c 'import lmcache_rust_raw_block_io, lmcache' >/dev/null 2>&1 || {
  echo "install_lmcache_bench: lmcache_rust_raw_block_io or lmcache does not import in $VENV" >&2
  exit 1
}
echo "$VENV/bin/python"
