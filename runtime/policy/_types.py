"""The policy's inputs and outputs (pure data; no I/O)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any


@dataclass(frozen=True)
class ModelGeometry:
    """What the policy needs to know about the loaded model."""

    n_ctx_train: int
    n_layer: int
    kv_bytes_per_token: int  # state_seq bytes per cached token, measured on the context
    model_bytes: int  # size of the GGUF file
    swa: bool = False  # sliding-window attention (Gemma 2/3): needs swa_full for chunks
    recurrent: bool = False  # recurrent or hybrid: cannot be chunked


@dataclass(frozen=True)
class Rates:
    """Measured speeds the restore-or-recompute decision uses.

    ``tier_gbps`` maps a tier ("ram", "disk") to the end-to-end rate at which a
    restore from it lands in the context (GB/s of KV bytes); ``fixed_ms`` is the
    per-restore fixed cost of the tier (seek, syscalls, one llama call).
    """

    prefill_tps: float
    tier_gbps: dict[str, float]
    fixed_ms: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Tuning:
    """The runtime's thresholds, each with the one-line reason it was chosen."""

    n_ctx: int
    resident_sequences: int
    ram_pool_bytes: int
    disk_budget_bytes: int
    chunk_tokens: int
    swap_in_threshold_tokens: int
    high_watermark: float
    low_watermark: float
    zstd_level: int
    prewarm_sessions: int
    merge_batch_tokens: int = 0  # 0: every prefill batch is one chunk
    batch_tile: int = 0  # batches of this many tokens or more are one kind (0: unknown)
    decode_batch: int = 1  # replies decoded together in one step (1: one at a time)
    memory_floor_bytes: int = 0  # system memory the RAM pool gives pages back to keep (0: never)
    reasons: dict[str, str] = field(default_factory=dict, compare=False)

    def report(self) -> dict[str, dict[str, Any]]:
        """``{name: {"value": v, "reason": why}}`` for doctor and the settings endpoint."""
        return {
            f.name: {"value": getattr(self, f.name), "reason": self.reasons.get(f.name, "")}
            for f in fields(self)
            if f.name != "reasons"
        }
