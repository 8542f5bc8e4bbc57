"""Host memory (psutil), CPU (os and /proc/cpuinfo) and the llama.cpp build's backend."""

from __future__ import annotations

import importlib.util
import os
import platform
import subprocess
from pathlib import Path
from typing import Protocol

import psutil

from ._profile import Backend, CpuInfo, MemoryInfo

# CPU features that change llama.cpp's speed; the rest of the flag list is noise.
_INTERESTING_FLAGS = frozenset(
    {"avx", "avx2", "avx512f", "avx512_bf16", "avx512_vnni", "avx_vnni", "amx_tile",
     "f16c", "fma", "sse4_2", "neon", "asimd", "asimddp", "sve", "i8mm"}
)  # fmt: skip
# Shared-library stems that llama-cpp-python builds for each ggml backend.
_BACKEND_LIBS: tuple[tuple[str, Backend], ...] = (
    ("ggml-cuda", "cuda"),
    ("ggml-metal", "metal"),
    ("ggml-vulkan", "vulkan"),
)


class MemorySource(Protocol):
    """Host RAM and swap, in bytes. Contract: always answers."""

    def memory(self) -> MemoryInfo: ...


class CpuSource(Protocol):
    """CPU model, core counts and the flags that matter. Contract: always answers."""

    def cpu(self) -> CpuInfo: ...


class BackendSource(Protocol):
    """The compute backend llama.cpp was built with: cuda, metal, vulkan, cpu.

    Contract: ``"unknown"`` when llama.cpp is not installed; never imports it
    (loading the library is the engine's business).
    """

    def backend(self) -> Backend: ...


class PsutilMemorySource:
    def memory(self) -> MemoryInfo:
        vm = psutil.virtual_memory()
        sw = psutil.swap_memory()
        return MemoryInfo(int(vm.total), int(vm.available), int(sw.total), int(sw.free))


def parse_cpuinfo(text: str) -> tuple[str, tuple[str, ...]]:
    """Model name and interesting flags from ``/proc/cpuinfo`` text (x86 or ARM)."""
    model, flags = "", set[str]()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key in ("model name", "hardware", "cpu model") and not model:
            model = value.strip()
        elif key in ("flags", "features") and not flags:
            flags = set(value.split()) & _INTERESTING_FLAGS
    return model, tuple(sorted(flags))


class ProcCpuSource:
    def __init__(self, cpuinfo: Path = Path("/proc/cpuinfo")) -> None:
        self._cpuinfo = cpuinfo

    def cpu(self) -> CpuInfo:
        try:
            model, flags = parse_cpuinfo(self._cpuinfo.read_text(errors="replace"))
        except OSError:  # not Linux: fall back to sysctl (macOS) or the platform module
            model, flags = sysctl_string("machdep.cpu.brand_string"), ()
        logical = os.cpu_count() or 1
        physical = psutil.cpu_count(logical=False) or logical
        return CpuInfo(
            model or platform.processor() or platform.machine(), logical, physical, flags
        )


def sysctl_string(name: str) -> str:
    """A sysctl value (macOS, BSD); "" where there is no sysctl or no such name."""
    try:
        proc = subprocess.run(
            ["sysctl", "-n", name], capture_output=True, text=True, timeout=5, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    return proc.stdout.strip()


class LlamaBackendSource:
    """Reads the backend from the shared libraries shipped inside ``llama_cpp``."""

    def backend(self) -> Backend:
        spec = importlib.util.find_spec("llama_cpp")
        if spec is None or not spec.submodule_search_locations:
            return "unknown"
        lib_dir = Path(next(iter(spec.submodule_search_locations))) / "lib"
        names = [p.name for p in lib_dir.glob("*")] if lib_dir.is_dir() else []
        return backend_from_libs(names, platform.system(), platform.machine())


def backend_from_libs(names: list[str], system: str, machine: str) -> Backend:
    """The best backend among the library file names found."""
    for stem, backend in _BACKEND_LIBS:
        if any(stem in name for name in names):
            return backend
    if system == "Darwin" and machine == "arm64":  # Metal is compiled in by default there
        return "metal"
    return "cpu"
