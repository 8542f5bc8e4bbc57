"""A prompt's last chunk kept with the next-token logits its batch gave (issue 45): in
the RAM pool and on disk (record format 3, index migration 0002), bit for bit; a chunk
without them, an old store's, or one whose record proves corrupt, is never a prompt's
last restored chunk (its batch is recomputed)."""

import sqlite3
from pathlib import Path

import numpy as np
import pytest
from warmstart.runtime.errors import CacheError
from warmstart.runtime.kvstore import _codec
from warmstart.runtime.kvstore._disk import DiskTier
from warmstart.runtime.kvstore._pool import RamPool
from warmstart.runtime.kvstore._store import TieredStore

SLOT = 1 << 18
KV = 6000
VOCAB = 49_152  # SmolLM2's: 192 KiB of float32


def make(tmp_path: Path) -> TieredStore:
    return TieredStore("fp", RamPool(4 * SLOT, SLOT), DiskTier(tmp_path, "fp", 1, 1 << 30))


def kv(seed: int) -> bytes:
    return np.random.default_rng(seed).bytes(KV)


def logits(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(VOCAB).astype(np.float32)


def keep(store: TieredStore, ids: list[int], ends: list[int], given: np.ndarray | None) -> None:
    """Captures every chunk along ``ends`` as a capture does, with ``given`` as the
    logits of the batch that ends at the last one."""
    at = None if given is None else (ends[-1], given)
    plan = store.prepare_store(ids, ends, lambda _n: KV, logits=at)
    for i, save in enumerate(plan.saves):
        save.buffer[:KV] = np.frombuffer(kv(save.start + i), dtype=np.uint8)
        save.nbytes = KV
    assert store.complete_store(plan) is not None


def loaded(store: TieredStore, ids: list[int], cuts: list[int]):  # type: ignore[no-untyped-def]
    plan = store.prepare_load(ids, cuts, logits=True)
    try:
        blobs, found = store.load_prompt(plan)
        return [bytes(b) for b in blobs], found, plan
    finally:
        store.complete_load(plan)


def same_bits(a: np.ndarray | None, b: np.ndarray) -> bool:
    return (
        a is not None
        and a.dtype == np.float32
        and a.view(np.uint32).tolist() == b.view(np.uint32).tolist()
    )


def test_the_last_chunk_keeps_its_logits_in_ram_and_on_disk(tmp_path: Path) -> None:
    ids, ends, given = [1, 2, 3, 4, 5], [3, 5], logits(1)
    store = make(tmp_path)
    keep(store, ids, ends, given)
    blobs, found, plan = loaded(store, ids, ends)
    assert blobs == [kv(0), kv(4)] and same_bits(found, given)  # the KV without them
    assert [c.tier for c in plan.loads] == ["ram", "ram"]
    assert plan.records[-1].logits == 4 * VOCAB and plan.records[0].logits == 0
    assert plan.nbytes == 2 * KV + 4 * VOCAB  # counted in the pool's bytes, and priced
    assert store.flush(10)
    store.close()
    again = make(tmp_path)  # a restart: from the disk tier
    try:
        blobs, found, plan = loaded(again, ids, ends)
        assert [c.tier for c in plan.loads] == ["disk", "disk"]
        assert blobs == [kv(0), kv(4)] and same_bits(found, given)
        assert again.stats().disk.kv_bytes == 2 * KV + 4 * VOCAB
    finally:
        again.close()


def test_a_last_chunk_without_logits_is_left_to_recompute(tmp_path: Path) -> None:
    ids, ends = [1, 2, 3, 4, 5], [3, 5]
    store = make(tmp_path)
    try:
        keep(store, ids, ends, None)
        blobs, found, plan = loaded(store, ids, ends)
        assert blobs == [kv(0)] and found is None and plan.end == 3
        # a longer prompt needs no logits of it: the chunk is restored as before
        longer = store.prepare_load([*ids, 6, 7], [3, 5, 7], logits=True)
        assert longer.end == 5
        store.complete_load(longer)
    finally:
        store.close()


def test_a_store_from_before_logits_still_loads(tmp_path: Path) -> None:
    """Its records are format 2 and its index has no logits column (migration 0002
    adds it, 0 for every row): its chunks restore, its prompts' last batch recomputes."""
    ids, ends = [1, 2, 3, 4, 5], [3, 5]
    store = make(tmp_path)
    keep(store, ids, ends, None)
    assert store.flush(10)
    store.close()
    db = sqlite3.connect(tmp_path / "index.db")
    db.execute("ALTER TABLE chunks DROP COLUMN logits")
    db.execute("DELETE FROM schema_migrations WHERE name = '0002_chunk_logits'")
    db.commit()
    db.close()
    again = make(tmp_path)
    try:
        blobs, found, _ = loaded(again, ids, ends)
        assert blobs == [kv(0)] and found is None
        assert [bytes(b) for b in again.load(again.prepare_load(ids, ends))] == [kv(0), kv(4)]
    finally:
        again.close()


def test_a_record_whose_logits_prove_corrupt_is_dropped(tmp_path: Path) -> None:
    ids, ends, given = [1, 2, 3, 4, 5], [3, 5], logits(2)
    store = make(tmp_path)
    keep(store, ids, ends, given)
    assert store.flush(10)
    store.close()
    files = sorted((tmp_path / "blobs").rglob("*.val"), key=lambda p: p.stat().st_size)
    data = bytearray(files[-1].read_bytes())  # the record with the logits: the largest
    data[-100] ^= 0xFF
    files[-1].write_bytes(bytes(data))
    again = make(tmp_path)
    try:
        blobs, found, _ = loaded(again, ids, ends)
        assert blobs == [kv(0)] and found is None  # the batch before it, no logits
        assert again.stats().corrupt == 1
        assert loaded(again, ids, ends)[2].end == 3  # dropped: not found again
    finally:
        again.close()


def test_the_record_format_says_how_many_of_its_bytes_are_logits() -> None:
    fp, key, payload = _codec.fingerprint_digest("m"), bytes(16), kv(3) + logits(3).tobytes()
    record = _codec.encode(payload, key, fp, 1, logits=4 * VOCAB)
    header = _codec.read_header(record)
    assert (header.version, header.logits) == (_codec.LOGITS_VERSION, 4 * VOCAB)
    assert _codec.decode(record, fp, key) == payload
    plain = _codec.encode(kv(3), key, fp, 1)  # without logits: format 2, as before
    assert _codec.read_header(plain).version == _codec.FORMAT_VERSION == 2
    with pytest.raises(CacheError, match="truncated"):
        _codec.read_header(record[: _codec.HEADER_BYTES])
