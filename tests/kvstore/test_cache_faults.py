"""Bad cache records on the real model: detected, dropped, recomputed; never a wrong answer."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from warmstart.runtime.kvstore import _codec

from tests.conftest import chat

pytestmark = pytest.mark.slow
QUESTION = "Explain in one sentence why the sea is salty."


def blob_files(cache_dir: Path) -> list[Path]:
    return sorted((cache_dir / "blobs").rglob("*.val"))


def warm_disk(make_runtime, data_dir: Path) -> np.ndarray:  # type: ignore[no-untyped-def]
    """Runs the question once (capturing it to disk); returns the recomputed logits."""
    rt = make_runtime(data_dir)
    truth, _ = rt.prompt_logits(replace(chat(QUESTION), use_cache=False))
    rt.prompt_logits(chat(QUESTION))
    rt.close()
    assert blob_files(data_dir / "cache")
    return truth


def ask_fresh(make_runtime, data_dir: Path):  # type: ignore[no-untyped-def]
    rt = make_runtime(data_dir)
    logits, report = rt.prompt_logits(chat(QUESTION))
    return rt, logits, report


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_corrupt_or_truncated_record_is_dropped_and_recomputed(
    make_runtime, tmp_path: Path, damage: str
) -> None:  # type: ignore[no-untyped-def]
    truth = warm_disk(make_runtime, tmp_path)
    victim = blob_files(tmp_path / "cache")[0]
    data = bytearray(victim.read_bytes())
    if damage == "flip":
        data[len(data) // 2] ^= 0xFF
        victim.write_bytes(bytes(data))
    else:
        victim.write_bytes(bytes(data[: len(data) // 3]))
    rt, logits, report = ask_fresh(make_runtime, tmp_path)
    assert rt.store.stats().corrupt >= 1
    np.testing.assert_array_equal(logits.argmax(), truth.argmax())
    np.testing.assert_allclose(logits, truth, atol=1e-3)
    assert report.cached_tokens < report.prompt_tokens - 2  # not all of it came back
    rt.evict_live()  # from the store, not from the sequence that recomputed them
    _, again = rt.prompt_logits(chat(QUESTION))
    assert again.cached_tokens == again.prompt_tokens - 2  # recomputed chunks were re-stored


def test_record_with_a_foreign_fingerprint_is_dropped(make_runtime, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    truth = warm_disk(make_runtime, tmp_path)
    for victim in blob_files(tmp_path / "cache"):
        data = victim.read_bytes()
        header = _codec.read_header(data)
        payload = _codec.decode(data, header.fingerprint, header.key)
        victim.write_bytes(
            _codec.encode(payload, header.key, _codec.fingerprint_digest("another model"), 1)
        )
    rt, logits, report = ask_fresh(make_runtime, tmp_path)
    assert report.cached_tokens == 0 and rt.store.stats().corrupt >= 1
    np.testing.assert_allclose(logits, truth, atol=1e-3)


def test_other_kv_type_never_sees_f16_chunks(make_runtime, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    warm_disk(make_runtime, tmp_path)
    rt = make_runtime(tmp_path, type_kv="q8_0", flash_attn="on")
    truth, _ = rt.prompt_logits(replace(chat(QUESTION), use_cache=False))
    logits, report = rt.prompt_logits(chat(QUESTION))
    assert report.restored["disk"] == 0 and report.restored["ram"] == 0
    np.testing.assert_allclose(logits, truth, atol=1e-3)


def test_blob_llama_cpp_refuses_is_dropped_and_recomputed(make_runtime, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Defence in depth: even a record that passes our header (say a fingerprint bug
    let a q8_0 blob in) is checked by llama.cpp's byte count, dropped, recomputed."""
    truth = warm_disk(make_runtime, tmp_path)
    q8 = make_runtime(tmp_path / "q8", type_kv="q8_0", flash_attn="on")
    q8.prompt_logits(chat(QUESTION))
    q8.close()
    q8_blob = _codec.read_header(blob_files(tmp_path / "q8" / "cache")[0].read_bytes())
    q8_payload = _codec.decode(
        blob_files(tmp_path / "q8" / "cache")[0].read_bytes(), q8_blob.fingerprint, q8_blob.key
    )
    victim = blob_files(tmp_path / "cache")[0]
    header = _codec.read_header(victim.read_bytes())
    victim.write_bytes(_codec.encode(q8_payload, header.key, header.fingerprint, 1))
    # keep the index's byte count truthful so the record reaches llama.cpp
    import sqlite3

    with sqlite3.connect(tmp_path / "cache" / "index.db") as db:
        db.execute("UPDATE chunks SET nbytes = ? WHERE key = ?", (len(q8_payload), header.key))
    _, logits, report = ask_fresh(make_runtime, tmp_path)
    np.testing.assert_allclose(logits, truth, atol=1e-3)
    assert report.cached_tokens < report.prompt_tokens - 2
