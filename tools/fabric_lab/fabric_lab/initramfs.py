"""Builds the guest image: Debian's kernel plus a busybox initramfs with just the modules the
NVMe-oF target needs, and caches it.

The base image does not depend on the lab config (see guest_init.sh), so one cached build
serves every config; the config travels in a tiny second cpio archive that start_overlay()
appends at boot time (the kernel unpacks concatenated archives in order).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import lzma
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from . import debian_packages, host_tools, lab_paths

# Bump when the layout of the built image changes, so old caches are not reused.
BUILD_FORMAT = 5

# Top-level modules; their dependencies come from modules.dep. Beyond the TCP target this
# covers the RDMA port (rdma_rxe, nvmet-rdma), the in-guest kernel initiator (nvme-tcp,
# nvme-rdma) and 9p shared folders, so later issues need no rebuild just to load them.
GUEST_MODULES = (
    "configfs", "virtio_pci", "virtio_net", "virtio_blk",
    "crc32c_generic", "crc32c-intel", "crc32_generic", "crc32-pclmul",
    "crct10dif_generic", "crct10dif-pclmul",
    "crc64_rocksoft_generic",
    "nvme", "nvme-core", "nvme-fabrics", "nvme-tcp", "nvme-rdma",
    "nvmet", "nvmet-tcp", "nvmet-rdma",
    "brd", "null_blk", "loop",
    "ib_core", "ib_uverbs", "rdma_cm", "rdma_ucm", "rdma_rxe",
    "9pnet_virtio", "9p",
    # kTLS (the tls ULP) and the AES-GCM it asks the crypto API for, so that a userspace
    # TLS handshake can hand its keys to the kernel (fx100io's ktls=auto)
    "tls", "gcm", "ghash-generic", "aesni-intel", "ghash-clmulni-intel",
)

# Host binaries (from Debian packages the lab installs) copied into the guest with the
# shared libraries they link: busybox has no `rdma`, which soft-RoCE setup needs.
GUEST_HOST_BINARIES = ("rdma",)

# Debian packages unpacked (dpkg -x, never installed) to give the guest the kernel initiator's
# userspace: nvme-cli for `nvme discover/connect/disconnect` against targets on the host side.
# Only the files below and the shared libraries they need go into the image (the .debs also
# carry man pages, udev rules and systemd units the guest has no use for).
GUEST_PACKAGES = ("nvme-cli", "libnvme1", "libjson-c5")
GUEST_PACKAGE_BINARIES = ("usr/sbin/nvme",)
# nvme-cli reads /etc/nvme (hostnqn, hostid, discovery.conf); guest_init.sh writes the rest.
GUEST_PACKAGE_FILES = ("etc/nvme/discovery.conf",)

GUEST_INIT = lab_paths.PACKAGE_DIR / "guest_init.sh"


class InitramfsError(RuntimeError):
    """The guest image could not be built; the message says which step failed."""


@dataclass
class GuestImage:
    kernel: Path
    initramfs: Path
    kernel_release: str
    kernel_package: str


def _normalise(module: str) -> str:
    # modprobe treats '-' and '_' in module names alike; so must the closure.
    return module.replace("-", "_")


def _run(cmd: list[str], what: str, **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run(cmd, capture_output=True, text=True, check=False, **kwargs)
    if result.returncode != 0:
        raise InitramfsError(f"{what} failed ({' '.join(cmd)}):\n{result.stderr.strip()}")
    return result


def _cache_key(kernel_deb: Path, busybox_deb: Path, package_debs: list[Path]) -> str:
    digest = hashlib.sha256()
    digest.update(f"format={BUILD_FORMAT}\n".encode())
    digest.update(f"kernel={kernel_deb.name}\nbusybox={busybox_deb.name}\n".encode())
    # The .deb file names carry the package versions, so an update of any of them rebuilds.
    digest.update(("packages=" + ",".join(deb.name for deb in package_debs) + "\n").encode())
    digest.update(("package_files=" + ",".join(GUEST_PACKAGE_BINARIES + GUEST_PACKAGE_FILES)
                   + "\n").encode())
    digest.update(("modules=" + ",".join(GUEST_MODULES) + "\n").encode())
    digest.update(GUEST_INIT.read_bytes())
    for binary in GUEST_HOST_BINARIES:
        path = host_tools.find_command(binary)
        digest.update(f"{binary}={path}:{os.stat(path).st_mtime_ns if path else 0}\n".encode())
    return digest.hexdigest()[:16]


def _module_closure(modules_dir: Path) -> list[str]:
    """Paths (relative to modules_dir) of GUEST_MODULES and everything they depend on."""
    deps: dict[str, list[str]] = {}
    by_name: dict[str, str] = {}
    for line in (modules_dir / "modules.dep").read_text().splitlines():
        path, _, rest = line.partition(":")
        deps[path] = rest.split()
        by_name[_normalise(Path(path).name.split(".ko")[0])] = path
    builtin = {_normalise(Path(line).name.split(".ko")[0])
               for line in (modules_dir / "modules.builtin").read_text().split()}
    wanted: set[str] = set()
    pending = []
    for module in GUEST_MODULES:
        name = _normalise(module)
        if name in by_name:
            pending.append(by_name[name])
        elif name not in builtin:
            raise InitramfsError(f"kernel has no module {module} (neither loadable nor built in)")
    while pending:
        path = pending.pop()
        if path not in wanted:
            wanted.add(path)
            pending.extend(deps.get(path, []))
    return sorted(wanted)


def _file_stamp(path: Path) -> str:
    """Size and mtime of a host file, to notice when a host library the image copied changed."""
    st = os.stat(path)
    return f"{st.st_size}:{st.st_mtime_ns}"


def _copy_with_libraries(source: Path, root: Path, host_files: dict[str, str],
                         tree: Path | None = None) -> None:
    """Copy an executable into root with the shared libraries ldd resolves for it.

    tree: an unpacked package tree that source lies in; its library directories are searched
    first, so its libraries keep their place (tree/usr/lib/x -> root/usr/lib/x). Libraries that
    only the host has (libc, zlib, libcrypto, ...) come from the host; host_files records them
    with their stamps, so the cached image is rebuilt when one of them changes.
    """
    env = dict(os.environ)
    if tree is not None:
        lib_dirs = [str(d) for d in (tree / "lib", tree / "usr/lib",
                                     tree / "lib/x86_64-linux-gnu",
                                     tree / "usr/lib/x86_64-linux-gnu") if d.is_dir()]
        env["LD_LIBRARY_PATH"] = os.pathsep.join(lib_dirs)
    # ldd only loads the objects (LD_TRACE_LOADED_OBJECTS); it does not run Debian's binary.
    ldd = _run(["ldd", str(source)], f"ldd {source}", env=env)
    files = [source]
    for line in ldd.stdout.splitlines():
        parts = line.split()
        # "libx.so => /lib/.../libx.so (0x..)" or "/lib64/ld-linux-x86-64.so.2 (0x..)"
        if "=>" in parts and len(parts) > parts.index("=>") + 1:
            candidate = parts[parts.index("=>") + 1]
            if candidate == "not":
                raise InitramfsError(f"{source} needs {parts[0]}, found neither in its "
                                     "packages nor on the host")
        elif parts and parts[0].startswith("/"):
            candidate = parts[0]
        else:
            continue
        if candidate.startswith("/"):
            files.append(Path(candidate))
    for path in files:
        if tree is not None and path.is_relative_to(tree):
            relative = path.relative_to(tree)
        else:
            relative = path.relative_to("/")
            host_files[str(path.resolve())] = _file_stamp(path.resolve())
        target = root / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        # The loader looks libraries up by soname, so the resolved file under that name suffices.
        shutil.copy2(path.resolve(), target)


def _write_cpio(root: Path, output: Path, compress: bool) -> None:
    """Pack root as a newc cpio archive (owned by root:root), optionally gzip'd."""
    names = sorted(str(p.relative_to(root)) for p in root.rglob("*"))
    cpio = subprocess.run(["cpio", "--create", "--format=newc", "--owner=0:0", "--quiet"],
                          cwd=root, input="\n".join(names).encode() + b"\n",
                          capture_output=True, check=False)
    if cpio.returncode != 0:
        raise InitramfsError(f"cpio failed: {cpio.stderr.decode().strip()}")
    data = cpio.stdout
    if compress:
        gz = subprocess.run(["gzip", "-6", "-n"], input=data, capture_output=True, check=False)
        if gz.returncode != 0:
            raise InitramfsError(f"gzip failed: {gz.stderr.decode().strip()}")
        data = gz.stdout
    output.write_bytes(data)


