"""The store's own figures as one typed value (pure): what ``TieredStore.stats`` gives.

The runtime reads its fields (``serving/_stats.py``: the RAM and disk tiers, the
memory give-back, evictions) and shows the whole of it as the ``store`` object of
``GET /v1/warmstart/stats``; ``to_json``/``from_json`` are that object, field for
field, in this order.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class RamFigures:
    """The RAM pool: the chunks in it, and its slots and memory."""

    chunks: int = 0
    tokens: int = 0
    used_bytes: int = 0
    capacity_bytes: int = 0
    limit_bytes: int = 0
    resident_bytes: int = 0
    returnable: bool = False  # freed pages can go back to the OS
    slots: int = 0
    memory: str = "none"  # "pinned (CUDA)", "plain"; "none": no pool


@dataclass(frozen=True)
class DiskFigures:
    """The disk tier's own counts (``DiskUsage``), and whether it is off and why."""

    chunks: int = 0
    tokens: int = 0
    kv_bytes: int = 0
    used_bytes: int = 0
    degraded: bool = False
    degraded_reason: str | None = None


@dataclass(frozen=True)
class StoreStats:
    chunks: int = 0  # records in the ledger, any tier
    ram: RamFigures = field(default_factory=RamFigures)
    disk: DiskFigures = field(default_factory=DiskFigures)
    pending_writes: int = 0  # write-throughs and deletions queued
    evictions: int = 0  # chunks that left RAM with no copy on disk
    demotions: int = 0  # chunks that left RAM
    corrupt: int = 0  # disk reads that failed their check
    disk_full: int = 0
    written: int = 0
    dropped: int = 0  # chunks forgotten in every tier
    culled: int = 0  # chunks the disk tier's budget evicted (its LRU)
    disk_unavailable: int = 0  # times the disk tier could not be used
    pressure_events: int = 0  # times the pool was shrunk for the system's sake
    returned_bytes: int = 0  # pool pages handed back to the OS, in all

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StoreStats:
        """The value ``to_json`` gave; another shape is a ValueError."""
        try:
            body = dict(data)
            ram, disk = RamFigures(**body.pop("ram", {})), DiskFigures(**body.pop("disk", {}))
            return cls(ram=ram, disk=disk, **body)
        except TypeError as exc:
            raise ValueError(f"StoreStats: {exc}") from exc
