"""Recorded machines and their calibrations, shared by the hardware, policy and doctor tests.

The four machines of issue 3, as a probe would have seen them before the
model was loaded, with calibrations of an 8B Q4 model at plausible speeds;
and (issue 12) a Windows desktop and an Apple-silicon Mac, as the probe sees
them there: no /proc (no CPU flags), no sysfs (disk kind unknown, no device).
"""

from __future__ import annotations

from dataclasses import replace

from warmstart.runtime.hardware import (
    Calibration,
    CpuInfo,
    DiskInfo,
    GpuInfo,
    HardwareProfile,
    MemoryInfo,
    PcieLink,
    ZstdPoint,
)
from warmstart.runtime.policy import ModelGeometry

GiB = 1 << 30
TB = 10**12

LLAMA_8B = ModelGeometry(n_ctx_train=131072, n_layer=32, kv_bytes_per_token=131072,
                         model_bytes=4_920_000_000)  # fmt: skip
SMOLLM_135M = ModelGeometry(n_ctx_train=8192, n_layer=30, kv_bytes_per_token=23052,
                            model_bytes=98_362_432)  # fmt: skip

LAPTOP = HardwareProfile(
    cpu=CpuInfo("Intel(R) Core(TM) i7-1260P", 16, 12, ("avx2", "f16c", "fma")),
    memory=MemoryInfo(total=16 * GiB, available=11 * GiB, swap_total=8 * GiB, swap_free=8 * GiB),
    disk=DiskInfo(
        "/home/u/.local/share/warmstart/cache", 512 * 10**9, 200 * 10**9, "nvme", "nvme0n1"
    ),
    backend="cpu",
)
RTX4090 = HardwareProfile(
    cpu=CpuInfo("AMD Ryzen 9 7950X", 32, 16, ("avx2", "avx512f", "f16c", "fma")),
    memory=MemoryInfo(total=64 * GiB, available=52 * GiB, swap_total=8 * GiB, swap_free=8 * GiB),
    disk=DiskInfo("/home/u/.cache/warmstart", 2 * TB, 1 * TB, "nvme", "nvme0n1"),
    gpus=(GpuInfo("NVIDIA GeForce RTX 4090", 24 * GiB, 23 * GiB, PcieLink(1, 4, 16, 16), "nvml"),),
    backend="cuda",
)
H100 = HardwareProfile(
    cpu=CpuInfo("Intel(R) Xeon(R) Platinum 8480+", 112, 56, ("avx2", "avx512f", "amx_tile")),
    memory=MemoryInfo(total=512 * GiB, available=480 * GiB),
    disk=DiskInfo("/var/lib/warmstart/cache", 4 * TB, 3 * TB, "nvme", "nvme1n1"),
    gpus=(GpuInfo("NVIDIA H100 PCIe", 80 * GiB, 79 * GiB, PcieLink(5, 5, 16, 16), "nvml"),),
    backend="cuda",
)
SMALL_GPU = HardwareProfile(
    cpu=CpuInfo("Intel(R) Core(TM) i5-9400F", 6, 6, ("avx2", "fma")),
    memory=MemoryInfo(total=32 * GiB, available=26 * GiB, swap_total=2 * GiB, swap_free=2 * GiB),
    disk=DiskInfo("/home/u/.cache/warmstart", 1 * TB, 400 * 10**9, "ssd", "sda"),
    gpus=(GpuInfo("NVIDIA GeForce RTX 3060 Ti", 8 * GiB, 7 * GiB, PcieLink(3, 3, 8, 16), "nvml"),),
    backend="cuda",
)
# Windows: platform.processor() names the CPU; NVML still reports the GPU and its link.
WINDOWS = HardwareProfile(
    cpu=CpuInfo("Intel64 Family 6 Model 183 Stepping 1, GenuineIntel", 24, 16),
    memory=MemoryInfo(total=32 * GiB, available=21 * GiB, swap_total=5 * GiB, swap_free=5 * GiB),
    disk=DiskInfo(r"C:\Users\u\AppData\Local\warmstart\cache", 1 * TB, 600 * 10**9),
    gpus=(GpuInfo("NVIDIA GeForce RTX 4070", 12 * GiB, 11 * GiB, PcieLink(1, 4, 16, 16), "nvml"),),
    backend="cuda",
)
# Apple silicon: sysctl names the chip; Metal computes in the host's own (unified) RAM.
MAC_M2 = HardwareProfile(
    cpu=CpuInfo("Apple M2 Pro", 12, 12),
    memory=MemoryInfo(total=32 * GiB, available=19 * GiB, swap_total=0, swap_free=0),
    disk=DiskInfo("/Users/u/Library/Application Support/warmstart/cache", 1 * TB, 400 * 10**9),
    gpus=(GpuInfo("Apple M2 Pro", 32 * GiB, 19 * GiB, None, "metal", unified=True),),
    backend="metal",
)
# (issue 14) The most common Apple-silicon machine: 16 GB, of which macOS leaves ~10 free.
MAC_M2_16 = HardwareProfile(
    cpu=CpuInfo("Apple M2", 8, 8),
    memory=MemoryInfo(total=16 * GiB, available=10 * GiB, swap_total=0, swap_free=0),
    disk=DiskInfo("/Users/u/Library/Application Support/warmstart/cache", 512 * 10**9,
                  200 * 10**9),
    gpus=(GpuInfo("Apple M2", 16 * GiB, 10 * GiB, None, "metal", unified=True),),
    backend="metal",
)  # fmt: skip
MACHINES = {"laptop": LAPTOP, "rtx4090": RTX4090, "h100": H100, "small_gpu": SMALL_GPU,
            "windows": WINDOWS, "mac_m2": MAC_M2, "mac_m2_16": MAC_M2_16}  # fmt: skip

