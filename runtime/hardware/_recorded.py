"""Recorded machines: sources that replay a stored profile (for tests and doctor --profile).

They implement the same Protocols as the real sources, so the probe runs
unchanged on them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from ._probe import Sources
from ._profile import (
    Backend,
    CpuInfo,
    DiskInfo,
    GpuInfo,
    HardwareProfile,
    MemoryInfo,
    PcieLink,
)


@dataclass(frozen=True)
class RecordedGpuSource:
    recorded: tuple[GpuInfo, ...] = ()
    name: str = "recorded"

    def gpus(self) -> tuple[GpuInfo, ...]:
        return self.recorded


@dataclass(frozen=True)
class RecordedPcieSource:
    recorded: tuple[PcieLink, ...] = ()

    def links(self) -> tuple[PcieLink, ...]:
        return self.recorded


@dataclass(frozen=True)
class RecordedMemorySource:
    recorded: MemoryInfo

    def memory(self) -> MemoryInfo:
        return self.recorded


@dataclass(frozen=True)
class RecordedDiskSource:
    """Replays one disk for any path (the path asked for is kept)."""

    recorded: DiskInfo

    def disk(self, path: Path) -> DiskInfo:
        return replace(self.recorded, path=str(path))


@dataclass(frozen=True)
class RecordedCpuSource:
    recorded: CpuInfo

    def cpu(self) -> CpuInfo:
        return self.recorded


@dataclass(frozen=True)
class RecordedBackendSource:
    recorded: Backend = "cpu"

    def backend(self) -> Backend:
        return self.recorded


def recorded_sources(profile: HardwareProfile) -> Sources:
    """Sources that make :func:`~runtime.hardware.probe` return ``profile`` again."""
    return Sources(
        gpu=RecordedGpuSource(profile.gpus),
        pcie=RecordedPcieSource(),
        memory=RecordedMemorySource(profile.memory),
        disk=RecordedDiskSource(profile.disk),
        cpu=RecordedCpuSource(profile.cpu),
        backend=RecordedBackendSource(profile.backend),
    )
