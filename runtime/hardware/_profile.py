"""What the probe found: plain, immutable data with a JSON form (no I/O here).

Sizes are bytes, rates GB/s (1e9 bytes per second). A machine without a GPU
has ``gpus == ()``; that is a normal profile, not an error.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

DiskKind = Literal["nvme", "ssd", "hdd", "unknown"]
Backend = Literal["cuda", "metal", "vulkan", "cpu", "unknown"]

# Usable bandwidth per lane in GB/s after line coding (128b/130b from gen 3 on).
_LANE_GBPS = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}


@dataclass(frozen=True)
class PcieLink:
    """A PCIe link; generation and width as negotiated now and at most."""

    gen_current: int
    gen_max: int
    width_current: int
    width_max: int

    @property
    def gbps(self) -> float:
        """Nominal one-way bandwidth of the link when busy.

        GPUs drop to a lower generation while idle to save power and go back up
        under load, so the maximum generation counts; the width does not change
        with load, so the current (negotiated) width counts.
        """
        gen = max(self.gen_current, self.gen_max)
        return _LANE_GBPS.get(gen, 0.0) * max(self.width_current, 0)


@dataclass(frozen=True)
class GpuInfo:
    name: str
    vram_total: int
    vram_free: int
    pcie: PcieLink | None = None
    source: str = ""  # "nvml", "torch" or "metal": which source answered
    # Apple silicon: the GPU shares host RAM (vram_* are the host's); no PCIe link
    unified: bool = False


@dataclass(frozen=True)
class MemoryInfo:
    total: int
    available: int
    swap_total: int = 0
    swap_free: int = 0


@dataclass(frozen=True)
class DiskInfo:
    """The disk that holds the cache directory."""

    path: str
    total: int
    free: int
    kind: DiskKind = "unknown"
    device: str = ""  # block device name, e.g. "nvme0n1"; "" when unknown


@dataclass(frozen=True)
class CpuInfo:
    model: str
    logical_cores: int
    physical_cores: int
    flags: tuple[str, ...] = ()


@dataclass(frozen=True)
class HardwareProfile:
    """One machine as the probe saw it, before the model is loaded."""

    cpu: CpuInfo
    memory: MemoryInfo
    disk: DiskInfo
    gpus: tuple[GpuInfo, ...] = ()
    backend: Backend = "cpu"
    notes: tuple[str, ...] = field(default=(), compare=False)  # what a source could not read

    @property
    def gpu(self) -> GpuInfo | None:
        """The GPU llama.cpp uses (the first), or ``None``."""
        return self.gpus[0] if self.gpus else None

    @property
    def offloads(self) -> bool:
        """True when the model and its KV sit in discrete GPU memory."""
        return self.gpu is not None and not self.gpu.unified and self.backend in ("cuda", "vulkan")

    @property
    def unified_memory(self) -> bool:
        """True on Apple silicon with Metal: the GPU computes on host RAM, no link to cross."""
        return self.gpu is not None and self.gpu.unified and self.backend == "metal"

    def machine_id(self) -> str:
        """A hash of the parts that do not change between runs of one machine.

        Free memory and free disk move all the time and are left out; RAM is
        rounded to GiB because the kernel's reservations shift it by megabytes.
        The cache disk's device is in: disk speeds are measured on it.
        """
        stable = {
            "cpu": [self.cpu.model, self.cpu.logical_cores, self.cpu.physical_cores],
            "ram_gib": round(self.memory.total / (1 << 30)),
            "gpus": [[g.name, round(g.vram_total / (1 << 30))] for g in self.gpus],
            "backend": self.backend,
            "disk": [self.disk.device, self.disk.kind],
        }
        blob = json.dumps(stable, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        for gpu, raw in zip(self.gpus, data["gpus"], strict=True):
            if gpu.pcie is not None:
                raw["pcie"]["gbps"] = round(gpu.pcie.gbps, 3)
        data["machine_id"] = self.machine_id()
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HardwareProfile:
        """Inverse of :meth:`to_dict` (derived keys are ignored)."""
        gpus = []
        for raw in data.get("gpus", ()):
            raw = dict(raw)
            pcie = raw.pop("pcie", None)
            if pcie is not None:
                pcie = PcieLink(**{k: v for k, v in pcie.items() if k != "gbps"})
            gpus.append(GpuInfo(pcie=pcie, **raw))
        cpu = dict(data["cpu"])
        cpu["flags"] = tuple(cpu.get("flags", ()))
        return cls(
            cpu=CpuInfo(**cpu),
            memory=MemoryInfo(**data["memory"]),
            disk=DiskInfo(**data["disk"]),
            gpus=tuple(gpus),
            backend=data.get("backend", "cpu"),
            notes=tuple(data.get("notes", ())),
        )
