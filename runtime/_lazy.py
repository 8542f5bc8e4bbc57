"""Names a package exports but imports on first use: its ``__getattr__`` (PEP 562).

``engine`` and ``serving`` name llama.cpp's classes in their surface, yet the fake
engine and the light parts (types, settings, the app's client) must load without
llama.cpp: each name's module is imported when the name is first asked for.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def on_first_use(package: str, where: Mapping[str, str]) -> Callable[[str], Any]:
    """The ``__getattr__`` of ``package``: ``where`` maps each name to its module,
    relative to the package ("._llama"); a name once loaded is kept in the package."""

    def __getattr__(name: str) -> Any:
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(where[name], package), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
