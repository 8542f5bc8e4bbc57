"""Micro-benchmarks that need no model: RAM copy, disk, zstd, host<->device.

Each one is short (well under a second on a slow laptop) and returns plain
numbers; rates are GB/s (1e9 bytes per second) of uncompressed bytes.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import zstandard

from ..errors import DiskFull

log = logging.getLogger(__name__)
MiB = 1 << 20
_ZSTD_SAMPLE = 16 * MiB  # enough for a stable ratio; level 9 on more would blow the budget


@dataclass(frozen=True)
class ZstdPoint:
    """zstd at one level on real KV bytes (single thread)."""

    level: int
    ratio: float  # compressed / raw
    compress_gbps: float
    decompress_gbps: float


@dataclass(frozen=True)
class DiskRates:
    write_gbps: float
    read_gbps: float
    read_cold: bool  # False: the page cache may have served the read (optimistic)
    fixed_ms: float  # open + read + close of one small record


def _best_seconds(run: Callable[[], object], min_total: float = 0.05, max_reps: int = 5) -> float:
    """Fastest of a few runs: the minimum is the least disturbed by other work."""
    best, spent, reps = float("inf"), 0.0, 0
    while reps < max_reps and (reps == 0 or spent < min_total):
        t0 = time.perf_counter()
        run()
        took = time.perf_counter() - t0
        best, spent, reps = min(best, took), spent + took, reps + 1
    return max(best, 1e-9)


def ram_copy_gbps(nbytes: int = 64 * MiB) -> float:
    src = np.ones(nbytes, dtype=np.uint8)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # first touch faults the pages in; not what we measure
    return nbytes / _best_seconds(lambda: np.copyto(dst, src)) / 1e9


def zstd_points(sample: bytes, levels: tuple[int, ...]) -> tuple[ZstdPoint, ...]:
    """Ratio and speed per level on (up to 16 MiB of) ``sample``."""
    data = sample[:_ZSTD_SAMPLE]
    if not data:
        return ()
    points = []
    decompressor = zstandard.ZstdDecompressor()
    for level in levels:
        compressor = zstandard.ZstdCompressor(level=level)
        packed = compressor.compress(data)
        c_s = _best_seconds(partial(compressor.compress, data), max_reps=3)
        d_s = _best_seconds(partial(decompressor.decompress, packed))
        points.append(
            ZstdPoint(level, len(packed) / len(data), len(data) / c_s / 1e9, len(data) / d_s / 1e9)
        )
    return tuple(points)


def _drop_cache(fd: int) -> bool:
    """Asks the kernel to forget the file's pages so the next read hits the disk."""
    if not hasattr(os, "posix_fadvise"):  # macOS, Windows: the read stays optimistic
        return False
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    return True


def _small_read_ms(path: Path, cold: bool) -> float:
    with path.open("rb") as f:
        if cold:
            _drop_cache(f.fileno())
    t0 = time.perf_counter()
    with path.open("rb") as f:
        f.read(64 * 1024)
    return (time.perf_counter() - t0) * 1000


def disk_rates(cache_dir: Path, nbytes: int = 64 * MiB) -> DiskRates:
    """Writes ``nbytes`` with fsync in ``cache_dir``, reads it back, removes it."""
    cache_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    block = os.urandom(MiB)  # random: a compressing filesystem must not flatter us
    fd, name = tempfile.mkstemp(prefix=".calibrate-", dir=cache_dir)
    path = Path(name)
    try:
        t0 = time.perf_counter()
        try:
            for _ in range(nbytes // MiB):
                os.write(fd, block)
            os.fsync(fd)
        except OSError as exc:
            raise DiskFull(f"cannot write the calibration file in {cache_dir}: {exc}") from exc
        write_s = time.perf_counter() - t0
        cold = _drop_cache(fd)
        os.close(fd)
        fd = -1
        t0 = time.perf_counter()
        with path.open("rb", buffering=0) as f:
            while f.read(4 * MiB):
                pass
        read_s = time.perf_counter() - t0
        fixed = _small_read_ms(path, cold)
    finally:
        if fd >= 0:
            os.close(fd)
        path.unlink(missing_ok=True)
    return DiskRates(nbytes / write_s / 1e9, nbytes / read_s / 1e9, cold, fixed)


def host_device_gbps(nbytes: int = 64 * MiB) -> dict[str, float] | None:
    """H2D and D2H GB/s from pinned and pageable host memory, through torch.

    ``None`` when torch with CUDA is not importable: llama.cpp does its own
    copies, torch is only a ruler here and stays optional.
    """
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    device = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    hosts = {
        "pinned": torch.empty(nbytes, dtype=torch.uint8, pin_memory=True),
        "pageable": torch.empty(nbytes, dtype=torch.uint8),
    }
    rates: dict[str, float] = {}
    for kind, host in hosts.items():
        for direction, dst, src in (("h2d", device, host), ("d2h", host, device)):

            def copy(dst: object = dst, src: object = src) -> None:
                dst.copy_(src, non_blocking=True)  # type: ignore[attr-defined]
                torch.cuda.synchronize()

            copy()  # warm-up: the first copy pays for mapping and context setup
            rates[f"{direction}_{kind}"] = nbytes / _best_seconds(copy) / 1e9
    return rates
