"""The transfers alone, with no store: they move bytes with what they are given and
hand each result back as a return value (runtime/kvstore/_transfer.py)."""

from __future__ import annotations

import ast
import random
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from warmstart.runtime.errors import DiskFull
from warmstart.runtime.kvstore import _transfer
from warmstart.runtime.kvstore._disk import DiskTier
from warmstart.runtime.kvstore._ledger import Record
from warmstart.runtime.kvstore._transfer import Delete, Transfers, Turn, Write


def record(i: int, nbytes: int = 5000) -> Record:
    return Record(bytes([i]) * 16, b"p" * 16, 0, (i,), nbytes)


def test_they_know_nothing_of_the_store() -> None:
    tree = ast.parse(Path(_transfer.__file__).read_text("utf-8"))
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert "_store" not in imported and not any("_store" in (m or "") for m in imported)


def test_a_write_then_a_read_then_a_delete_each_report_by_return(tmp_path: Path) -> None:
    disk, transfers = DiskTier(tmp_path, "fp", 1, 1 << 30), Transfers()
    data = random.Random(1).randbytes(5000)
    rec = record(1)
    transfers.enqueue_write(disk, rec, np.frombuffer(data, dtype=np.uint8))
    transfers.enqueue_delete(disk, rec.key)
    write, delete = transfers.next(1.0), transfers.next(1.0)
    assert isinstance(write, Write) and isinstance(delete, Delete)  # in the order asked
    assert Transfers.write(write) is None
    out = np.empty(8192, dtype=np.uint8)
    assert Transfers.read(disk, rec.key, out) == (5000, False) and bytes(out[:5000]) == data
    Transfers.delete(delete)
    assert Transfers.read(disk, rec.key, out) == (None, False)  # gone: a miss
    transfers.done()
    transfers.done()
    assert transfers.flush(1.0) and transfers.next(0.01) is None
    disk.close()


def test_a_failed_write_and_a_corrupt_read_are_results(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    disk = DiskTier(tmp_path, "fp", 0, 1 << 30)
    rec = record(2, 100_000)  # incompressible: kept as a file
    payload = np.frombuffer(random.Random(2).randbytes(100_000), dtype=np.uint8)
    job = Write(disk, rec, payload, time.monotonic())
    assert Transfers.write(job) is None
    (blob,) = (tmp_path / "blobs").rglob("*.val")
    data = bytearray(blob.read_bytes())
    data[-100] ^= 0xFF
    blob.write_bytes(bytes(data))
    assert Transfers.read(disk, rec.key, np.empty(100_000, dtype=np.uint8)) == (None, True)

    def full(*_a: object) -> None:
        raise DiskFull("the cache disk is full")

    monkeypatch.setattr(disk, "put", full)
    assert isinstance(Transfers.write(job), DiskFull)
    disk.close()


def test_a_write_is_handed_over_once_the_engine_is_quiet(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Shown without a clock: with the hold's limits (HOLD_S, half of durable_s) an hour
    away, a write handed over at all was handed over because the engine went quiet."""
    monkeypatch.setattr(_transfer, "HOLD_S", 3600.0)
    disk, transfers = DiskTier(tmp_path, "fp", 1, 1 << 30), Transfers(durable_s=7200.0)
    transfers.hold(True)
    transfers.enqueue_write(disk, record(3), np.zeros(10, dtype=np.uint8))
    handed: list[object] = []
    writer = threading.Thread(target=lambda: handed.append(transfers.next(1.0)), daemon=True)
    writer.start()  # the store's writer thread: it holds the write while a client waits
    transfers.hold(False)  # no client waits any more
    writer.join(60)  # a hang guard, not the bound: the hold's own limits are an hour
    assert not writer.is_alive() and isinstance(handed[0], Write)
    transfers.done()
    transfers.stop()
    last = transfers.next(1.0)
    assert isinstance(last, Turn) and last.stop and transfers.quiet
    transfers.done()
    disk.close()
