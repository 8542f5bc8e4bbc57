"""`cache` and `sessions` on the files alone, when no server runs: no model is loaded.

Reads the disk tier's index (read-only) for its figures, and deletes a conversation
together with the chunks no other conversation shares, as the runtime would."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Any

from .kvstore._disk import drop_chunks
from .sessions import SessionBook


def _index(cache_dir: Path) -> sqlite3.Connection | None:
    path = cache_dir / "index.db"
    if not path.is_file():
        return None
    try:
        return sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    except sqlite3.Error:
        return None


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
    index = _index(cache_dir)
    if index is not None:
        try:
            row = index.execute(
                "SELECT COUNT(*), COALESCE(SUM(length(tokens)), 0) / 4,"
                " COALESCE(SUM(nbytes), 0) FROM chunks"
            ).fetchone()
            chunks, tokens, kv_bytes = (int(v) for v in row)
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


def _chains(cache_dir: Path) -> dict[bytes, bytes]:
    index = _index(cache_dir)
    if index is None:
        return {}
    try:
        return dict(index.execute("SELECT key, parent FROM chunks").fetchall())
    except sqlite3.Error:
        return {}
    finally:
        index.close()


def _chain(parents: dict[bytes, bytes], leaf: bytes | None) -> set[bytes]:
    keys: set[bytes] = set()
    while leaf is not None and leaf in parents and leaf not in keys:
        keys.add(leaf)
        leaf = parents[leaf]
    return keys


def delete_session(cache_dir: Path, book: SessionBook, session_id: str) -> bool:
    """Forgets the conversation and drops its chunks that no other one uses."""
    row = book.get(session_id)
    if row is None:
        return False
    parents = _chains(cache_dir)
    mine = _chain(parents, row.leaf)
    if mine:
        for other in book.list(limit=1_000_000):
            if other.id != session_id:
                mine -= _chain(parents, other.leaf)
        drop_chunks(cache_dir, mine)
    return book.delete(session_id)
