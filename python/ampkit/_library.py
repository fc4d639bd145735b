"""Loads the C++ side (_C.so, torch custom classes) and finds the built-in plugins."""

from __future__ import annotations

import os

import torch

_HERE = os.path.dirname(os.path.abspath(__file__))


def _load() -> None:
    path = os.path.join(_HERE, "_C.so")
    if not os.path.exists(path):
        raise ImportError(
            f"ampkit's C++ library {path} is missing: build it with tools/test.sh (or cmake --build build) "
            "and use PYTHONPATH=build/python, or pip install ."
        )
    torch.ops.load_library(path)
    # A plugin that crashes or calls exit() inside a call is reported by name (exit code 3).
    torch.ops.ampkit.install_fault_reporter()


def plugin_folders(dirs) -> list:
    """``plugin_dirs`` as paths, each checked to be a folder: ValueError naming the argument."""
    out = [os.fspath(d) for d in (dirs or [])]
    for d in out:
        if not os.path.isdir(d):
            raise ValueError(f"plugin_dirs: {d} is not a folder")
    return out


def builtin_plugin_dir() -> str:
    """Where the built-in plugins are: the installed package's plugins/ folder, or the build
    tree's lib/ampkit/plugins beside build/python."""
    installed = os.path.join(_HERE, "plugins")
    if os.path.isdir(installed):
        return installed
    return os.path.normpath(os.path.join(_HERE, "..", "..", "lib", "ampkit", "plugins"))


_load()
