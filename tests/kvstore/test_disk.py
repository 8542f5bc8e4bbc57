import random
import sqlite3
import stat
from pathlib import Path

import pytest
from warmstart.runtime import sqlite
from warmstart.runtime.errors import CacheError
from warmstart.runtime.kvstore._disk import DiskTier
from warmstart.runtime.kvstore._index import MIGRATIONS, IndexRow

PAYLOAD = random.Random(0).randbytes(100_000)  # incompressible: stored as a file


def row(key: bytes = b"k" * 16) -> IndexRow:
    return IndexRow(key, b"p" * 16, 0, (1, 2, 3), len(PAYLOAD))


def mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def test_put_get_and_private_files(tmp_path: Path) -> None:
    disk = DiskTier(tmp_path / "c", "fp", level=1, budget_bytes=1 << 30)
    disk.put(row(), PAYLOAD)
    assert disk.get(row().key) == PAYLOAD
    assert mode(tmp_path / "c") == 0o700 and mode(tmp_path / "c" / "blobs") == 0o700
    files = [p for p in (tmp_path / "c" / "blobs").rglob("*.val")]
    assert files and all(mode(p) == 0o600 for p in files)
    assert mode(tmp_path / "c" / "index.db") == 0o600
    disk.close()


def test_a_new_instance_sees_the_index_of_its_fingerprint_only(tmp_path: Path) -> None:
    DiskTier(tmp_path, "fp", 0, 1 << 30).put(row(), PAYLOAD)
    assert [r.tokens for r in DiskTier(tmp_path, "fp", 0, 1 << 30).rows()] == [(1, 2, 3)]
    assert list(DiskTier(tmp_path, "other", 0, 1 << 30).rows()) == []


def test_corrupt_blob_is_refused_and_dropped(tmp_path: Path) -> None:
    disk = DiskTier(tmp_path, "fp", 0, 1 << 30)
    disk.put(row(), PAYLOAD)
    (blob,) = list((tmp_path / "blobs").rglob("*.val"))
    data = bytearray(blob.read_bytes())
    data[-100] ^= 0xFF
    blob.write_bytes(bytes(data))
    with pytest.raises(CacheError):
        disk.get(row().key)
    assert disk.get(row().key) is None and list(disk.rows()) == []


def test_record_of_another_model_is_refused(tmp_path: Path) -> None:
    DiskTier(tmp_path, "fp", 0, 1 << 30).put(row(), PAYLOAD)
    other = DiskTier(tmp_path, "other", 0, 1 << 30)
    with pytest.raises(CacheError, match="another model"):
        other.get(row().key)


def test_missing_blob_is_a_miss_and_drops_its_row(tmp_path: Path) -> None:
    disk = DiskTier(tmp_path, "fp", 0, 1 << 30)
    disk.put(row(), PAYLOAD)
    for blob in (tmp_path / "blobs").rglob("*.val"):
        blob.unlink()
    assert disk.get(row().key) is None
    assert list(disk.rows()) == []


def test_migrations_on_a_blank_database(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "blank.db")
    assert sqlite.migrate(conn, MIGRATIONS) == ["0001_chunks", "0002_chunk_logits"]
    assert sqlite.migrate(conn, MIGRATIONS) == []
    cols = [r[1] for r in conn.execute("PRAGMA table_info(chunks)")]
    assert {"key", "fingerprint", "parent", "start", "tokens", "nbytes"} <= set(cols)