_ZSTD_FP16 = (
    ZstdPoint(1, 0.91, 0.5, 0.9),
    ZstdPoint(3, 0.90, 0.3, 0.9),
    ZstdPoint(9, 0.89, 0.05, 0.9),
)


def calibration_for(profile: HardwareProfile, **measured: object) -> Calibration:
    """A plausible calibration of LLAMA_8B on ``profile``; keywords replace figures."""
    base = replace(_BASES[profile.cpu.model], machine_id=profile.machine_id())
    return replace(base, **measured)  # type: ignore[arg-type]


def _cal(profile: HardwareProfile, tps: float, state: float, ram: float, link: float | None,
         disk: tuple[float, float], fixed_ms: float) -> Calibration:  # fmt: skip
    short, long = (64, 256) if link is None else (512, 2048)
    return Calibration(
        machine_id=profile.machine_id(),
        fingerprint="ab" * 32,
        kv_bytes_per_token=LLAMA_8B.kv_bytes_per_token,
        prefill_short_tokens=short,
        prefill_short_s=0.01 + short / tps,
        prefill_long_tokens=long,
        prefill_long_s=0.01 + long / tps,
        state_get_gbps=state / 2,
        state_set_gbps=state,
        state_fixed_ms=fixed_ms,
        ram_copy_gbps=ram,
        disk_write_gbps=disk[0],
        disk_read_gbps=disk[1],
        disk_fixed_ms=0.1,
        zstd=_ZSTD_FP16,
        h2d_pinned_gbps=link,
        h2d_pageable_gbps=None if link is None else link / 2,
        d2h_pinned_gbps=link,
        d2h_pageable_gbps=None if link is None else link / 2,
        seconds=8.0,
    )


_BASES = {
    LAPTOP.cpu.model: _cal(LAPTOP, 60.0, 5.0, 12.0, None, (1.5, 3.0), 0.05),
    RTX4090.cpu.model: _cal(RTX4090, 9000.0, 20.0, 25.0, 24.0, (4.0, 6.0), 0.5),
    H100.cpu.model: _cal(H100, 20000.0, 40.0, 30.0, 50.0, (5.0, 7.0), 0.5),
    SMALL_GPU.cpu.model: _cal(SMALL_GPU, 2500.0, 6.0, 15.0, 6.0, (0.45, 0.5), 0.5),
    WINDOWS.cpu.model: _cal(WINDOWS, 5000.0, 12.0, 20.0, 20.0, (1.5, 2.5), 0.5),
    MAC_M2.cpu.model: _cal(MAC_M2, 900.0, 25.0, 60.0, None, (3.0, 5.0), 0.1),
    MAC_M2_16.cpu.model: _cal(MAC_M2_16, 450.0, 20.0, 50.0, None, (2.5, 4.0), 0.1),
}