def _copy_module(source: Path, target: Path) -> None:
    """Copy a kernel module, uncompressed: Debian's 6.12 modules are .ko.xz, and busybox's
    modprobe loads plain .ko files only (depmod of the staged tree then names the .ko)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    if source.name.endswith(".ko.xz"):
        target.with_name(source.name[:-3]).write_bytes(lzma.decompress(source.read_bytes()))
    elif source.name.endswith(".ko.gz"):
        target.with_name(source.name[:-3]).write_bytes(gzip.decompress(source.read_bytes()))
    elif source.name.endswith(".ko"):
        shutil.copy2(source, target)
    else:
        raise InitramfsError(f"kernel module {source.name}: compression not supported "
                             "(only .ko, .ko.xz, .ko.gz)")


def _stage_root(kernel_tree: Path, busybox_tree: Path, packages_tree: Path, release: str,
                root: Path, host_files: dict[str, str]) -> int:
    for directory in ("bin", "sbin", "usr/bin", "usr/sbin", "proc", "sys", "dev", "tmp", "run",
                      "etc", "lab", "lib/modules"):
        (root / directory).mkdir(parents=True, exist_ok=True)
    shutil.copy2(busybox_tree / "bin/busybox", root / "bin/busybox")
    os.symlink("busybox", root / "bin/sh")
    try:
        # The kernel opens /dev/console for init's stdout before /init can mount devtmpfs.
        os.mknod(root / "dev/console", 0o600 | 0o020000, os.makedev(5, 1))
    except PermissionError:
        pass  # not root: the kernel's built-in initramfs already provides /dev/console
    source_modules = kernel_tree / "lib/modules" / release
    target_modules = root / "lib/modules" / release
    closure = _module_closure(source_modules)
    for relative in closure:
        _copy_module(source_modules / relative, target_modules / relative)
    for meta in ("modules.order", "modules.builtin", "modules.builtin.modinfo"):
        if (source_modules / meta).exists():
            shutil.copy2(source_modules / meta, target_modules / meta)
    _run(["depmod", "-b", str(root), release], "depmod for the initramfs")
    for binary in GUEST_HOST_BINARIES:
        source = host_tools.find_command(binary)
        if source is None:
            raise InitramfsError(f"host command {binary} is missing (install iproute2)")
        _copy_with_libraries(Path(source), root, host_files)
    for relative in GUEST_PACKAGE_BINARIES:
        _copy_with_libraries(packages_tree / relative, root, host_files, tree=packages_tree)
    for relative in GUEST_PACKAGE_FILES:
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(packages_tree / relative, root / relative)
    shutil.copy2(GUEST_INIT, root / "init")
    os.chmod(root / "init", 0o755)
    return len(closure)


def build(force: bool = False, log=print) -> GuestImage:
    """Return the cached guest image for the newest kernel, building it if needed."""
    host_tools.ensure_host_tools(log)
    kernel_package = debian_packages.newest_kernel_package()
    kernel_deb = debian_packages.download(kernel_package, log)
    busybox_deb = debian_packages.download("busybox-static", log)
    package_debs = [debian_packages.download(package, log) for package in GUEST_PACKAGES]
    out = lab_paths.build_cache_dir() / _cache_key(kernel_deb, busybox_deb, package_debs)
    manifest = out / "manifest.json"
    if manifest.exists() and not force:
        info = json.loads(manifest.read_text())
        if _host_files_unchanged(info.get("host_files", {})):
            return GuestImage(out / "vmlinuz", out / "initramfs.cpio.gz",
                              info["kernel_release"], info["kernel_package"])
        log("fabric lab: host libraries copied into the guest image changed; rebuilding")
    started = time.monotonic()
    log(f"fabric lab: building guest image for {kernel_package} in {out}")
    work = out.with_name(out.name + f".tmp{os.getpid()}")
    shutil.rmtree(work, ignore_errors=True)
    try:
        debian_packages.unpack(kernel_deb, work / "kernel")
        debian_packages.unpack(busybox_deb, work / "busybox")
        for deb in package_debs:
            debian_packages.unpack(deb, work / "packages")
        releases = sorted(p.name for p in (work / "kernel/lib/modules").iterdir())
        if len(releases) != 1:
            raise InitramfsError(f"{kernel_deb.name} holds module trees {releases}, expected one")
        release = releases[0]
        # The .deb ships no modules.dep (its postinst makes it); make one to resolve deps.
        _run(["depmod", "-b", str(work / "kernel"), release], "depmod for the kernel package")
        host_files: dict[str, str] = {}
        module_count = _stage_root(work / "kernel", work / "busybox", work / "packages", release,
                                   work / "root", host_files)
        _write_cpio(work / "root", work / "initramfs.cpio.gz", compress=True)
        shutil.copy2(work / "kernel/boot" / f"vmlinuz-{release}", work / "vmlinuz")
        (work / "manifest.json").write_text(json.dumps({
            "kernel_package": kernel_package, "kernel_deb": kernel_deb.name,
            "busybox_deb": busybox_deb.name, "package_debs": [deb.name for deb in package_debs],
            "kernel_release": release, "host_files": host_files,
            "modules": module_count, "build_seconds": round(time.monotonic() - started, 1),
        }, indent=2) + "\n")
        # Keep only what boots; the unpacked trees are large and cheap to recreate.
        shutil.rmtree(work / "kernel")
        shutil.rmtree(work / "busybox")
        shutil.rmtree(work / "packages")
        shutil.rmtree(work / "root")
        shutil.rmtree(out, ignore_errors=True)
        work.rename(out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    _prune_cache(keep=out, debs=[kernel_deb, busybox_deb, *package_debs])
    size_mib = (out / "initramfs.cpio.gz").stat().st_size / 2**20
    log(f"fabric lab: built {out.name}: {module_count} modules, initramfs {size_mib:.1f} MiB, "
        f"{time.monotonic() - started:.1f} s")
    return GuestImage(out / "vmlinuz", out / "initramfs.cpio.gz", release, kernel_package)


def _host_files_unchanged(host_files: dict[str, str]) -> bool:
    """True if every host file a cached image copied still has the stamp it had then."""
    for path, stamp in host_files.items():
        try:
            if _file_stamp(Path(path)) != stamp:
                return False
        except OSError:
            return False
    return True


def _prune_cache(keep: Path, debs: list[Path]) -> None:
    """Drop superseded images and .debs so the cache does not grow with every kernel update.
    A running lab is unaffected: QEMU read its kernel and initramfs when it started."""
    for old in lab_paths.build_cache_dir().iterdir():
        if old != keep and ".tmp" not in old.name:
            shutil.rmtree(old, ignore_errors=True)
    for deb in lab_paths.debs_dir().glob("*.deb"):
        if deb not in debs:
            deb.unlink(missing_ok=True)


def boot_initramfs(image: GuestImage, setup_script: str, destination: Path) -> Path:
    """Write image's initramfs followed by a cpio holding /lab/setup.sh to destination."""
    overlay_root = destination.with_name(destination.name + ".overlay")
    shutil.rmtree(overlay_root, ignore_errors=True)
    (overlay_root / "lab").mkdir(parents=True)
    (overlay_root / "lab/setup.sh").write_text(setup_script)
    overlay = destination.with_name(destination.name + ".overlay.cpio")
    try:
        _write_cpio(overlay_root, overlay, compress=False)
        base = image.initramfs.read_bytes()
        with open(destination, "wb") as out:
            out.write(base)
            # The kernel only recognises an uncompressed cpio header at a 4-byte aligned
            # offset; it skips the zero padding between archives.
            out.write(b"\0" * (-len(base) % 4))
            out.write(overlay.read_bytes())
    finally:
        shutil.rmtree(overlay_root, ignore_errors=True)
        overlay.unlink(missing_ok=True)
    return destination
