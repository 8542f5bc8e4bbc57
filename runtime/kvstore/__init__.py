"""The KV store: it plans loads and stores over two tiers (the pinned RAM pool, the
zstd-compressed disk tier) and a transfer worker moves the bytes (docs/architecture.md)."""

from ._disk import DiskTier, directory_problem, drop_chunks, reset_directory
from ._figures import StoreStats
from ._index import read_index, unshared
from ._keys import (
    TAIL_TOKENS,
    aligned_cuts,
    batch_cuts,
    chunk_spans,
    common_prefix,
    decode_groups,
)
from ._plans import LoadPlan
from ._pool import RamPool
from ._pressure import MemoryWatcher
from ._store import TieredStore

__all__ = [
    "TAIL_TOKENS",
    "DiskTier",
    "LoadPlan",
    "MemoryWatcher",
    "RamPool",
    "StoreStats",
    "TieredStore",
    "aligned_cuts",
    "batch_cuts",
    "chunk_spans",
    "common_prefix",
    "decode_groups",
    "directory_problem",
    "drop_chunks",
    "read_index",
    "reset_directory",
    "unshared",
]
