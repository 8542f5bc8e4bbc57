"""What the store hands out for one load or one store: where the bytes are, where they
go (pure values: the store plans, its transfers or the engine move the bytes).

A plan's chunks are pinned from ``prepare_*`` until ``complete_*``: nothing in it is
evicted or dropped while its bytes move.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from ._ledger import Record


@dataclass(frozen=True)
class Load:
    """One stored chunk of a prompt: tokens [start, end), ``nbytes`` of KV, in ``tier``
    ("ram": pool ``slot``; "disk") when planned. A disk chunk is read into the staging
    memory at ``offset`` when it fits there (memory already touched: the request path
    pays no page faults), else into a free pool slot (which promotes it)."""

    key: bytes
    start: int
    end: int
    nbytes: int
    tier: str
    slot: int | None
    offset: int | None


@dataclass(frozen=True)
class LoadPlan:
    """The longest stored prefix of a prompt, one chunk per prefill batch, pinned."""

    loads: tuple[Load, ...] = ()
    records: tuple[Record, ...] = field(default=(), repr=False, compare=False)

    @property
    def end(self) -> int:
        """Tokens the plan covers (0: a miss)."""
        return self.loads[-1].end if self.loads else 0

    @property
    def nbytes(self) -> int:
        return sum(c.nbytes for c in self.loads)

    @property
    def slowest(self) -> str:
        """The slowest tier it reads from: what the restore decision is priced at."""
        return "disk" if any(c.tier == "disk" for c in self.loads) else "ram"

    def ends(self, n: int) -> list[int]:
        """The batch ends of its first ``n`` chunks."""
        return [c.end for c in self.loads[:n]]

    def tokens_by_tier(self, n: int) -> dict[str, int]:
        """Tokens its first ``n`` chunks bring, by the tier they came from."""
        out: dict[str, int] = {}
        for c in self.loads[:n]:
            out[c.tier] = out.get(c.tier, 0) + c.end - c.start
        return out

    def to_promote(self, n: int) -> list[Record]:
        """Its first ``n`` chunks that were on disk only: for ``TieredStore.promote``
        once the reply is out."""
        pairs = zip(self.loads[:n], self.records, strict=False)
        return [r for c, r in pairs if c.tier == "disk"]


@dataclass
class Read:
    """Where one chunk read stands (``TieredStore._read_room``): its bytes ``ready``
    (in RAM already), or a ``buffer`` its disk read lands in (a pool ``slot``'s memory
    when set)."""

    ready: np.ndarray | None = None
    buffer: np.ndarray | None = None
    slot: int | None = None


@dataclass
class Save:
    """One chunk to keep: tokens [start, end) under ``key``; its KV bytes are written
    into ``buffer`` (a pool slot's memory when ``slot`` is set), and ``nbytes`` says
    how many once they are (None: not written). ``logits``: the next-token logits its
    last batch gave, kept after its KV bytes (``add_logits``)."""

    key: bytes
    parent: bytes
    start: int
    tokens: tuple[int, ...]
    buffer: np.ndarray
    slot: int | None
    nbytes: int | None = None
    logits: np.ndarray | None = None
    logits_bytes: int = 0  # of ``nbytes``, once added

    @property
    def end(self) -> int:
        return self.start + len(self.tokens)

    def add_logits(self) -> None:
        """Puts ``logits`` after the KV bytes written (when they fit the room)."""
        if self.logits is None or self.nbytes is None or self.logits_bytes:
            return
        raw = np.ascontiguousarray(self.logits, dtype="<f4").view(np.uint8).reshape(-1)
        if self.nbytes + raw.nbytes <= self.buffer.nbytes:
            self.buffer[self.nbytes : self.nbytes + raw.nbytes] = raw
            self.nbytes += raw.nbytes
            self.logits_bytes = raw.nbytes


@dataclass
class StorePlan:
    """The chunks along a sequence's batch ends: ``keys[i]`` names the prefix up to
    ``ends[i]``; ``saves`` are those the store lacks, with room reserved for each."""

    ends: Sequence[int]
    keys: Sequence[bytes]
    saves: list[Save]

    def runs(self) -> list[list[Save]]:
        """The saves in runs of adjacent chunks: a capture reads each run's cells out
        of the context at once."""
        runs: list[list[Save]] = []
        for save in self.saves:
            if runs and runs[-1][-1].end == save.start:
                runs[-1].append(save)
            else:
                runs.append([save])
        return runs

    def leaf(self) -> bytes | None:
        """The key of the longest prefix kept: up to the first save not written."""
        failed = next((s.end for s in self.saves if s.nbytes is None), None)
        pairs = zip(self.ends, self.keys, strict=True)
        kept = [k for e, k in pairs if failed is None or e < failed]
        return kept[-1] if kept else None
