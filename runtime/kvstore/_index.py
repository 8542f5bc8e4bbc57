"""index.db: what the disk tier holds, row by row, with no blob read (all its SQL).

One row per chunk (key, fingerprint, parent, start, tokens, nbytes, logits). ``DiskIndex``
is the disk tier's own, read and written by it; ``read_index`` opens the same file
read-only for `warmstart cache` and `sessions` with no model loaded. ``unshared``
is the rule, used by both, for which chunks a deleted conversation takes with it.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from array import array
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from .. import sqlite

MIGRATIONS = [
    (
        "0001_chunks",
        "CREATE TABLE chunks (key BLOB PRIMARY KEY, fingerprint BLOB NOT NULL, "
        "parent BLOB NOT NULL, start INTEGER NOT NULL, tokens BLOB NOT NULL, "
        "nbytes INTEGER NOT NULL, created REAL NOT NULL);"
        "CREATE INDEX chunks_by_fingerprint ON chunks (fingerprint)",
    ),
    # a chunk may keep the next-token logits its last batch gave after its KV bytes
    # (their length; 0: none, as every chunk kept before)
    ("0002_chunk_logits", "ALTER TABLE chunks ADD COLUMN logits INTEGER NOT NULL DEFAULT 0"),
]


@dataclass(frozen=True)
class IndexRow:
    key: bytes
    parent: bytes
    start: int
    tokens: tuple[int, ...]
    nbytes: int  # its payload's, logits included
    logits: int = 0  # bytes of next-token logits its payload ends with


class DiskIndex:
    """The disk tier's index, shared by its callers' threads (one lock)."""

    def __init__(self, path: Path) -> None:
        self._db = sqlite.connect(path, MIGRATIONS)
        self._lock = threading.Lock()

    def rows(self, fingerprint: bytes) -> Iterator[IndexRow]:
        with self._lock:
            found = self._db.execute(
                "SELECT key, parent, start, tokens, nbytes, logits FROM chunks"
                " WHERE fingerprint = ?",
                (fingerprint,),
            ).fetchall()
        for key, parent, start, tokens, nbytes, logits in found:
            yield IndexRow(key, parent, start, tuple(array("i", tokens)), nbytes, logits)

    def put(self, fingerprint: bytes, row: IndexRow) -> None:
        with self._lock:
            self._db.execute(
                "INSERT OR REPLACE INTO chunks"
                " (key, fingerprint, parent, start, tokens, nbytes, created, logits)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    row.key,
                    fingerprint,
                    row.parent,
                    row.start,
                    array("i", row.tokens).tobytes(),
                    row.nbytes,
                    time.time(),
                    row.logits,
                ),
            )

    def nbytes(self, key: bytes) -> int | None:
        with self._lock:
            row = self._db.execute("SELECT nbytes FROM chunks WHERE key = ?", (key,)).fetchone()
        return None if row is None else int(row[0])

    def delete(self, keys: Iterable[bytes]) -> None:
        with self._lock:
            self._db.executemany("DELETE FROM chunks WHERE key = ?", ((k,) for k in keys))

    def clear(self) -> None:
        with self._lock:
            self._db.execute("DELETE FROM chunks")

    def close(self) -> None:
        with self._lock:
            self._db.close()


@dataclass(frozen=True)
class Totals:
    chunks: int
    tokens: int
    kv_bytes: int


class ReadIndex:
    """index.db opened read-only (every fingerprint's rows): nothing is created,
    migrated or changed."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def totals(self) -> Totals:
        """Raises sqlite3.Error on a damaged index."""
        row = self._db.execute(
            "SELECT COUNT(*), COALESCE(SUM(length(tokens)), 0) / 4,"  # int32 token ids
            " COALESCE(SUM(nbytes), 0) FROM chunks"
        ).fetchone()
        return Totals(*(int(v) for v in row))

    def parents(self) -> dict[bytes, bytes]:
        """Each chunk's parent key (empty when the index cannot be read)."""
        try:
            return dict(self._db.execute("SELECT key, parent FROM chunks").fetchall())
        except sqlite3.Error:
            return {}

    def close(self) -> None:
        self._db.close()


def read_index(directory: Path) -> ReadIndex | None:
    """The index under a cache directory, read-only; None when there is none."""
    path = directory / "index.db"
    if not path.is_file():
        return None
    try:
        return ReadIndex(sqlite3.connect(f"file:{path}?mode=ro", uri=True))
    except sqlite3.Error:
        return None


def chain(parent_of: Callable[[bytes], bytes | None], leaf: bytes | None) -> set[bytes]:
    """The keys from ``leaf`` up its parents, as far as they are known."""
    keys: set[bytes] = set()
    while leaf is not None and leaf not in keys:
        parent = parent_of(leaf)
        if parent is None:
            break
        keys.add(leaf)
        leaf = parent
    return keys


def unshared(
    parent_of: Callable[[bytes], bytes | None], leaf: bytes, others: Iterable[bytes | None]
) -> set[bytes]:
    """The chunks of the conversation ending at ``leaf`` that none of ``others`` (the
    other conversations' leaves) uses: what deleting it may drop. A system prompt
    shared by many chats stays until the last of them goes."""
    mine = chain(parent_of, leaf)
    for other in others:
        if not mine:
            break
        mine -= chain(parent_of, other)
    return mine
