"""GPU sources: NVML first, torch.cuda second, Apple silicon's Metal GPU, none as the fallback.

Both optional libraries are imported inside the source, so a machine without
them (or without a driver) simply reports no GPU.
"""

from __future__ import annotations

import logging
import platform
from typing import Any, Protocol

import psutil

from ._host import sysctl_string
from ._profile import GpuInfo, PcieLink

log = logging.getLogger(__name__)


class GpuSource(Protocol):
    """Lists the GPUs one library can see.

    Contract: returns ``()`` when the library, the driver or the device is
    missing; a GPU-less machine is normal, never an error. Memory in bytes;
    ``pcie`` is filled when the source knows the link, else ``None``.
    """

    @property
    def name(self) -> str: ...

    def gpus(self) -> tuple[GpuInfo, ...]: ...


class NoGpuSource:
    """The machine has no GPU (or we were told not to look)."""

    name = "none"

    def gpus(self) -> tuple[GpuInfo, ...]:
        return ()


class NvmlGpuSource:
    """NVIDIA GPUs through NVML (the ``nvidia-ml-py`` package, module ``pynvml``)."""

    name = "nvml"

    def gpus(self) -> tuple[GpuInfo, ...]:
        try:
            import pynvml
        except ImportError:
            return ()
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:  # no driver: a normal CPU machine
            log.debug("NVML unavailable: %s", exc)
            return ()
        try:
            count = pynvml.nvmlDeviceGetCount()
            return tuple(
                self._one(pynvml, pynvml.nvmlDeviceGetHandleByIndex(i)) for i in range(count)
            )
        finally:
            pynvml.nvmlShutdown()

    @staticmethod
    def _one(nvml: Any, handle: Any) -> GpuInfo:
        name = nvml.nvmlDeviceGetName(handle)
        if isinstance(name, bytes):  # older bindings return bytes
            name = name.decode()
        mem = nvml.nvmlDeviceGetMemoryInfo(handle)
        try:
            pcie: PcieLink | None = PcieLink(
                gen_current=nvml.nvmlDeviceGetCurrPcieLinkGeneration(handle),
                gen_max=nvml.nvmlDeviceGetMaxPcieLinkGeneration(handle),
                width_current=nvml.nvmlDeviceGetCurrPcieLinkWidth(handle),
                width_max=nvml.nvmlDeviceGetMaxPcieLinkWidth(handle),
            )
        except nvml.NVMLError:  # SXM and some virtual GPUs do not report a link
            pcie = None
        return GpuInfo(str(name), int(mem.total), int(mem.free), pcie, "nvml")


class TorchGpuSource:
    """CUDA GPUs through ``torch.cuda``, when torch is installed with CUDA."""

    name = "torch"

    def gpus(self) -> tuple[GpuInfo, ...]:
        try:
            import torch
        except ImportError:
            return ()
        if not torch.cuda.is_available():
            return ()
        found = []
        for i in range(torch.cuda.device_count()):
            free, total = torch.cuda.mem_get_info(i)
            name = torch.cuda.get_device_properties(i).name
            found.append(GpuInfo(str(name), int(total), int(free), None, "torch"))
        return tuple(found)


class AppleGpuSource:
    """The GPU of an Apple-silicon Mac, which Metal runs on in the host's own RAM.

    Its memory is the host's (``unified=True``), so the policy counts the model
    and KV once, in host RAM, and sizes no pinned pool for a PCIe link that is
    not there. Answers ``()`` on any other system.
    """

    name = "metal"

    def __init__(self, system: str | None = None, machine: str | None = None) -> None:
        self._system = system if system is not None else platform.system()
        self._machine = machine if machine is not None else platform.machine()

    def gpus(self) -> tuple[GpuInfo, ...]:
        if self._system != "Darwin" or self._machine != "arm64":
            return ()
        vm = psutil.virtual_memory()
        name = sysctl_string("machdep.cpu.brand_string") or "Apple silicon GPU"
        return (GpuInfo(name, int(vm.total), int(vm.available), None, "metal", True),)


class FirstGpuSource:
    """Asks each source in turn and keeps the first non-empty answer."""

    def __init__(self, *sources: GpuSource) -> None:
        self._sources = sources
        self.name = "+".join(s.name for s in sources)

    def gpus(self) -> tuple[GpuInfo, ...]:
        for source in self._sources:
            found = source.gpus()
            if found:
                return found
        return ()
