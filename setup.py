"""Build of fx100io: one Cython extension, fx100io._core, over the C core.

Environment knobs (for CI and debugging):
  FX100IO_SANITIZE=1   build with AddressSanitizer + UBSan
  FX100IO_DEBUG=1      -O0 -g
"""

import glob
import os
import sys

from Cython.Build import cythonize
from setuptools import Extension, find_packages, setup
from setuptools.command.build_clib import build_clib

HERE = os.path.dirname(os.path.abspath(__file__))
LIB_DIRS = ["/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib"]


def liburing_link_args():
    """Link liburing statically when liburing.a is there, so the wheel does
    not need liburing2 at run time."""
    for d in LIB_DIRS:
        if os.path.exists(os.path.join(d, "liburing.a")):
            return [":liburing.a"]
    if not any(os.path.exists(os.path.join(d, "liburing.so")) for d in LIB_DIRS):
        sys.exit("fx100io needs liburing: apt-get install liburing-dev (see README.md)")
    return ["uring"]


def rdma_libs():
    """libibverbs and librdmacm for the NVMe/RDMA transport (rdma-core); the
    extension links them, so they must be there to build."""
    for lib in ("ibverbs", "rdmacm"):
        if not any(os.path.exists(os.path.join(d, f"lib{lib}.so")) for d in LIB_DIRS):
            sys.exit(f"fx100io needs lib{lib}: apt-get install libibverbs-dev librdmacm-dev "
                     "(see README.md)")
    return ["rdmacm", "ibverbs"]


def crypto_libs():
    """OpenSSL's libcrypto (HMAC, SHA-2, finite-field DH) for NVMe in-band
    authentication (DH-HMAC-CHAP), and libssl for the NVMe/TCP secure channel's
    TLS 1.3 handshake."""
    if not all(any(os.path.exists(os.path.join(d, f"lib{lib}.so")) for d in LIB_DIRS)
               for lib in ("crypto", "ssl")):
        sys.exit("fx100io needs libcrypto (OpenSSL 3): apt-get install libssl-dev (see README.md)")
    return ["ssl", "crypto"]


c_sources = sorted(
    os.path.relpath(p, HERE)
    for p in glob.glob(os.path.join(HERE, "csrc", "**", "*.c"), recursive=True)
)
uring_libs = liburing_link_args()
cflags = ["-std=c11", "-Wall", "-Wextra", "-Werror", "-Wno-unused-function"]
ldflags = []
if os.environ.get("FX100IO_DEBUG"):
    cflags += ["-O0", "-g"]
else:
    cflags += ["-O2", "-g"]
if os.environ.get("FX100IO_SANITIZE"):
    san = ["-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-fno-sanitize-recover=undefined"]
    cflags += san
    ldflags += san

# The C core is built as its own static library so that -Werror applies to
# our C and not to the code Cython generates.
c_core = (
    "fx100io_c",
    {"sources": c_sources, "include_dirs": ["csrc/include", "csrc"], "cflags": cflags},
)
core = Extension(
    "fx100io._core",
    sources=["fx100io/_core.pyx"],
    include_dirs=["csrc/include", "csrc"],
    # fx100io_c first: static archives resolve left to right.
    libraries=["fx100io_c"] + uring_libs + rdma_libs() + crypto_libs() + ["pthread"],
    extra_compile_args=[f for f in cflags if f not in ("-Werror", "-Wextra", "-std=c11")],
    extra_link_args=ldflags,
)

class fresh_build_clib(build_clib):
    """Build the C core's archive anew each time: `ar` only adds members, so
    the object of a source file that was moved or deleted would stay in an
    old archive and could shadow the new code at link time."""

    def build_libraries(self, libraries):
        for name, _info in libraries:
            old = self.compiler.library_filename(name, output_dir=self.build_clib)
            if os.path.exists(old):
                os.remove(old)
        super().build_libraries(libraries)


setup(
    name="fx100io",
    cmdclass={"build_clib": fresh_build_clib},
    version="0.1.0",
    description="io_uring and NVMe-oF I/O engine and KV-cache chunk store for LLM serving",
    python_requires=">=3.10",
    packages=find_packages(include=["fx100io", "fx100io.*"]),
    package_data={"fx100io": ["py.typed", "*.pyi", "*.pxd", "*.pxi"]},
    libraries=[c_core],
    ext_modules=cythonize([core], compiler_directives={"language_level": "3"}),
    install_requires=["numpy"],
    extras_require={"plot": ["matplotlib"], "test": ["pytest", "pytest-asyncio"],
                    # the SGLang HiCache backend (fx100io.contrib.sglang), tested with 0.5.23
                    "sglang": ["sglang>=0.5.23,<0.6"],
                    # the LMCache plugin (in-process) and L2 adapters (multi-process
                    # `lmcache server`, fx100io.contrib.lmcache_mp), tested with 0.5.6
                    "lmcache": ["lmcache>=0.5.6,<0.6"],
                    # the vLLM offloading tier (fx100io.contrib.vllm), tested with 0.33.0
                    "vllm": ["vllm>=0.33.0,<0.34"]},
    entry_points={"console_scripts": ["fx100io=fx100io.cli:main"]},
    zip_safe=False,
)
