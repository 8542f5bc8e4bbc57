"""What the loaded llama.cpp library is: its backends and CPU features, as it says.

The hardware probe infers the backend from the library files without loading them;
this asks the library itself, once it is loaded, so ``doctor`` shows both.
"""

from __future__ import annotations

from typing import Any

import llama_cpp.llama_cpp as ll

from . import _native_log


def parse_system_info(text: str) -> dict[str, dict[str, str]]:
    """``"CPU : AVX2 = 1 | ... | CUDA : ARCHS = 900 | ..."`` as ``{backend: {key: value}}``."""
    out: dict[str, dict[str, str]] = {}
    current: dict[str, str] | None = None
    for field in (f.strip() for f in text.split("|")):
        if not field:
            continue
        name, sep, rest = field.partition(" : ")
        if sep:  # a new backend starts: "CPU : SSE3 = 1"
            current = out.setdefault(name.strip(), {})
            field = rest
        key, _, value = field.partition("=")
        if current is not None and key.strip():
            current[key.strip()] = value.strip()
    return out


def llama_build_info() -> dict[str, Any]:
    """The loaded library's backends (e.g. ``["CPU"]`` or ``["CUDA", "CPU"]``), whether
    it can offload layers to a GPU, and its own system-info line."""
    _native_log.install()  # a GPU backend's init logs its devices
    ll.llama_backend_init()
    raw = ll.llama_print_system_info().decode("utf-8", "replace").strip()
    info = parse_system_info(raw)
    return {
        "backends": list(info),
        "gpu_offload": bool(ll.llama_supports_gpu_offload()),
        "system_info": raw,
    }
