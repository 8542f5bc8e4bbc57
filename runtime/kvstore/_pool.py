"""T1: one preallocated host-RAM buffer cut into fixed-size slots (bookkeeping + bytes).

Pinned (page-locked, for DMA) through torch when a CUDA device is present;
otherwise plain memory, committed page by page as chunks land. The pool is
allocated once; being full is its normal state.
"""

from __future__ import annotations

import logging

import numpy as np

log = logging.getLogger(__name__)

SLOT_ALIGN = 4096


def _allocate(nbytes: int) -> tuple[np.ndarray, str]:
    """Pinned through torch when CUDA is there (DMA straight to the GPU); otherwise plain
    memory. Not mlock'ed: without a GPU there is no DMA to pin for, and locking commits
    the whole pool at start (seconds for gigabytes) before a single chunk needs it."""
    try:
        import torch

        if torch.cuda.is_available():
            tensor = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
            return tensor.numpy(), "pinned (CUDA)"
    except Exception as exc:  # torch absent or broken: plain memory still works
        log.debug("no pinned memory through torch: %s", exc)
    return np.empty(nbytes, dtype=np.uint8), "plain"


class RamPool:
    """``n_slots`` slots of ``slot_bytes`` each; a chunk occupies one slot."""

    def __init__(self, total_bytes: int, slot_bytes: int) -> None:
        self.slot_bytes = -(-slot_bytes // SLOT_ALIGN) * SLOT_ALIGN
        self.n_slots = max(0, total_bytes // self.slot_bytes)
        self._buf, self.memory_kind = _allocate(self.n_slots * self.slot_bytes)
        self._free = list(range(self.n_slots - 1, -1, -1))
        self._lengths: dict[int, int] = {}

    @property
    def capacity_bytes(self) -> int:
        return self.n_slots * self.slot_bytes

    @property
    def used_slots(self) -> int:
        return self.n_slots - len(self._free)

    @property
    def used_bytes(self) -> int:
        return sum(self._lengths.values())

    @property
    def has_free(self) -> bool:
        return bool(self._free)

    def fill(self) -> float:
        return self.used_slots / self.n_slots if self.n_slots else 1.0

    def alloc(self) -> int | None:
        """A free slot, or None when the pool is full (the caller makes room)."""
        if not self._free:
            return None
        slot = self._free.pop()
        self._lengths[slot] = 0
        return slot

    def release(self, slot: int) -> None:
        if slot in self._lengths:
            del self._lengths[slot]
            self._free.append(slot)

    def view(self, slot: int, length: int | None = None) -> np.ndarray:
        """The slot's memory (the first ``length`` bytes, default the whole slot)."""
        start = slot * self.slot_bytes
        return self._buf[start : start + (self.slot_bytes if length is None else length)]

    def set_length(self, slot: int, length: int) -> None:
        if length > self.slot_bytes:
            raise ValueError(f"{length} bytes do not fit a {self.slot_bytes}-byte slot")
        self._lengths[slot] = length
