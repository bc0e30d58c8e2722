"""DH-HMAC-CHAP secrets on the kernel path: handed to nvme-cli in a private 0600
configuration file (never in argv), and checked to have reached the kernel."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import stat
import tempfile
from collections.abc import Iterator

from fx100io.errors import KernelSupportError
from fx100io.kernel.sysfs import Controller, read_attr
from fx100io.kernel.uri_args import Target

# where nvme-cli's secret configuration files are made (tmpfs: never on a disk)
SECRET_TMPDIR = "/dev/shm"
_SECRET_DIR = re.compile(r"fx100io-nvme-(\d+)-.+")


def _remove_stale_secret_dirs(parent: str) -> None:
    """Remove the secret configuration directories of processes that are gone: a process
    killed while nvme-cli ran (up to DEFAULT_TIMEOUT) never got to its own cleanup, and its
    secret would stay in tmpfs until reboot.  Only this user's, named with a pid that no
    longer runs (a reused pid keeps its directory: left, never wrongly removed)."""
    try:
        entries = os.listdir(parent)
    except OSError:
        return
    for e in entries:
        m = _SECRET_DIR.fullmatch(e)
        if not m:
            continue
        d = os.path.join(parent, e)
        try:
            if os.lstat(d).st_uid != os.geteuid() or not stat.S_ISDIR(os.lstat(d).st_mode):
                continue
            os.kill(int(m.group(1)), 0)
            continue  # its process still runs
        except ProcessLookupError:
            pass
        except (OSError, OverflowError):
            continue
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(d, "config.json"))
        with contextlib.suppress(OSError):
            os.rmdir(d)


@contextlib.contextmanager
def secret_config(t: Target) -> Iterator[str | None]:
    """A 0600 config file for nvme-cli's --config holding the secrets, gone afterwards (and
    at the next connect of any process, should this one be killed meanwhile)."""
    if not t.secrets:
        yield None
        return
    parent = SECRET_TMPDIR if os.path.isdir(SECRET_TMPDIR) else tempfile.gettempdir()
    _remove_stale_secret_dirs(parent)
    d = tempfile.mkdtemp(prefix=f"fx100io-nvme-{os.getpid()}-", dir=parent)
    path = os.path.join(d, "config.json")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(t.config_json(), f)
        yield path
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)
        with contextlib.suppress(OSError):
            os.rmdir(d)


def check_secrets_applied(c: Controller, t: Target, where: str) -> None:
    """With secrets asked for, the kernel must hold them: a kernel without NVMe in-band
    authentication ignores them (and would authenticate nothing)."""
    if not t.secrets:
        return
    for key in t.secrets:
        attr = c.sysfs_path / key
        if not attr.exists():
            raise KernelSupportError(errno.EOPNOTSUPP, "this kernel has no NVMe in-band "
                                     "authentication (built without CONFIG_NVME_AUTH; its "
                                     f"controllers have no {key} attribute): it would connect "
                                     "without authenticating, so the controller was detached "
                                     "again", where)
        value = read_attr(attr)
        if value and value != t.secrets[key]:
            raise KernelSupportError(errno.EIO, f"nvme-cli did not hand the {key} to the kernel "
                                     "(its configuration file was not applied); the controller "
                                     "was detached again", where)
