#!/usr/bin/env bash
# The lab-guest tests (NVMe/RDMA and kTLS, tests/guest) against an ASan+UBSan build of
# the extension, inside the fabric lab's guest (this host's kernel has no
# RDMA and no kTLS).  Like tools/asan_suite.sh it builds a scratch copy, but inside the
# checkout (build/asan-guest): the guest sees the checkout, not this host's
# /tmp.  Starts the lab with --rdma if it is not running and stops it after.
# Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
scratch="$PWD/build/asan-guest"
rm -rf "$scratch"
mkdir -p "$scratch"
git ls-files -z --cached --others --exclude-standard | \
  grep -zv '\.so$' | xargs -0 cp --parents -t "$scratch"
(cd "$scratch" && FX100IO_SANITIZE=1 "$PY" setup.py -q build_clib build_ext --inplace >/dev/null &&
  make -C tests/c -s all)
libasan=$(gcc -print-file-name=libasan.so)
libubsan=$(gcc -print-file-name=libubsan.so)
# The LMCache test stays out: torch is not built to run under a preloaded ASan.
# So do the kernel path's tests (nvme-cli and the kernel's initiator; the C they
# reach is the io_uring engine the host ASan suite runs): the plain suite runs
# them.  The hostile peer's module (test_rdma_command_keys) runs only here in
# the test command (tools/test.sh).
"$PY" tools/fabric_lab/lab.py run --rdma -- \
  "$PY" tools/fabric_lab/lab.py guest --timeout 1800 --cwd "$scratch" \
    --env "LD_PRELOAD=$libasan:$libubsan" \
    --env "ASAN_OPTIONS=detect_leaks=0:abort_on_error=1" \
    --env "UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1" \
    --env "PYTHONPATH=$scratch" -- \
  "$PY" -m pytest -q -p no:cacheprovider -p no:hypothesispytest -p no:benchmark -p no:anyio --durations=15 \
    "$@" tests/guest/test_nvme_rdma.py tests/guest/test_rdma_connect_paths.py \
    tests/guest/test_rdma_kernel_and_faults.py \
    tests/guest/test_dhchap_rdma.py tests/guest/test_rdma_command_keys.py \
    tests/guest/test_ktls.py
