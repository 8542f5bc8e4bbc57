"""The RAM pool: one preallocated host buffer cut into fixed-size slots (bookkeeping + bytes).

Pinned (page-locked, for DMA) through torch when a CUDA device is present;
otherwise an anonymous mapping, committed page by page as chunks land. Being
full is the pool's normal state. Under memory pressure its ``limit`` drops below
its capacity and :meth:`RamPool.give_back` returns the pages of free slots to the
OS (``madvise(MADV_DONTNEED)``), so the process's resident memory really falls;
a slot used again later is simply committed again. Pinned pages cannot be given
back: there the limit still bounds what the pool holds, not what it keeps.
"""

from __future__ import annotations

import logging
import mmap
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

SLOT_ALIGN = 4096
PAGE = mmap.PAGESIZE


def _allocate(nbytes: int) -> tuple[np.ndarray, str, Any]:
    """(buffer, kind, the mapping to madvise or None).

    Pinned through torch when CUDA is there (DMA straight to the GPU); otherwise an
    anonymous mapping: untouched pages cost nothing, and freed ones can be handed back.
    Not mlock'ed: without a GPU there is no DMA to pin for, and locking commits the
    whole pool at start (seconds for gigabytes) before a single chunk needs it."""
    try:
        import torch

        if torch.cuda.is_available() and nbytes:
            tensor = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
            return tensor.numpy(), "pinned (CUDA)", None
    except Exception as exc:  # torch absent or broken: plain memory still works
        log.debug("no pinned memory through torch: %s", exc)
    if not nbytes or not hasattr(mmap.mmap, "madvise"):  # Windows: no madvise
        return np.empty(nbytes, dtype=np.uint8), "plain", None
    # Private: on a shared anonymous mapping (Python's default) MADV_DONTNEED only unmaps
    # the pages from this process, and shmem keeps holding them; a private one frees them.
    mapping = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE)  # zero pages until touched
    return np.frombuffer(mapping, dtype=np.uint8), "plain", mapping


def _page_round(n: int) -> int:
    return -(-n // PAGE) * PAGE


class RamPool:
    """``n_slots`` slots of ``slot_bytes`` each; a chunk occupies one slot.

    At most ``limit_slots`` (<= ``n_slots``) are in use at once. Free slots are either
    clean (pages never touched, or given back) or dirty (pages may still be resident):
    dirty ones are reused first, so the pool touches new memory only when it must."""

    def __init__(self, total_bytes: int, slot_bytes: int) -> None:
        self.slot_bytes = -(-slot_bytes // SLOT_ALIGN) * SLOT_ALIGN
        self.n_slots = max(0, total_bytes // self.slot_bytes)
        self._buf, self.memory_kind, self._mapping = _allocate(self.n_slots * self.slot_bytes)
        self.limit_slots = self.n_slots
        self._clean = list(range(self.n_slots - 1, -1, -1))
        self._dirty: list[int] = []
        self._lengths: dict[int, int] = {}
        self._touched: dict[int, int] = {}  # slot -> bytes of it that may be resident
        self.returned_bytes = 0  # given back to the OS, in all

    @property
    def returnable(self) -> bool:
        """Whether freed pages can be handed back to the OS (not pinned, not Windows)."""
        return self._mapping is not None

    @property
    def capacity_bytes(self) -> int:
        return self.n_slots * self.slot_bytes

    @property
    def limit_bytes(self) -> int:
        return self.limit_slots * self.slot_bytes

    @property
    def used_slots(self) -> int:
        return len(self._lengths)

    @property
    def used_bytes(self) -> int:
        return sum(self._lengths.values())

    @property
    def resident_bytes(self) -> int:
        """Bytes of the pool that may be in RAM now: what chunks occupy (page-rounded),
        slots being filled (whole), and free slots not yet given back. Pinned memory is
        all resident from the start."""
        if not self.returnable:
            return self.capacity_bytes
        filling = [s for s, n in self._lengths.items() if n == 0]
        settled = sum(t for s, t in self._touched.items() if self._lengths.get(s) != 0)
        return len(filling) * self.slot_bytes + settled

    @property
    def has_free(self) -> bool:
        return self.used_slots < self.limit_slots and bool(self._clean or self._dirty)

    def fill(self) -> float:
        return self.used_slots / self.limit_slots if self.limit_slots else 1.0

    def set_limit(self, limit_bytes: int) -> None:
        """Caps the slots in use (the store demotes down to it); at most the capacity."""
        self.limit_slots = max(0, min(self.n_slots, limit_bytes // self.slot_bytes))

    def alloc(self) -> int | None:
        """A free slot, or None when the pool is at its limit (the caller makes room)."""
        if not self.has_free:
            return None
        slot = self._dirty.pop() if self._dirty else self._clean.pop()
        self._lengths[slot] = 0
        return slot

    def release(self, slot: int) -> None:
        length = self._lengths.pop(slot, None)
        if length is None:
            return
        # a slot released before set_length may have been written anywhere in it
        touched = _page_round(length) if length else self.slot_bytes
        self._touched[slot] = max(self._touched.get(slot, 0), touched)
        self._dirty.append(slot)

    def give_back(self) -> int:
        """Returns the pages of every dirty free slot to the OS; the bytes given back."""
        if not self._dirty:
            return 0
        if self._mapping is None:  # pinned or no madvise: the pages stay where they are
            return 0
        freed = sum(self._touched.pop(s, 0) for s in self._dirty)
        for start, end in _runs(sorted(self._dirty)):
            offset = start * self.slot_bytes
            self._mapping.madvise(mmap.MADV_DONTNEED, offset, (end - start) * self.slot_bytes)
        self._clean.extend(self._dirty)
        self._dirty.clear()
        self.returned_bytes += freed
        return freed

    def view(self, slot: int, length: int | None = None) -> np.ndarray:
        """The slot's memory (the first ``length`` bytes, default the whole slot)."""
        start = slot * self.slot_bytes
        return self._buf[start : start + (self.slot_bytes if length is None else length)]

    def set_length(self, slot: int, length: int) -> None:
        if length > self.slot_bytes:
            raise ValueError(f"{length} bytes do not fit a {self.slot_bytes}-byte slot")
        self._lengths[slot] = length
        self._touched[slot] = max(self._touched.get(slot, 0), _page_round(length))


def _runs(slots: list[int]) -> list[tuple[int, int]]:
    """Sorted slot numbers as [start, end) runs of consecutive slots: one madvise each."""
    runs: list[tuple[int, int]] = []
    for s in slots:
        if runs and runs[-1][1] == s:
            runs[-1] = (runs[-1][0], s + 1)
        else:
            runs.append((s, s + 1))
    return runs
