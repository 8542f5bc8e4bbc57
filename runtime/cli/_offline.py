"""`cache` and `sessions` on the files alone, when no server runs: no model is loaded.

Reads the disk tier's index (read-only, ``kvstore._index``) for its figures, and
deletes a conversation together with the chunks no other conversation shares, by the
rule the runtime uses (``unshared``)."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Any

from ..kvstore import drop_chunks, read_index, unshared
from ..serving import SessionBook


def _size(directory: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(directory):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
            except OSError:
                continue
    return total


def cache_stats(cache_dir: Path, book: SessionBook) -> dict[str, Any]:
    """What the files hold, in the shape of the runtime's stats (the parts known
    without a model): tokens and chunks indexed on disk, bytes used, sessions."""
    tokens = chunks = kv_bytes = 0
    problem = None
    index = read_index(cache_dir)
    if index is not None:
        try:
            totals = index.totals()
            chunks, tokens, kv_bytes = totals.chunks, totals.tokens, totals.kv_bytes
        except sqlite3.Error as exc:
            problem = f"the index is unreadable ({exc}); `warmstart cache clear` resets it"
        finally:
            index.close()
    disk: dict[str, Any] = {"tokens": tokens, "chunks": chunks, "kv_bytes": kv_bytes}
    disk["bytes"] = _size(cache_dir) if cache_dir.is_dir() else 0
    if problem:
        disk["problem"] = problem
    return {
        "source": "files (no server answered)",
        "tiers": {"disk": disk},
        "sessions": book.count(),
    }


def delete_session(cache_dir: Path, book: SessionBook, session_id: str) -> bool:
    """Forgets the conversation and drops its chunks that no other one uses."""
    row = book.get(session_id)
    if row is None:
        return False
    index = read_index(cache_dir)
    if index is not None and row.leaf is not None:
        try:
            parents = index.parents()
        finally:
            index.close()
        others = (o.leaf for o in book.list(limit=1_000_000) if o.id != session_id)
        drop_chunks(cache_dir, unshared(parents.get, row.leaf, others))
    return book.delete(session_id)
