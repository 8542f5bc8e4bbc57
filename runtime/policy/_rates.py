"""Restore and recompute rates: from a calibration, or estimated from the profile (pure).

A restore from RAM is bounded by ``llama_state_seq_set_data``, the RAM copy
and, with a GPU, the host-to-device link (the slowest of them sets the pace).
A restore from disk runs read, decompress and set one after the other, so
their times add up (rates combine in series).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ._types import ModelGeometry, Rates

if TYPE_CHECKING:  # the policy stays pure: only the shapes of the hardware data
    from ..hardware import Calibration, HardwareProfile, ZstdPoint

# Without a calibration: cautious guesses per disk kind (GB/s read, ms per record).
_DISK_GUESS = {"nvme": (2.0, 0.3), "ssd": (0.45, 0.5), "hdd": (0.12, 8.0), "unknown": (0.3, 2.0)}
_CPU_GBPS_GUESS = 4.0  # state set_data on a CPU build (4 to 6 GB/s measured on 2 cores)
_FIXED_MS_GUESS = 0.5  # one set_data call plus the seq_cp that places the chunk
_LINK_EFFICIENCY = 0.8  # pinned DMA reaches about 80% of the nominal PCIe rate
_DEFAULT_LINK_GBPS = 7.9  # PCIe 3.0 x8: the least a discrete GPU is likely to get
# Effective TFLOPS of a prefill by GPU name fragment (dense fp16, at typical efficiency).
_GPU_TFLOPS = (("H200", 300.0), ("H100", 250.0), ("A100", 100.0), ("L40", 60.0),
               ("4090", 55.0), ("3090", 25.0), ("A10", 20.0))  # fmt: skip
_DEFAULT_GPU_TFLOPS = 10.0
_APPLE_GPU_TFLOPS = 4.0  # an M1/M2-class GPU at typical prefill efficiency; Max/Ultra do more
_CPU_CORE_GFLOPS = (("avx512f", 30.0), ("avx2", 15.0), ("neon", 10.0), ("asimd", 10.0))
_BYTES_PER_PARAM = 0.6  # a Q4 GGUF stores about 4.5 to 5 bits a weight
_CAPTURE_MARGIN = 2.0  # compression must run at twice the rate prefill produces KV
_MIN_SAVING = 0.95  # a level must shrink KV to at most 95%
_MAX_SLOWDOWN = 0.9  # and restore at no less than 90% of a raw read


def series(*gbps: float) -> float:
    """The rate of stages run one after the other (their times add)."""
    if any(g <= 0 for g in gbps):
        return 0.0
    return 1.0 / sum(1.0 / g for g in gbps)


def disk_stage_gbps(read_gbps: float, point: ZstdPoint | None) -> float:
    """Uncompressed GB/s out of disk read plus decompression (raw when ``point`` is None)."""
    if point is None:
        return read_gbps
    # The disk reads ratio bytes per KV byte, so it delivers read/ratio KV bytes a second.
    return series(read_gbps / max(point.ratio, 1e-6), point.decompress_gbps)


def ram_gbps(calibration: Calibration) -> float:
    bounds = [calibration.state_set_gbps, calibration.ram_copy_gbps]
    if calibration.h2d_pinned_gbps is not None:  # the pool is pinned when CUDA is present
        bounds.append(calibration.h2d_pinned_gbps)
    return min(bounds)


def rates_from(calibration: Calibration, zstd_level: int | None = None) -> Rates:
    """The rates :func:`~runtime.policy.decide_restore` needs, from measurements.

    ``zstd_level`` is the disk codec level in use (0 = raw); ``None`` means the
    level the policy would choose from this calibration.
    """
    if zstd_level is None:
        zstd_level = choose_zstd_level(calibration)[0]
    ram = ram_gbps(calibration)
    point = calibration.zstd_at(zstd_level) if zstd_level else None
    disk = series(disk_stage_gbps(calibration.disk_read_gbps, point), ram)
    return Rates(
        prefill_tps=calibration.prefill_tps,
        tier_gbps={"ram": ram, "disk": disk},
        fixed_ms={
            "ram": calibration.state_fixed_ms,
            "disk": calibration.state_fixed_ms + calibration.disk_fixed_ms,
        },
    )


def _zstd_refusal(p: ZstdPoint, read: float, capture: float) -> str | None:
    """Why level ``p`` does not pay on this machine, or None when it does."""
    if p.decompress_gbps <= read:
        return (
            f"the disk reads {read:.2f} GB/s, faster than zstd -{p.level} "
            f"decompresses ({p.decompress_gbps:.2f} GB/s)"
        )
    if p.compress_gbps < _CAPTURE_MARGIN * capture:
        return f"zstd -{p.level} compresses {p.compress_gbps:.2f} GB/s, too slow for capture"
    if p.ratio > _MIN_SAVING:
        return f"KV compresses poorly (ratio {p.ratio:.2f})"
    if disk_stage_gbps(read, p) < _MAX_SLOWDOWN * read:
        return f"read + decompress ({disk_stage_gbps(read, p):.2f} GB/s) is slower than raw"
    return None


def choose_zstd_level(calibration: Calibration) -> tuple[int, str]:
    """The disk codec level and why: 0 (raw) unless compression saves space almost for free.

    A level qualifies when decompression outruns the disk, compression keeps
    up with capture at full prefill speed, it saves at least 5% and a restore
    through it stays within 10% of a raw read. Among those, the best ratio.
    """
    read = calibration.disk_read_gbps
    capture = calibration.prefill_tps * calibration.kv_bytes_per_token / 1e9
    if not calibration.zstd:
        return 0, "zstd not measured: store raw"
    refusals = {p.level: _zstd_refusal(p, read, capture) for p in calibration.zstd}
    good = [p for p in calibration.zstd if refusals[p.level] is None]
    if not good:
        first = min(calibration.zstd, key=lambda p: p.level)
        return 0, f"store raw: {refusals[first.level]}"
    best = min(good, key=lambda p: (round(p.ratio, 2), p.level))
    return best.level, (
        f"zstd -{best.level} saves {1 - best.ratio:.0%} of disk and restores at "
        f"{disk_stage_gbps(read, best):.2f} GB/s against {read:.2f} GB/s raw"
    )


@dataclass(frozen=True)
class Estimate:
    rates: Rates
    basis: str  # one phrase: where the numbers came from


def _prefill_guess(profile: HardwareProfile, geometry: ModelGeometry) -> float:
    flops_per_token = 2.0 * geometry.model_bytes / _BYTES_PER_PARAM
    if profile.offloads and profile.gpu is not None:
        name = profile.gpu.name
        tflops = next((t for key, t in _GPU_TFLOPS if key in name), _DEFAULT_GPU_TFLOPS)
        return tflops * 1e12 / flops_per_token
    if profile.unified_memory:
        return _APPLE_GPU_TFLOPS * 1e12 / flops_per_token
    flags = set(profile.cpu.flags)
    per_core = next((g for flag, g in _CPU_CORE_GFLOPS if flag in flags), 5.0)
    return profile.cpu.physical_cores * per_core * 1e9 / flops_per_token


def estimate_rates(profile: HardwareProfile, geometry: ModelGeometry) -> Estimate:
    """Cautious rates from the profile alone, for use before calibration."""
    disk_gbps, disk_ms = _DISK_GUESS.get(profile.disk.kind, _DISK_GUESS["unknown"])
    gpu = profile.gpu if profile.offloads else None
    if gpu is not None:
        link = gpu.pcie.gbps if gpu.pcie is not None and gpu.pcie.gbps > 0 else _DEFAULT_LINK_GBPS
        ram = link * _LINK_EFFICIENCY
        basis = f"estimated from PCIe {link:.1f} GB/s nominal"
    elif profile.unified_memory:
        ram = _CPU_GBPS_GUESS  # set_data copies within one RAM: no link to bound it
        basis = "estimated for unified memory (Metal), no PCIe link"
    else:
        ram = _CPU_GBPS_GUESS
        basis = "estimated for a CPU build"
    rates = Rates(
        prefill_tps=_prefill_guess(profile, geometry),
        tier_gbps={"ram": ram, "disk": series(disk_gbps, ram)},
        fixed_ms={"ram": _FIXED_MS_GUESS, "disk": _FIXED_MS_GUESS + disk_ms},
    )
    return Estimate(rates, basis + " (not measured)")
