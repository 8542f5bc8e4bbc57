"""index.db read without a model (`warmstart cache stats`, `sessions delete` offline),
and the one rule for which chunks a deleted conversation takes with it."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
from warmstart.runtime.cli import _offline as offline
from warmstart.runtime.kvstore._disk import DiskTier
from warmstart.runtime.kvstore._index import read_index, unshared
from warmstart.runtime.kvstore._keys import chunk_key, root_key
from warmstart.runtime.kvstore._pool import RamPool
from warmstart.runtime.kvstore._store import TieredStore
from warmstart.runtime.serving._sessions import SessionBook
from warmstart.runtime.types import Message

ROOT = root_key("fp")
SYSTEM = chunk_key(ROOT, [1, 2])
A = chunk_key(SYSTEM, [3])
B = chunk_key(SYSTEM, [4])


def test_unshared_keeps_what_another_conversation_uses() -> None:
    parents = {SYSTEM: ROOT, A: SYSTEM, B: SYSTEM}
    assert unshared(parents.get, A, [B, None]) == {A}
    assert unshared(parents.get, A, []) == {A, SYSTEM}
    assert unshared(parents.get, A, [A]) == set()
    assert unshared(parents.get, b"unknown", [B]) == set()


def write_chunks(cache: Path) -> None:
    """Two conversations sharing their first chunk, written by a real store."""
    store = TieredStore("fp", RamPool(1 << 20, 1 << 16), DiskTier(cache, "fp", 1, 1 << 30))
    for tokens in ([1, 2, 3], [1, 2, 4]):
        plan = store.prepare_store(tokens, [2, 3], lambda n: 1000 * n)
        for save in plan.saves:
            data = random.Random(save.end).randbytes(1000 * len(save.tokens))
            save.buffer[: len(data)] = np.frombuffer(data, dtype=np.uint8)
            save.nbytes = len(data)
        store.complete_store(plan)
    store.flush()
    store.close()


def test_offline_figures_and_delete_follow_the_index(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    write_chunks(cache)
    index = read_index(cache)
    assert index is not None
    assert index.parents() == {SYSTEM: ROOT, A: SYSTEM, B: SYSTEM}
    index.close()
    book = SessionBook(tmp_path / "sessions.db")
    book.save("a", (Message("user", "x"),), 3, "fp", A)
    book.save("b", (Message("user", "y"),), 3, "fp", B)
    disk = offline.cache_stats(cache, book)["tiers"]["disk"]
    assert (disk["chunks"], disk["tokens"], disk["kv_bytes"]) == (3, 4, 4000)
    assert offline.delete_session(cache, book, "a")
    again = TieredStore("fp", None, DiskTier(cache, "fp", 1, 1 << 30))
    assert set(again.ledger.records) == {SYSTEM, B}  # the shared chunk stays
    assert again.drop_unshared(B, []) == 2  # the last conversation takes it along
    again.flush()
    again.close()
    assert offline.cache_stats(cache, book)["tiers"]["disk"]["chunks"] == 0
    assert read_index(tmp_path / "nothing") is None
    book.close()
