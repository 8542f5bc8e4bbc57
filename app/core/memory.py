"""The memory panel's figures, read tolerantly from ``GET /v1/warmstart/stats``.

Every warmstart runtime (the real one and the fake) now gives the one shape that
docs/api.md describes; the tolerance stays for what else answers there: an older
server (``used_bytes``, ``hits.miss``), /health's ``degraded``, a partial body."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .report import TIERS


@dataclass(frozen=True)
class TierUsage:
    used_bytes: int = 0
    capacity_bytes: int = 0
    hits: int = 0
    tokens: int = 0
    sessions: int = 0
    capacity_sessions: int = 0

    @property
    def fill(self) -> float | None:
        """Used over capacity, 0..1, in bytes when the server gives a byte capacity, else
        in conversations; ``None`` when it gives neither."""
        if self.capacity_bytes > 0:
            return min(1.0, max(0.0, self.used_bytes / self.capacity_bytes))
        if self.capacity_sessions > 0:
            return min(1.0, max(0.0, self.sessions / self.capacity_sessions))
        return None


@dataclass(frozen=True)
class MemorySnapshot:
    tiers: dict[str, TierUsage] = field(default_factory=dict)
    misses: int = 0
    # what runs in a reduced mode, and why: {"disk": "the cache disk is full"} while
    # the disk tier is off and replies come from RAM alone
    degraded: dict[str, str] = field(default_factory=dict)

    @property
    def lookups(self) -> int:
        return self.misses + sum(t.hits for t in self.tiers.values())

    def hit_rate(self, tier: str) -> float | None:
        """The share of lookups this tier served; ``None`` before the first lookup."""
        total = self.lookups
        if total == 0:
            return None
        return self.tiers.get(tier, TierUsage()).hits / total


def _int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def parse_stats(data: dict[str, Any]) -> MemorySnapshot:
    """Accepts ``{"tiers": {tier: {used_bytes | bytes, capacity_bytes, sessions,
    capacity_sessions, tokens, degraded, degraded_reason}}, "hits": {tier: n, "miss": n},
    "misses": n, "degraded": {part: why}}`` and ignores whatever else the server adds;
    missing figures read as zero."""
    tiers_raw = data.get("tiers")
    tiers_raw = tiers_raw if isinstance(tiers_raw, dict) else {}
    hits_raw = data.get("hits")
    hits_raw = hits_raw if isinstance(hits_raw, dict) else {}
    tiers = {}
    for tier in TIERS:
        raw = tiers_raw.get(tier)
        raw = raw if isinstance(raw, dict) else {}
        hits = hits_raw.get(tier, raw.get("hits"))
        tiers[tier] = TierUsage(
            used_bytes=_int(raw.get("used_bytes", raw.get("bytes"))),
            capacity_bytes=_int(raw.get("capacity_bytes")),
            hits=_int(hits),
            tokens=_int(raw.get("tokens")),
            sessions=_int(raw.get("sessions")),
            capacity_sessions=_int(raw.get("capacity_sessions")),
        )
    misses = hits_raw.get("miss", hits_raw.get("misses", data.get("misses")))
    return MemorySnapshot(tiers=tiers, misses=_int(misses), degraded=_degraded(data, tiers_raw))


def _degraded(data: dict[str, Any], tiers_raw: dict[str, Any]) -> dict[str, str]:
    """``{"degraded": {part: why}}`` (as /health says it), or a tier's own
    ``degraded: true`` with its ``degraded_reason``."""
    out: dict[str, str] = {}
    top = data.get("degraded")
    if isinstance(top, dict):
        out.update({str(k): str(v or "") for k, v in top.items() if v})
    for tier in TIERS:
        raw = tiers_raw.get(tier)
        if isinstance(raw, dict) and raw.get("degraded") and tier not in out:
            out[tier] = str(raw.get("degraded_reason") or "")
    return out
