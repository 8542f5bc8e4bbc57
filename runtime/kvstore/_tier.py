"""The seam the transfer worker moves bytes through: one protocol over the RAM pool
(``_pool.RamPool``, addressed by slot) and the disk tier (``_disk.DiskTier``,
addressed by chunk key). tests/kvstore/test_tiers.py runs the same contract tests
over both."""

from __future__ import annotations

from typing import Protocol, TypeVar

import numpy as np

from ._index import IndexRow

W = TypeVar("W")


class Tier(Protocol[W]):
    """Where a chunk's KV bytes live. The contract:

    - ``put(row, payload)`` keeps exactly ``payload``'s bytes for the chunk ``row``
      names and returns where they are; None when the tier has no room (an expected
      refusal, not an error). The disk tier raises DiskUnavailable when it cannot
      write at all (the store then degrades to RAM).
    - ``read_into(where, out)`` copies those bytes, verified, into the start of
      ``out`` and returns how many; None when they are gone (evicted, deleted).
      Bytes that do not fit ``out``, or that fail their check, raise CacheError
      (the disk tier drops such a record: it is recomputed, never trusted).
    - ``delete(where)`` frees them; deleting what is gone is harmless.

    Nothing here decides what to keep: that is the store's (``_store``), which only
    plans, while the transfer worker (``_transfer``) calls these.
    """

    def put(self, row: IndexRow, payload: bytes | memoryview) -> W | None: ...

    def read_into(self, where: W, out: np.ndarray) -> int | None: ...

    def delete(self, where: W) -> None: ...
