"""ampkit.plugins(): what ampkit-plugins list shows, for Python."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import List, Optional, Sequence, Union

import torch

from . import _library
from ._arguments import check_plugin_dirs
from ._errors import cpp

__all__ = ["OptionInfo", "PluginInfo", "plugins"]


@dataclass(frozen=True)
class OptionInfo:
    """One option of a plugin: ``opt={"KIND.NAME": value}`` sets it."""

    name: str
    type: str  # "float > 1", "int >= 0", "choice error|clamp", ...
    default: str  # per-precision defaults read "fp16=1;bf16=5;fp32=10"
    help: str


@dataclass(frozen=True)
class PluginInfo:
    """A plugin file (or a plugin linked into ampkit), read from its ELF metadata."""

    kind: str
    name: str
    version: str
    summary: str
    path: str
    _dirs: tuple = ()
    _allow_untrusted: bool = False

    @property
    def options(self) -> List[OptionInfo]:
        """Its options with their help; reading them loads the plugin (not its factory)."""
        rows = cpp(torch.ops.ampkit.plugin_options)(
            list(self._dirs), self._allow_untrusted, self.kind, self.path or self.name
        )
        return [OptionInfo(*r) for r in rows]


def plugins(
    plugin_dirs: Optional[Sequence[Union[str, os.PathLike]]] = None, allow_untrusted_plugins: bool = False
) -> List[PluginInfo]:
    """Every plugin ampkit finds: ``plugin_dirs``, then ``AMPKIT_PLUGIN_PATH``, then the built-in
    ones. Read from the files without running plugin code, as ``ampkit-plugins list``."""
    check_plugin_dirs(plugin_dirs, "ampkit.plugins")
    dirs = tuple(_library.plugin_folders(plugin_dirs)) + (_library.builtin_plugin_dir(),)
    rows = cpp(torch.ops.ampkit.list_plugins)(list(dirs), allow_untrusted_plugins)
    return [
        PluginInfo(kind, name, version, summary, path, _dirs=dirs, _allow_untrusted=allow_untrusted_plugins)
        for kind, name, version, summary, path in rows
    ]
