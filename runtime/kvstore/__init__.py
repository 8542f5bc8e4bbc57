"""The KV store: it plans loads and stores over two tiers (the pinned RAM pool, the
zstd-compressed disk tier) and owns the transfers that move the bytes (docs/architecture.md)."""

from ._batches import (
    TAIL_TOKENS,
    ReplyPlan,
    aligned_cuts,
    batch_cuts,
    chunk_ends,
    chunk_spans,
    common_prefix,
    decode_groups,
    ends_through,
    live_prefix,
    next_decode,
    piece_end,
    reply_plan,
    reusable,
    turn_anchors,
)
from ._disk import DiskTier, directory_problem, drop_chunks, reset_directory
from ._figures import StoreStats
from ._index import read_index, unshared
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
    "ReplyPlan",
    "StoreStats",
    "TieredStore",
    "aligned_cuts",
    "batch_cuts",
    "chunk_ends",
    "chunk_spans",
    "common_prefix",
    "decode_groups",
    "directory_problem",
    "drop_chunks",
    "ends_through",
    "live_prefix",
    "next_decode",
    "piece_end",
    "read_index",
    "reply_plan",
    "reset_directory",
    "reusable",
    "turn_anchors",
    "unshared",
]
