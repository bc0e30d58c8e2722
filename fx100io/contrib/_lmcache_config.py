"""Options of the fx100io LMCache plugin, read from LMCache's ``extra_config``.

LMCache hands every plugin the whole engine config; our keys live under
``storage_plugin.<name>.`` where ``<name>`` is whatever the user listed in
``storage_plugins``. This module finds that name and hands our keys to the settings
every fx100io adapter shares (``_settings``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ._settings import (
    BackendConfigError,
    BackendSettings,
    file_path,
    is_blank,
    parse_settings,
    parse_size,
    should_create,
)

__all__ = [
    "PluginConfigError",
    "PluginOptions",
    "file_path",
    "find_plugin_name",
    "is_blank",
    "parse_options",
    "parse_size",
    "should_create",
]

# The plugin name the README documents; used when the config does not point at us.
DEFAULT_PLUGIN_NAME = "fx100io"
MODULE_PATH = "fx100io.contrib.lmcache"

# LMCache's own keys beside ours under storage_plugin.<name>.
_LMCACHE_KEYS = ("module_path", "class_name")

# The plugin's names for the shared types (kept for callers and tests).
PluginConfigError = BackendConfigError
PluginOptions = BackendSettings


def find_plugin_name(storage_plugins: Any, extra_config: Mapping[str, Any], class_name: str) -> str:
    """The name under which the user registered this plugin.

    The constructor is not told its own name, so we look for the listed plugin whose
    module_path and class_name point at us. With no match we fall back to the
    documented name, so a config that only sets the devices still gets a clear error.
    """
    listed = list(storage_plugins or [])
    ours = [
        name
        for name in listed
        if extra_config.get(f"storage_plugin.{name}.module_path") == MODULE_PATH
        and extra_config.get(f"storage_plugin.{name}.class_name") == class_name
    ]
    if len(ours) > 1:
        raise BackendConfigError(
            f"storage_plugins lists {ours} all pointing at {MODULE_PATH}.{class_name}; "
            "LMCache does not tell a plugin which entry it was built for, so use one entry "
            "(stripe several devices with a comma-separated 'devices' instead)"
        )
    if ours:
        return ours[0]
    return DEFAULT_PLUGIN_NAME


def parse_options(
    storage_plugins: Any,
    extra_config: Mapping[str, Any] | None,
    class_name: str,
    worker_id: int = 0,
    world_size: int = 1,
) -> BackendSettings:
    extra = dict(extra_config or {})
    name = find_plugin_name(storage_plugins, extra, class_name)
    prefix = f"storage_plugin.{name}."
    ours = {k[len(prefix) :]: v for k, v in extra.items() if k.startswith(prefix)}
    return parse_settings(ours, prefix, name=name, worker_id=worker_id, world_size=world_size,
                          extra_keys=_LMCACHE_KEYS)
