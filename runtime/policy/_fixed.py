"""Fixed defaults, used until the machine-derived policy has its measurements."""

from __future__ import annotations

from ..settings import Settings
from ._types import ModelGeometry, Tuning

GiB = 1 << 30


def fixed_tuning(settings: Settings, geometry: ModelGeometry) -> Tuning:
    """Conservative defaults; every user override wins and says so."""
    chosen: dict[str, object] = {
        "n_ctx": min(4096, geometry.n_ctx_train),
        "resident_sequences": 4,
        "ram_pool_bytes": 1 * GiB,
        "disk_budget_bytes": 10 * GiB,
        "chunk_tokens": 256,
        "swap_in_threshold_tokens": 32,
        "high_watermark": 0.9,
        "low_watermark": 0.7,
        "zstd_level": 1,
        "prewarm_sessions": 4,
        "merge_batch_tokens": 0,
        "batch_tile": 0,
        "decode_batch": 1,
        "memory_floor_bytes": 1 * GiB,
    }
    reasons = dict.fromkeys(chosen, "fixed default (machine not measured)")
    for name in chosen:
        override = getattr(settings, name)
        if override is not None:
            chosen[name] = override
            reasons[name] = "set by the user"
    return Tuning(reasons=reasons, **chosen)  # type: ignore[arg-type]
