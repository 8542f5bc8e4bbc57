"""The hardware probe and the calibration: what this machine is and how fast it runs the model.

``probe(cache_dir)`` describes the machine through small sources (NVML,
torch or Apple silicon for GPUs, sysfs for PCIe and the cache disk, psutil for
RAM, /proc for the CPU; on Windows and macOS the Linux-only ones report
less); tests pass recorded sources instead. ``load_or_calibrate`` measures the
loaded model once per (machine, model) and caches the result.
"""

from ._calibrate import (
    Calibration,
    CalibrationTarget,
    Progress,
    cached_calibration,
    calibrate,
    load_or_calibrate,
)
from ._gpu import (
    AppleGpuSource,
    FirstGpuSource,
    GpuSource,
    NoGpuSource,
    NvmlGpuSource,
    TorchGpuSource,
)
from ._host import (
    BackendSource,
    CpuSource,
    LlamaBackendSource,
    MemorySource,
    ProcCpuSource,
    PsutilMemorySource,
)
from ._measure import ZstdPoint
from ._probe import Sources, default_sources, probe
from ._profile import (
    Backend,
    CpuInfo,
    DiskInfo,
    DiskKind,
    GpuInfo,
    HardwareProfile,
    MemoryInfo,
    PcieLink,
)
from ._recorded import (
    RecordedBackendSource,
    RecordedCpuSource,
    RecordedDiskSource,
    RecordedGpuSource,
    RecordedMemorySource,
    RecordedPcieSource,
    recorded_sources,
)
from ._sysfs import DiskSource, PcieSource, SysfsDiskSource, SysfsPcieSource

__all__ = [
    "AppleGpuSource",
    "Backend",
    "BackendSource",
    "Calibration",
    "CalibrationTarget",
    "CpuInfo",
    "CpuSource",
    "DiskInfo",
    "DiskKind",
    "DiskSource",
    "FirstGpuSource",
    "GpuInfo",
    "GpuSource",
    "HardwareProfile",
    "LlamaBackendSource",
    "MemoryInfo",
    "MemorySource",
    "NoGpuSource",
    "NvmlGpuSource",
    "PcieLink",
    "PcieSource",
    "ProcCpuSource",
    "Progress",
    "PsutilMemorySource",
    "RecordedBackendSource",
    "RecordedCpuSource",
    "RecordedDiskSource",
    "RecordedGpuSource",
    "RecordedMemorySource",
    "RecordedPcieSource",
    "Sources",
    "SysfsDiskSource",
    "SysfsPcieSource",
    "TorchGpuSource",
    "ZstdPoint",
    "cached_calibration",
    "calibrate",
    "default_sources",
    "load_or_calibrate",
    "probe",
    "recorded_sources",
]
