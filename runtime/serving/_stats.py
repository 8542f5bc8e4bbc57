"""The runtime's counters and tier usage: one typed value, one JSON shape.

Every runtime builds a ``Stats`` and ``Runtime.stats()`` returns its ``to_json()``:
the body of ``GET /v1/warmstart/stats`` (docs/api.md), what `warmstart cache stats`
prints and what the app's memory panel reads. ``/metrics`` reads it back with
``from_json``, which refuses any other shape. A figure a runtime does not have
(no RAM pool, no disk tier, conversations per tier) is ``None`` and left out of the
JSON, so the shape only grows where a runtime knows more.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

from ..kvstore import StoreStats
from ..types import TIERS

_T = TypeVar("_T")


def _out(obj: object) -> dict[str, Any]:
    """The dataclass's fields as JSON, the unknown (None) ones left out."""
    return {f.name: v for f in fields(obj) if (v := getattr(obj, f.name)) is not None}  # type: ignore[arg-type]


def _read(cls: type[_T], data: Any) -> _T:
    """``cls`` from its JSON object: a field left out takes its default; a field it
    does not know, or a count that is not a number, is refused (the shape is one)."""
    if not isinstance(data, Mapping):
        raise ValueError(f"{cls.__name__}: expected an object, got {type(data).__name__}")
    known = {f.name: f for f in fields(cls)}  # type: ignore[arg-type]
    unknown = set(data) - set(known)
    if unknown:
        raise ValueError(f"{cls.__name__}: unknown fields {sorted(unknown)}")
    for name, value in data.items():
        default = known[name].default
        counted = isinstance(default, int) and not isinstance(default, bool)
        if counted and not (isinstance(value, int | float) and not isinstance(value, bool)):
            raise ValueError(f"{cls.__name__}: {name} must be a number, got {value!r}")
    try:
        return cls(**data)
    except TypeError as exc:
        raise ValueError(f"{cls.__name__}: {exc}") from exc


@dataclass(frozen=True)
class TierStats:
    tokens: int = 0
    bytes: int = 0
    capacity_bytes: int = 0


@dataclass(frozen=True)
class LiveStats(TierStats):
    sequences: int = 0  # resident sequences of the context
    resident: int = 0  # those that hold a conversation


@dataclass(frozen=True)
class RamStats(TierStats):
    """The pool's limit and resident bytes exist where there is a pool."""

    limit_bytes: int | None = None
    resident_bytes: int | None = None
    memory: str | None = None  # the pool's memory: "pinned (CUDA)" or "plain"; "none"

    @classmethod
    def of_store(cls, store: StoreStats | None) -> RamStats:
        """From the tiered store's own figures (kvstore/_figures.py), None: no store."""
        if store is None:
            return cls()
        ram = store.ram
        return cls(
            *(ram.tokens, ram.used_bytes, ram.capacity_bytes),
            limit_bytes=ram.limit_bytes,
            resident_bytes=ram.resident_bytes,
            memory=ram.memory,
        )


@dataclass(frozen=True)
class DiskStats(TierStats):
    """Known where there is a store (a disk tier, or one that could not open)."""

    chunks: int | None = None
    kv_bytes: int | None = None  # the KV bytes its chunks hold (before zstd)
    degraded: bool | None = None
    degraded_reason: str | None = None

    @classmethod
    def of_store(cls, store: StoreStats | None, budget_bytes: int) -> DiskStats:
        if store is None:
            return cls(capacity_bytes=budget_bytes)
        disk = store.disk
        return cls(
            *(disk.tokens, disk.used_bytes, budget_bytes),
            chunks=disk.chunks,
            kv_bytes=disk.kv_bytes,
            degraded=disk.degraded,
            degraded_reason=disk.degraded_reason,
        )

    def to_json(self) -> dict[str, Any]:
        out = _out(self)
        if self.degraded is not None:  # said as null while the tier is well
            out["degraded_reason"] = self.degraded_reason
        return out


@dataclass(frozen=True)
class QueueStats:
    waiting: int = 0
    active: int = 0
    max_queue: int = 0


@dataclass(frozen=True)
class MemoryStats:
    """The RAM pool's give-back under memory pressure (runtimes with a pool)."""

    floor_bytes: int = 0
    available_bytes: int | None = None
    watching: bool = False
    under_pressure: bool = False
    pressure_events: int = 0
    returned_bytes: int = 0

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class Stats:
    model: str = ""
    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    hits: Mapping[str, int] = field(default_factory=lambda: dict.fromkeys(TIERS, 0))
    misses: int = 0
    evictions: int = 0
    live: LiveStats = LiveStats()
    ram: RamStats = RamStats()
    disk: DiskStats = DiskStats()
    queue: QueueStats = QueueStats()
    sessions: int = 0
    # decode steps that decoded several replies' tokens in one batch, and those tokens
    batched_steps: int = 0
    batched_tokens: int = 0
    # a decode step's mean time in ms, by the replies it held ("1", "2", ...)
    decode_step_ms: Mapping[str, float] = field(default_factory=dict)
    memory: MemoryStats | None = None
    store: StoreStats | None = None  # the store's own figures, as it gives them

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"model": self.model}
        if self.memory is not None:
            out["memory"] = self.memory.to_json()
        if self.store is not None:
            out["store"] = self.store.to_json()
        out.update(
            requests=self.requests,
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self.completion_tokens,
            cached_tokens=self.cached_tokens,
            hits={t: self.hits.get(t, 0) for t in TIERS},
            misses=self.misses,
            evictions=self.evictions,
            tiers={"live": _out(self.live), "ram": _out(self.ram), "disk": self.disk.to_json()},
            queue=_out(self.queue),
            sessions=self.sessions,
            batched_steps=self.batched_steps,
            batched_tokens=self.batched_tokens,
            decode_step_ms={n: round(ms, 2) for n, ms in self.decode_step_ms.items()},
        )
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Stats:
        """The value ``to_json`` gave. A part left out reads as its default (a figure
        the runtime does not have); a field this shape does not name, or a value of
        the wrong kind, is a ValueError."""
        body = dict(data)
        tiers = body.pop("tiers", {})
        if not isinstance(tiers, Mapping) or not set(tiers) <= set(TIERS):
            raise ValueError(f"Stats: tiers must be an object of {', '.join(TIERS)}")
        if "queue" in body:
            body["queue"] = _read(QueueStats, body["queue"])
        if body.get("memory") is not None:
            body["memory"] = _read(MemoryStats, body["memory"])
        if body.get("store") is not None:
            body["store"] = StoreStats.from_json(body["store"])
        for name, kind in (("live", LiveStats), ("ram", RamStats), ("disk", DiskStats)):
            if name in tiers:
                body[name] = _read(kind, tiers[name])
        steps = body.get("decode_step_ms", {})
        if not isinstance(steps, Mapping) or not all(
            isinstance(v, int | float) and not isinstance(v, bool) for v in steps.values()
        ):
            raise ValueError("Stats: decode_step_ms must be an object of numbers")
        return _read(cls, body)


def decode_step_ms(counters: Mapping[str, int]) -> dict[str, float]:
    """A decode step's mean time in ms by the replies it held, from the worker's
    ``decode_steps_N`` and ``decode_us_N`` counters."""
    out: dict[str, float] = {}
    for name, steps in counters.items():
        if name.startswith("decode_steps_") and steps:
            n = name.removeprefix("decode_steps_")
            out[n] = counters.get(f"decode_us_{n}", 0) / steps / 1000
    return dict(sorted(out.items(), key=lambda kv: int(kv[0])))
