"""The probe: asks each source once and assembles a :class:`HardwareProfile`.

Every source sits behind a small Protocol, so tests (and ``doctor`` on a
recorded machine) pass :class:`~runtime.hardware.RecordedSources` instead.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TypeVar

from ._gpu import AppleGpuSource, FirstGpuSource, GpuSource, NvmlGpuSource, TorchGpuSource
from ._host import (
    BackendSource,
    CpuSource,
    LlamaBackendSource,
    MemorySource,
    ProcCpuSource,
    PsutilMemorySource,
)
from ._profile import Backend, CpuInfo, DiskInfo, GpuInfo, HardwareProfile, PcieLink
from ._sysfs import DiskSource, PcieSource, SysfsDiskSource, SysfsPcieSource

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class Sources:
    """One source per question the probe asks."""

    gpu: GpuSource
    pcie: PcieSource
    memory: MemorySource
    disk: DiskSource
    cpu: CpuSource
    backend: BackendSource


def default_sources(sys_root: Path = Path("/sys")) -> Sources:
    """The real machine: NVML, torch, then Apple silicon for GPUs; sysfs, psutil and /proc
    for the rest (each degrades to "unknown" where the OS has no such file)."""
    return Sources(
        gpu=FirstGpuSource(NvmlGpuSource(), TorchGpuSource(), AppleGpuSource()),
        pcie=SysfsPcieSource(sys_root),
        memory=PsutilMemorySource(),
        disk=SysfsDiskSource(sys_root),
        cpu=ProcCpuSource(),
        backend=LlamaBackendSource(),
    )


def _ask(what: str, call: Callable[[], T], fallback: T, notes: list[str]) -> T:
    # A probe that dies on an odd driver is worse than one with a gap: the
    # policy copes with gaps (cautious estimates) and doctor shows the note.
    try:
        return call()
    except Exception as exc:
        log.warning("hardware probe: cannot read %s: %s", what, exc)
        notes.append(f"{what}: {exc}")
        return fallback


def _with_links(gpus: tuple[GpuInfo, ...], links: tuple[PcieLink, ...]) -> tuple[GpuInfo, ...]:
    """Fills GPUs whose source knows no link with sysfs links, in bus order."""
    if not links:
        return gpus
    return tuple(
        g if g.pcie is not None or i >= len(links) else replace(g, pcie=links[i])
        for i, g in enumerate(gpus)
    )


def probe(cache_dir: Path, sources: Sources | None = None) -> HardwareProfile:
    """Describes this machine; call it before the model is loaded.

    ``cache_dir`` is the KV cache directory (it need not exist yet): its disk is
    the one measured. Never raises for a missing GPU, library or sysfs file;
    what could not be read is listed in ``profile.notes``.
    """
    src = sources if sources is not None else default_sources()
    notes: list[str] = []
    no_gpus: tuple[GpuInfo, ...] = ()
    no_links: tuple[PcieLink, ...] = ()
    gpus = _ask("gpu", src.gpu.gpus, no_gpus, notes)
    links = _ask("pcie", src.pcie.links, no_links, notes) if gpus else no_links
    memory = src.memory.memory()
    disk = _ask("disk", lambda: src.disk.disk(cache_dir), DiskInfo(str(cache_dir), 0, 0), notes)
    cpu = _ask("cpu", src.cpu.cpu, CpuInfo("", 1, 1), notes)
    unknown: Backend = "unknown"
    backend = _ask("backend", src.backend.backend, unknown, notes)
    profile = HardwareProfile(cpu, memory, disk, _with_links(gpus, links), backend, tuple(notes))
    log.debug("hardware profile: %s", profile)
    return profile
