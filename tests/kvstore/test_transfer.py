"""The transfers alone, with no store: they move bytes with what they are given and
hand each result back as a return value (runtime/kvstore/_transfer.py)."""

from __future__ import annotations

import ast
import random
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


def test_a_write_is_handed_over_once_the_engine_is_quiet(tmp_path: Path) -> None:
    durable_s = 60.0
    disk, transfers = DiskTier(tmp_path, "fp", 1, 1 << 30), Transfers(durable_s=durable_s)
    transfers.hold(True)
    transfers.enqueue_write(disk, record(3), np.zeros(10, dtype=np.uint8))
    started = time.monotonic()
    transfers.hold(False)  # no client waits any more
    # at once, not after the write's durable_s: a tenth of it is far from both, on a
    # quiet machine (milliseconds) and beside other work alike
    assert isinstance(transfers.next(1.0), Write)
    assert time.monotonic() - started < durable_s / 10
    transfers.done()
    transfers.stop()
    last = transfers.next(1.0)
    assert isinstance(last, Turn) and last.stop and transfers.quiet
    transfers.done()
    disk.close()
