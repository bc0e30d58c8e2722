"""The kernel path: NVMe-oF namespaces attached by the Linux kernel's own
initiator (nvme-fabrics with nvme-tcp or nvme-rdma), driven through nvme-cli
(``nvme ... -o json``, nvme-cli 2.x) and read back from sysfs
(``/sys/class/nvme``, ``/sys/class/nvme-subsystem``).

The same URIs as the userspace path::

    nvme+tcp://HOST[:PORT]/SUBNQN?hostnqn=...&queues=4&hdgst=1&ddgst=1&kato_ms=10000
    nvme+rdma://HOST[:PORT]/SUBNQN?hostnqn=...&dhchap_secret=DHHC-1:...

How URI options reach ``nvme connect``: hostnqn -> ``--hostnqn``, hostid ->
``--hostid`` (as a UUID: the kernel takes no other form), queues ->
``--nr-io-queues``, hdgst / ddgst -> ``--hdr-digest`` / ``--data-digest``,
kato_ms -> ``--keep-alive-tmo`` (seconds, rounded up; 0 cannot be said to the
kernel and is refused), qsize -> ``--queue-size``, dhchap_secret /
dhchap_ctrl_secret -> the host and controller keys (never on the command
line: see below).  ns picks the namespace :func:`open_device` uses.  The
userspace initiator's connect_timeout_ms, io_timeout_ms, max_xfer,
reconnect_ms and max_reconnects have no per-controller kernel equivalent and
are ignored here.  Keyword arguments of :func:`connect` take the same names
and override the URI; ctrl_loss_tmo, reconnect_delay (seconds), host_iface,
host_traddr and duplicate_connect are kernel-only.

Without hostnqn / hostid in the URI, the kernel path uses the machine's
nvme-cli identity (``/etc/nvme/hostnqn``, ``/etc/nvme/hostid``), as ``nvme
connect`` does, and fx100io's own (:func:`fx100io.host_identity`) only when
those files are missing.

DH-HMAC-CHAP secrets are handed to nvme-cli in a JSON configuration file
(``--config``, mode 0600 in a private temporary directory, removed as soon as
nvme-cli returns), so they appear in no process's argv, log line or
exception.  The kernel keeps them in ``/sys/class/nvme/nvmeX/dhchap_secret``
(readable by root only).  A kernel built without NVMe in-band authentication
(CONFIG_NVME_AUTH; Debian's 6.1) accepts and ignores the secrets: connect()
then disconnects again and raises :class:`KernelSupportError` rather than
hand back an unauthenticated controller.  A process killed while nvme-cli runs
leaves its file behind; the next connect (of any process of that user) removes
the files of processes that are gone.

:func:`attach` (``open_device(..., path="kernel")``, ``ChunkStore``) shares a
controller between the threads and processes of a host (one process per GPU):
each process that uses it holds a shared ``flock`` on
``/run/fx100io/ctrl-<name>.lock`` (let go when the process ends, however it
ends), and the last one detaches it, only if fx100io attached it
(``/run/fx100io/ctrl-<name>.json``).  Connects to one target are serialised
across processes (``/run/fx100io/connect-<hash>.lock``); a failed connect
detaches only the controller it made.  A live controller is reused only with
the same DH-HMAC-CHAP secrets (compared with sysfs) and options; one with other
secrets or options is refused (DeviceBusyError naming the option), one that
the kernel is reconnecting is waited for (up to ``timeout``).  Before the path
is handed out, its block device is checked in sysfs to be the URI's subsystem
and namespace.


One job per module:

- ``uri_args``: a URI and connect()'s keywords as ``nvme connect``'s arguments;
- ``sysfs``: the kernel's controllers and namespaces as sysfs and /dev show them;
- ``nvme_cli``: running nvme-cli and reading what it prints;
- ``diagnose``: why a connect failed, from nvme-cli's words and the kernel's log;
- ``secrets``: the DH-HMAC-CHAP secrets' configuration files;
- ``holds``: controllers shared between this host's threads and processes;
- ``multipath``: several paths to one subsystem (the kernel's native multipath);
- ``connections``: connect, disconnect, discover, attach, list;
- ``cli``: ``fx100io discover|connect|disconnect|list``.
"""

from __future__ import annotations

from fx100io.kernel.connections import (
    Attachment,
    attach,
    connect,
    disconnect,
    discover,
    list_controllers,
)
from fx100io.kernel.diagnose import classify_connect_failure
from fx100io.kernel.multipath import Paths, native_multipath
from fx100io.kernel.nvme_cli import (
    DEFAULT_TIMEOUT,
    parse_connect_output,
    parse_discover_output,
    parse_list_ns_output,
)
from fx100io.kernel.sysfs import (
    DEFAULT_NS_TIMEOUT,
    Controller,
    NamespacePath,
    controllers,
    matches,
    parse_address,
    read_controller,
    subsystems,
)
from fx100io.kernel.uri_args import (
    DISCOVERY_NQN,
    Target,
    default_host_identity,
    options_text,
    redact,
    split_paths,
    target_of,
)

# The API's name for list_controllers (``fx100io.kernel.list()``, as ``nvme list``); only this
# package's namespace binds it, so the builtin stays itself in every module.
list = list_controllers  # noqa: A001

__all__ = ["DEFAULT_NS_TIMEOUT", "DEFAULT_TIMEOUT", "DISCOVERY_NQN", "Attachment", "Controller",
           "NamespacePath", "Paths", "Target", "attach", "classify_connect_failure", "connect",
           "controllers", "native_multipath", "split_paths",
           "default_host_identity", "disconnect", "discover", "list", "list_controllers",
           "matches", "options_text", "parse_address", "parse_connect_output",
           "parse_discover_output", "parse_list_ns_output", "read_controller", "redact",
           "subsystems", "target_of"]
