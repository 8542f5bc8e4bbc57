"""A decode step of several replies (``LlamaEngine.step_many``) reaches llama.cpp in
order of sequence, whatever order the worker gives them in: with a KV stream per
sequence, llama.cpp puts sequences in one micro-batch only while each one's id follows
the last one's, so the worker's round-robin order (sequences 3, 1, 0, 2) was three or
four passes over the weights a step. Each reply still gets its own logits back (that
they are the bits it gets decoded alone is the decode probe's test)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from warmstart.runtime.engine._engine import LlamaEngine
from warmstart.runtime.serving._factory import engine_config
from warmstart.runtime.serving._load import load_model

from tests.conftest import small_settings


def test_replies_go_in_order_of_sequence_and_get_their_own_logits(
    model_path: Path, tmp_path: Path
) -> None:
    settings = small_settings(tmp_path, model_path)
    loaded = load_model(settings)
    engine = LlamaEngine(engine_config(settings, loaded, 512, 4, 0), model=loaded.model)
    try:
        residents = engine.residents[:4]
        for i, res in enumerate(residents):
            ids = engine.model.tokenize(f"Reply number {i} opens the ledger.", add_special=False)
            assert engine.prefill(res, ids, want_logits=True)
        steps = [(residents[k], 300 + k) for k in (3, 1, 0, 2)]  # the worker's order
        sent: list[list[int]] = []
        decode_each = engine.ctx.decode_each

        def spy(batch: list[tuple[int, int, int]]) -> int:
            sent.append([seq for seq, _, _ in batch])
            return decode_each(batch)

        engine.ctx.decode_each = spy  # type: ignore[method-assign]
        together = engine.step_many(steps)
        assert sent == [[0, 1, 2, 3]]
        assert [res.tokens[-1] for res, _ in steps] == [303, 301, 300, 302]
        for res, _ in steps:
            engine.trim(res, len(res.tokens) - 1)
        # the same step given in order: the same batch reaches llama.cpp, so the same
        # bits on any machine, each reply's where the shuffled step put it
        in_order = engine.step_many(sorted(steps, key=lambda step: step[0].seq))
        assert sent[1] == [0, 1, 2, 3]
        for (res, _), logits in zip(steps, together, strict=True):
            assert np.array_equal(logits, in_order[res.seq]), res.seq
        assert not all(np.array_equal(together[0], other) for other in together[1:])
    finally:
        engine.close()
