"""A capture reads only the cells it keeps (issue 45, item 2).

warmstart's build of llama.cpp exports a sequence's state for a range of positions
(``llama_state_seq_get_data_range``, installers/llama_patches.py). The chunks cut from
such an export must be the very bytes the same chunks of a whole export are, or a
restore would differ from a recompute; where the export is missing (another build),
a capture reads the whole sequence, as before, and gets the same chunks.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from warmstart.runtime.engine import _kvblob, _llama
from warmstart.runtime.engine._engine import LlamaEngine

from tests.conftest import small_settings

pytestmark = pytest.mark.slow

TEXT = (
    "A capture keeps the chunks a turn added to the conversation; the older ones are "
    "in the store already, and reading them again costs as much as the conversation. "
)
BATCHES = (0, 64, 128, 192, 230)  # aligned prefill batches, then a shorter last one
SPANS = ((0, 64), (64, 128), (128, 192), (192, 230))


@pytest.fixture(scope="module", params=["smollm2", "gemma3"])
def engine(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LlamaEngine]:
    """The default model, and Gemma 3 (two KV caches: the base and the sliding window)."""
    from warmstart.runtime.serving._factory import engine_config
    from warmstart.runtime.serving._load import load_model

    fixture = "model_path" if request.param == "smollm2" else "gemma_path"
    model: Path = request.getfixturevalue(fixture)
    settings = small_settings(tmp_path_factory.mktemp("range"), model)
    loaded = load_model(settings)
    built = LlamaEngine(
        engine_config(settings, loaded, 512, 2, loaded.model.n_gpu_layers), model=loaded.model
    )
    yield built
    built.close()


@pytest.fixture
def prefilled(engine: LlamaEngine) -> Iterator[int]:
    """A resident holding 230 tokens, prefilled in BATCHES; its sequence id."""
    ids = engine.model.tokenize(TEXT * 20, add_special=True)[: BATCHES[-1]]
    assert len(ids) == BATCHES[-1]
    bounds = list(BATCHES[1:])
    res, _ = engine.claim(ids, bounds, "range", share=True)
    try:
        for b0, b1 in itertools.pairwise(BATCHES):
            assert engine.prefill(res, ids[b0:b1], want_logits=b1 == BATCHES[-1])
        yield res.seq
    finally:
        engine.evict(res, counted=False)
        engine.release(res)


def _chunks(engine: LlamaEngine, snapshot: list, spans: tuple[tuple[int, int], ...]) -> list[bytes]:  # type: ignore[type-arg]
    out = []
    for c0, c1 in spans:
        buf = np.empty(engine.blob_bytes(c1 - c0), dtype=np.uint8)
        out.append(buf[: engine.cut(snapshot, c0, c1, buf)].tobytes())
    return out


def test_a_range_export_holds_only_its_cells_and_cuts_into_the_same_bytes(
    engine: LlamaEngine, prefilled: int
) -> None:
    assert engine.ctx.exports_ranges, "warmstart's build exports ranges"
    ctx = engine.ctx
    before = ctx.state_bytes_read
    whole = _chunks(engine, engine.snapshot(prefilled), SPANS)  # copied out: the buffer is reused
    whole_bytes = ctx.state_bytes_read - before
    for run in (SPANS[:1], SPANS[1:3], SPANS[3:], SPANS):  # one chunk, adjacent ones, the tail
        c0, c1 = run[0][0], run[-1][1]
        before = ctx.state_bytes_read
        snapshot = engine.snapshot(prefilled, c0, c1)
        read = ctx.state_bytes_read - before
        expected = whole[SPANS.index(run[0]) : SPANS.index(run[-1]) + 1]
        assert _chunks(engine, snapshot, run) == expected
        # the cells of the range and nothing else (an SWA cache holds them all here:
        # 230 tokens are inside Gemma 3's 512-token window)
        for view in snapshot[1:]:
            assert np.array_equal(_kvblob.positions(view), np.arange(c0, c1, dtype=np.int32))
        assert read == _kvblob.assembled_bytes(engine.layout, c1 - c0)
        if (c0, c1) != (0, 230):
            assert read < whole_bytes


def test_without_the_range_export_the_whole_sequence_is_read_for_the_same_chunks(
    engine: LlamaEngine, prefilled: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    ranged = _chunks(engine, engine.snapshot(prefilled, 128, 230), SPANS[2:])
    monkeypatch.setattr(_llama, "_GET_RANGE", None)  # an upstream llama.cpp
    ctx = engine.ctx
    before = ctx.state_bytes_read
    snapshot = engine.snapshot(prefilled, 128, 230)
    assert ctx.state_bytes_read - before == ctx.state_size(prefilled)
    assert _chunks(engine, snapshot, SPANS[2:]) == ranged
