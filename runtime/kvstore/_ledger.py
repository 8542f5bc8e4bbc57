"""The store's records: which chunk exists, where its bytes are, who is using it (pure).

The ledger never moves bytes. Callers pin what they are about to read or write
(two-phase: prepare -> move -> complete), and nothing pinned is ever evicted or
dropped. Expected refusals (a miss, no room) are return values, not exceptions.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from ._batches import Span
from ._keys import chunk_key

if TYPE_CHECKING:
    from ._index import IndexRow


@dataclass
class Record:
    """One chunk: the KV of tokens [start, start + len(tokens)) of the prefix named by key."""

    key: bytes
    parent: bytes
    start: int
    tokens: tuple[int, ...]
    nbytes: int  # its payload's: the KV bytes, then ``logits`` bytes of logits
    # the next-token logits (float32, the whole vocabulary) its last batch gave, when
    # kept: a prompt that ends where it does needs no decode (0: none kept)
    logits: int = 0
    slot: int | None = None  # RAM pool slot, when in the pool
    # its bytes outside the pool until its write-through lands (no slot was free: the
    # pool held chunks whose writes wait too); RAM all the same
    held: np.ndarray | None = None
    on_disk: bool = False  # a verified copy is in the disk tier
    pins: int = 0
    last_used: float = 0.0
    promoted_at: float = 0.0
    doomed: bool = False  # to be dropped as soon as its last pin goes

    @property
    def end(self) -> int:
        return self.start + len(self.tokens)

    @property
    def kv_bytes(self) -> int:
        """Its payload's KV bytes: what a restore loads into the context."""
        return self.nbytes - self.logits

    def logits_of(self, payload: np.ndarray) -> np.ndarray | None:
        """A copy of the logits its ``payload`` keeps after the KV bytes (None: none)."""
        if not self.logits:
            return None
        return payload[self.kv_bytes : self.nbytes].copy().view("<f4")

    @property
    def tier(self) -> str | None:
        if self.slot is not None or self.held is not None:
            return "ram"
        return "disk" if self.on_disk else None


@dataclass(frozen=True)
class Hit:
    """``use`` tokens of ``record`` (always all of them: chunks are used whole)."""

    record: Record
    use: int

    @property
    def end(self) -> int:
        return self.record.start + self.use


@dataclass
class Ledger:
    clock: Callable[[], float] = time.monotonic
    records: dict[bytes, Record] = field(default_factory=dict)

    def __contains__(self, key: bytes) -> bool:
        return key in self.records

    def __len__(self) -> int:
        return len(self.records)

    def get(self, key: bytes) -> Record | None:
        return self.records.get(key)

    def add(self, record: Record) -> Record:
        """Adds a record (or returns the existing one with the same key)."""
        existing = self.records.get(record.key)
        if existing is not None:
            return existing
        record.last_used = record.last_used or self.clock()
        self.records[record.key] = record
        return record

    def adopt(self, rows: Iterable[IndexRow]) -> None:
        """Records the chunks a disk tier lists as on disk (those known already are
        marked so)."""
        for row in rows:
            existing = self.records.get(row.key)
            if existing is not None:
                existing.on_disk = True
                continue
            fields = (row.key, row.parent, row.start, row.tokens, row.nbytes, row.logits)
            self.add(Record(*fields, on_disk=True, last_used=0.0))

    def remove(self, key: bytes) -> Record | None:
        """Forgets a record unless it is pinned; returns it when removed."""
        record = self.records.get(key)
        if record is None or record.pins:
            return None
        del self.records[key]
        return record

    def lookup(self, root: bytes, ids: Sequence[int], spans: Sequence[Span]) -> list[Hit]:
        """The longest cached prefix of ``ids`` made of whole chunks, one per span of
        its batches (``chunk_spans`` of the batch ends a prefill of ``ids`` uses): a
        chunk computed in any other batches would restore other bits than a cold
        prefill computes."""
        hits: list[Hit] = []
        parent, pos = root, 0
        for _, end, stepped in spans:
            if end > len(ids):
                break
            record = self.records.get(chunk_key(parent, ids[pos:end], stepped))
            if record is None or record.doomed or record.start != pos:
                break
            hits.append(Hit(record, end - pos))
            parent, pos = record.key, end
        return hits

    def chain(self, key: bytes) -> list[Record]:
        """The records from the root down to ``key`` (empty if any link is missing)."""
        out: list[Record] = []
        record = self.records.get(key)
        while record is not None:
            out.append(record)
            if record.start == 0:
                return out[::-1]
            record = self.records.get(record.parent)
        return []

    def touch(self, records: Iterable[Record]) -> None:
        now = self.clock()
        for record in records:
            record.last_used = now

    def pin(self, records: Iterable[Record]) -> None:
        for record in records:
            record.pins += 1

    def unpin(self, records: Iterable[Record]) -> None:
        for record in records:
            record.pins = max(0, record.pins - 1)

    def demotion_order(self, min_residency_s: float) -> list[Record]:
        """RAM-resident records that may leave RAM, coldest first.

        Pinned records never appear. Freshly promoted ones (younger than the minimum
        residency) and first chunks (system prompts, attention sinks) come last, so
        they leave only when nothing else can.
        """
        now = self.clock()
        movable = [r for r in self.records.values() if r.slot is not None and not r.pins]

        def rank(r: Record) -> tuple[int, float]:
            protected = r.start == 0 or now - r.promoted_at < min_residency_s
            return (1 if protected else 0, r.last_used)

        return sorted(movable, key=rank)
