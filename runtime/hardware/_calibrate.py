"""Calibration: a short measurement of this machine running this model.

About 10 s on a 2-core CPU box, cached as JSON per (machine id, model
fingerprint) and redone when either changes or on request. The model side is
reached only through :class:`CalibrationTarget`, which the engine implements.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from ..errors import DiskFull, WarmstartError
from ._measure import (
    DiskRates,
    MiB,
    ZstdPoint,
    disk_rates,
    host_device_gbps,
    ram_copy_gbps,
    zstd_points,
)
from ._profile import HardwareProfile

log = logging.getLogger(__name__)

# 3: the KV caches' layout (kv_layout) is kept too, so a start needs no probe decode
# (2 was a development format that kept a byte count instead). 4: batch invariance
# (merge_unit, merge_max) is measured too. 5: for every chunk size policy may pick
# under MERGE_MAX (merge_units), not for 64-token chunks only. 6: batch kinds
# (batch_tile) are measured too. 7: batched decode (decode_batch) is proven too.
FORMAT_VERSION = 7
ZSTD_LEVELS = (1, 3, 9)
_KEEP_ENTRIES = 8  # a few models per machine; older entries are dropped
_FIXED_COST_TOKENS = 16  # a restore this small is nearly all fixed cost
_PREFILL_BUDGET_S = 3.0  # the long prefill may take about this long
# whole chunks of these sizes may be prefilled together, up to MERGE_MAX tokens a
# batch, where that gives the same KV bits (a CPU's kernels may pick another path
# for another batch size); MERGE_MAX is llama.cpp's default micro-batch, as
# llama-server prefills. Each size is checked against one batch of MERGE_MAX.
MERGE_SIZES, MERGE_MAX = (64, 128, 256), 512
# llama.cpp's CPU flash attention computes a batch of enough query tokens in tiles,
# fewer a row at a time: from 64 upstream (BATCH_TILE), from 8 in the build warmstart
# compiles (installers/llama_wheel.py, SOURCE_PATCHES). Where neither path depends on the
# batch's size, a batch's kind (at least the tile long, or shorter) is all its tokens'
# KV bits depend on; the first of BATCH_TILES that holds is kept
BATCH_TILE = 64
BATCH_TILES = (8, BATCH_TILE)
# replies decoded together in one step (one token each, each in its own KV stream) that
# the calibration checks against each decoded alone (runtime/engine/_decode_probe.py)
DECODE_COUNTS = (2, 4, 8)
CALIBRATION_FILE_BYTES = 64 * MiB
# a spinning disk's figures: unmeasured, the disk tier must not look better than it is
ASSUMED_DISK = DiskRates(write_gbps=0.1, read_gbps=0.1, read_cold=True, fixed_ms=10.0)

Progress = Callable[[str, float], None]  # (what is being measured, fraction done 0..1)


class CalibrationTarget(Protocol):
    """The loaded model, as far as calibration needs it (implemented by the engine).

    ``time_prefill(n)``: seconds to prefill ``n`` tokens into an empty scratch
    sequence (which it clears afterwards). ``time_state_roundtrip(n)``: fills
    the scratch sequence with ``n`` tokens, then returns the real KV blob
    (``llama_state_seq_get_data``), the seconds the get took and the seconds
    ``llama_state_seq_set_data`` of that blob took; the prefill is not timed.
    ``invariant_units(total, units)``: those of ``units`` in batches of which tokens
    get the same KV bytes as prefilled in one batch of ``total``.
    ``batch_kinds(tile)``: whether tokens get the same KV bytes in every batch of at
    least ``tile`` tokens, and in every one of 2 to ``tile - 1``.
    ``batched_decode(counts)``: the most replies (of ``counts``, ascending) decoded in
    one batch that get every step's logits and KV bits each gets decoded alone, with all
    smaller counts so too (0: not even the first), and the first difference found in
    words ("" when none).
    ``kv_bytes_per_token`` and ``kv_layout`` (the per-cell layout of each KV cache
    as plain JSON-able data, ``None`` when not known) are read after the timings, so
    a target may measure them on the context it made for them.
    """

    fingerprint: str
    kv_bytes_per_token: int
    kv_layout: tuple[dict[str, Any], ...] | None

    def time_prefill(self, n_tokens: int) -> float: ...

    def time_state_roundtrip(self, n_tokens: int) -> tuple[bytes, float, float]: ...

    def invariant_units(self, total: int, units: Sequence[int]) -> tuple[int, ...]: ...

    def batch_kinds(self, tile: int) -> bool: ...

    def batched_decode(self, counts: Sequence[int]) -> tuple[int, str]: ...


@dataclass(frozen=True)
class Calibration:
    """What calibration measured. Rates are GB/s, times seconds or ms as named."""

    machine_id: str
    fingerprint: str
    kv_bytes_per_token: int
    prefill_short_tokens: int
    prefill_short_s: float
    prefill_long_tokens: int
    prefill_long_s: float
    state_get_gbps: float
    state_set_gbps: float
    state_fixed_ms: float  # one set_data call of a tiny blob, minus its bytes
    ram_copy_gbps: float
    disk_write_gbps: float
    disk_read_gbps: float
    disk_fixed_ms: float = 0.0
    disk_read_cold: bool = True  # False: the page cache may have flattered the read
    disk_measured: bool = True  # False: no room to measure; the disk figures are assumed
    zstd: tuple[ZstdPoint, ...] = ()
    h2d_pinned_gbps: float | None = None
    h2d_pageable_gbps: float | None = None
    d2h_pinned_gbps: float | None = None
    d2h_pageable_gbps: float | None = None
    # a token's KV has the same bits in one batch of merge_max tokens as in batches of
    # each of merge_units (empty: not so on this machine, or not measured)
    merge_units: tuple[int, ...] = ()
    merge_max: int = 0
    # a token's KV has the same bits in every batch of at least batch_tile tokens, and
    # in every one of 2 to batch_tile - 1 (0: not so on this machine, or not measured)
    batch_tile: int = 0
    # up to decode_batch replies decoded in one batch get the bits each gets alone (0:
    # not so here, or not measured; decode_batch_note says what differed)
    decode_batch: int = 0
    decode_batch_note: str = ""
    seconds: float = 0.0  # how long the calibration took
    measured_at: float = 0.0  # Unix time
    # the per-cell layout of each KV cache (engine._kvblob.CacheLayout's fields),
    # measured on a real context: a start that finds it here decodes no probe
    # (None: not measured, or a model whose state cannot be cut into chunks)
    kv_layout: tuple[dict[str, Any], ...] | None = None
    # measured by a server in the background, between requests, while it answered on
    # estimates (see runtime/serving/_factory.py start_calibration)
    background: bool = False

    @property
    def prefill_tps(self) -> float:
        """Marginal prefill rate between the two lengths (fixed costs cancel out).

        Falls back to the long run's average when noise made the difference
        meaningless.
        """
        dt = self.prefill_long_s - self.prefill_short_s
        dn = self.prefill_long_tokens - self.prefill_short_tokens
        average = self.prefill_long_tokens / max(self.prefill_long_s, 1e-9)
        if dt <= 0 or dn <= 0:
            return average
        # Never claim more than twice the average: a tiny dt is noise, not speed.
        return min(dn / dt, 2 * average)

    @property
    def prefill_fixed_ms(self) -> float:
        """The part of a prefill that does not depend on its length."""
        per_token = 1.0 / self.prefill_tps
        return max(0.0, 1000 * (self.prefill_short_s - self.prefill_short_tokens * per_token))

    def zstd_at(self, level: int) -> ZstdPoint | None:
        return next((p for p in self.zstd if p.level == level), None)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["prefill_tps"] = round(self.prefill_tps, 3)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Calibration:
        """Inverse of :meth:`to_dict`; raises KeyError/TypeError on a malformed dict."""
        fields = {k: v for k, v in data.items() if k != "prefill_tps"}
        fields["zstd"] = tuple(ZstdPoint(**p) for p in fields.get("zstd", ()))
        fields["merge_units"] = tuple(int(u) for u in fields.get("merge_units", ()))
        if fields.get("kv_layout") is not None:
            fields["kv_layout"] = tuple(dict(c) for c in fields["kv_layout"])
        return cls(**fields)


def _prefill_lengths(profile: HardwareProfile) -> tuple[int, int]:
    # A GPU prefills thousands of tokens a second; short runs would time only overhead.
    if profile.offloads or profile.backend == "metal":
        return 512, 2048
    return 64, 256


def _measure_prefill(
    target: CalibrationTarget, profile: HardwareProfile, say: Progress
) -> tuple[int, float, int, float]:
    """The first of calibrate()'s steps, and its longest: it reports each of its runs
    (0 to 0.45), so that a bar moves on a slow machine."""
    short, long = _prefill_lengths(profile)
    say("prefill: warm-up (a context, the first decode)", 0.02)
    target.time_prefill(8)  # warm-up: first decode allocates buffers and loads weights
    say(f"prefill: {short} tokens", 0.1)
    short_s = target.time_prefill(short)
    # Keep the long run inside its budget on a slow machine.
    affordable = int(short / max(short_s, 1e-9) * _PREFILL_BUDGET_S)
    long = max(2 * short, min(long, affordable))
    say(f"prefill: {long} tokens", 0.2)
    return short, short_s, long, target.time_prefill(long)


def _measure_state(target: CalibrationTarget, n_tokens: int) -> tuple[bytes, float, float, float]:
    """(real KV blob, get GB/s, set GB/s, fixed ms of one set call).

    Two set sizes separate the per-byte rate from the per-call cost, as the
    two prefill lengths do.
    """
    blob, get_s, set_s = target.time_state_roundtrip(n_tokens)
    small, _, small_set_s = target.time_state_roundtrip(_FIXED_COST_TOKENS)
    d_bytes, d_s = len(blob) - len(small), set_s - small_set_s
    average = len(blob) / max(set_s, 1e-9)
    per_second = d_bytes / d_s if d_bytes > 0 and d_s > 0 else average
    per_second = min(per_second, 2 * average)  # a tiny difference is noise, not speed
    fixed_ms = max(0.0, 1000 * (small_set_s - len(small) / per_second))
    return blob, len(blob) / max(get_s, 1e-9) / 1e9, per_second / 1e9, fixed_ms


def calibrate(
    target: CalibrationTarget,
    profile: HardwareProfile,
    cache_dir: Path,
    progress: Progress | None = None,
) -> Calibration:
    """Measures this machine with the loaded model (about 10 s on a small CPU box).

    Writes and removes one temporary file of 64 MiB in ``cache_dir``; when it
    cannot (no room, read-only, not ours), the disk figures are assumed and marked
    ``disk_measured=False``: the cache may be RAM-only for now, never fatal.
    """
    say = progress or (lambda _what, _done: None)
    started = time.perf_counter()
    say("prefill", 0.0)
    short, short_s, long, long_s = _measure_prefill(target, profile, say)
    say("KV state get/set", 0.45)
    blob, get_gbps, set_gbps, state_fixed = _measure_state(target, long)
    say("batch invariance", 0.6)
    merge_units = target.invariant_units(MERGE_MAX, MERGE_SIZES)
    batch_tile = next((t for t in BATCH_TILES if target.batch_kinds(t)), 0)
    say("batched decode", 0.63)
    decode_batch, decode_note = target.batched_decode(DECODE_COUNTS)
    say("RAM copy", 0.65)
    ram = ram_copy_gbps()
    say("host<->device copies", 0.7)
    link = host_device_gbps() if profile.gpu is not None else None
    say("disk write/read", 0.75)
    disk, disk_measured = _disk_or_assumed(cache_dir)
    say("zstd levels on real KV", 0.85)
    zstd = zstd_points(blob, ZSTD_LEVELS)
    say("done", 1.0)
    link = link or {}
    return Calibration(
        machine_id=profile.machine_id(),
        fingerprint=target.fingerprint,
        kv_bytes_per_token=target.kv_bytes_per_token,
        kv_layout=target.kv_layout,
        prefill_short_tokens=short,
        prefill_short_s=short_s,
        prefill_long_tokens=long,
        prefill_long_s=long_s,
        state_get_gbps=get_gbps,
        state_set_gbps=set_gbps,
        state_fixed_ms=state_fixed,
        ram_copy_gbps=ram,
        disk_write_gbps=disk.write_gbps,
        disk_read_gbps=disk.read_gbps,
        disk_fixed_ms=disk.fixed_ms,
        disk_read_cold=disk.read_cold,
        disk_measured=disk_measured,
        zstd=zstd,
        h2d_pinned_gbps=link.get("h2d_pinned"),
        h2d_pageable_gbps=link.get("h2d_pageable"),
        d2h_pinned_gbps=link.get("d2h_pinned"),
        d2h_pageable_gbps=link.get("d2h_pageable"),
        merge_units=merge_units,
        merge_max=MERGE_MAX if merge_units else 0,
        batch_tile=batch_tile,
        decode_batch=decode_batch,
        decode_batch_note=decode_note,
        seconds=time.perf_counter() - started,
        measured_at=time.time(),
    )


def _disk_or_assumed(cache_dir: Path) -> tuple[DiskRates, bool]:
    """The measured disk rates, or a slow disk's figures (a restore from it must
    prove itself) when the 64 MiB file cannot be written."""
    try:
        existing = next(p for p in (cache_dir, *cache_dir.parents) if p.exists())
        free = shutil.disk_usage(existing).free
        if free < 2 * CALIBRATION_FILE_BYTES:
            raise DiskFull(f"{free >> 20} MiB free in {cache_dir}")
        return disk_rates(cache_dir), True
    except (OSError, WarmstartError) as exc:
        log.warning("disk speed not measured (%s): assuming a slow disk", exc)
        return ASSUMED_DISK, False


def _cache_key(machine_id: str, fingerprint: str) -> str:
    return f"{machine_id}/{fingerprint}"


def _read_entries(cache_file: Path) -> dict[str, Any]:
    """The stored entries; ``{}`` (with a warning) when the file is corrupt or foreign."""
    if not cache_file.is_file():
        return {}
    try:
        data = json.loads(cache_file.read_text(encoding="utf-8"))
        if isinstance(data.get("format"), int) and data["format"] < FORMAT_VERSION:
            log.info(
                "calibration cache %s predates format %d; measuring again",
                cache_file,
                FORMAT_VERSION,
            )
            return {}
        if data.get("format") != FORMAT_VERSION or not isinstance(data.get("entries"), dict):
            raise ValueError(f"unknown format {data.get('format')!r}")
        return dict(data["entries"])
    except (OSError, ValueError, AttributeError) as exc:
        log.warning("calibration cache %s is unusable (%s); measuring again", cache_file, exc)
        return {}


def _write_entries(cache_file: Path, entries: dict[str, Any]) -> None:
    """Atomic replace, so a crash mid-write leaves the old file or the new one."""
    newest = sorted(entries.items(), key=lambda kv: kv[1].get("measured_at", 0), reverse=True)
    payload = {"format": FORMAT_VERSION, "entries": dict(newest[:_KEEP_ENTRIES])}
    cache_file.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = cache_file.with_name(cache_file.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(payload, f, indent=1, sort_keys=True)
    os.replace(tmp, cache_file)


def cached_calibration(
    profile: HardwareProfile, fingerprint: str, cache_file: Path
) -> Calibration | None:
    """The calibration kept for (this machine, this model), or None (an unusable entry
    is logged, and measured again)."""
    key = _cache_key(profile.machine_id(), fingerprint)
    entries = _read_entries(cache_file)
    if key not in entries:
        return None
    try:
        return Calibration.from_dict(entries[key])
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        log.warning("calibration entry %s is unusable (%s); measuring again", key, exc)
        return None


def load_or_calibrate(
    target: CalibrationTarget,
    profile: HardwareProfile,
    cache_file: Path,
    recalibrate: bool = False,
    progress: Progress | None = None,
    cache_dir: Path | None = None,
    background: bool = False,
) -> tuple[Calibration, bool]:
    """The cached calibration for (this machine, this model), else a fresh one.

    Returns ``(calibration, reused)``. ``recalibrate`` forces a measurement;
    ``background``: a fresh one is measured so (kept with it, for doctor).
    Disk speeds are measured in ``cache_dir`` (default: the profile's cache
    directory). A corrupt cache file is logged and rewritten.
    """
    cached = None if recalibrate else cached_calibration(profile, target.fingerprint, cache_file)
    if cached is not None:
        return cached, True
    where = cache_dir if cache_dir is not None else Path(profile.disk.path)
    fresh = replace(calibrate(target, profile, where, progress), background=background)
    if not fresh.disk_measured:  # kept in memory: measured again when there is room
        return fresh, False
    entries = _read_entries(cache_file)
    entries[_cache_key(profile.machine_id(), target.fingerprint)] = fresh.to_dict()
    try:
        _write_entries(cache_file, entries)
    except OSError as exc:  # a read-only config dir costs a re-measure next time, nothing more
        log.warning("cannot store the calibration in %s: %s", cache_file, exc)
    return fresh, False
