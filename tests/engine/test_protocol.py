"""Both engines keep the Engine protocol (runtime/engine/_protocol.py) as the pipeline
relies on it: the llama.cpp one on the default model, and the fake."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from warmstart.runtime.engine._protocol import Engine
from warmstart.runtime.errors import RequestError
from warmstart.runtime.types import Message, Request, Sampling

ASK = Request(
    messages=(Message("system", "Be brief."), Message("user", "Say hello to the cache.")),
    sampling=Sampling(max_tokens=4),
)


@pytest.fixture(scope="module", params=["fake", "llama"])
def engine(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Engine]:
    if request.param == "fake":
        from warmstart.runtime.engine._fake import FakeEngine, FakeOptions

        built: Engine = FakeEngine(512, 2, FakeOptions(prefill_delay=0.0))
    else:
        from warmstart.runtime.engine._engine import LlamaEngine
        from warmstart.runtime.serving._factory import engine_config
        from warmstart.runtime.serving._load import load_model

        from tests.conftest import small_settings

        settings = small_settings(
            tmp_path_factory.mktemp("engine"), request.getfixturevalue("model_path")
        )
        loaded = load_model(settings)
        config = engine_config(settings, loaded, 512, 2, loaded.model.n_gpu_layers)
        built = LlamaEngine(config, model=loaded.model)
    yield built
    built.close()


def test_prompt_ids_are_stable_and_anchored(engine: Engine) -> None:
    ids, anchors = engine.prompter.prompt_ids(ASK)
    assert ids and (ids, anchors) == engine.prompter.prompt_ids(ASK)
    assert all(0 < a <= len(ids) for a in anchors) and list(anchors) == sorted(set(anchors))
    history, _ = engine.prompter.prompt_ids(ASK, generation=False)
    assert ids[: len(history)] == history and len(history) < len(ids)


def test_both_engines_prompts_come_from_one_prompt_work(engine: Engine) -> None:
    """Each engine's prompter is the one ``ChatPrompter`` over its own template and
    tokens, so the fake's anchors come from the rule a real model's do (and cannot
    drift from it): where the system prompt ends (the user's turn opens there), where
    the user's text starts, and the prompt's last two tokens."""
    from warmstart.runtime.engine._prompter import ChatPrompter

    prompter = engine.prompter
    assert isinstance(prompter, ChatPrompter) and prompter.opener and prompter.user_header
    ids, anchors = prompter.prompt_ids(ASK)
    system, _ = prompter.prompt_ids(Request(messages=ASK.messages[:1]), generation=False)
    header = len(prompter.user_header)
    assert ids[len(system) : len(system) + header] == prompter.user_header
    assert {len(system), len(system) + header, len(ids) - 2, len(ids)} <= set(anchors)


def test_a_prefilled_prompt_is_cut_and_restored_as_the_same_kv(engine: Engine) -> None:
    ids, _ = engine.prompter.prompt_ids(ASK)
    half = len(ids) // 2
    res, live = engine.claim(ids, [half, len(ids)], "protocol", share=True)
    try:
        assert live == 0 and res.busy
        assert engine.prefill(res, ids[:half], want_logits=False)
        assert engine.prefill(res, ids[half:], want_logits=True)
        assert res.tokens == ids and res.bounds == [half, len(ids)]
        logits = engine.keep_logits(res)
        assert logits.ndim == 1 and logits.size <= engine.model.n_vocab
        sampler = engine.sampler(ASK.sampling)
        try:
            token = sampler.sample(engine.ctx, logits)
        finally:
            sampler.close()
        assert 0 <= token < engine.model.n_vocab
        snapshot = engine.snapshot(res.seq)
        chunks = []
        for c0, c1 in ((0, half), (half, len(ids))):
            out = np.empty(engine.blob_bytes(c1 - c0), dtype=np.uint8)
            assert engine.cut(snapshot, c0, c1, out) == out.nbytes
            chunks.append(out)
        engine.evict(res, counted=False)
        assert res.tokens == [] and engine.restore(res, chunks, ids, [half, len(ids)])
        assert res.tokens == ids and res.bounds == [half, len(ids)]
    finally:
        engine.evict(res, counted=False)
        engine.release(res)
    assert not res.busy


def test_the_vocabulary_reads_back_and_bad_sampling_is_refused(engine: Engine) -> None:
    ids = engine.model.tokenize(" hello world", False, False)
    assert b"".join(engine.model.piece(t) for t in ids).decode().strip() == "hello world"
    assert not any(engine.model.is_eog(t) for t in ids)
    with pytest.raises(RequestError):
        engine.prompter.check_sampling(Sampling(logit_bias=((engine.model.n_vocab + 5, 1.0),)))
    with pytest.raises(RequestError):
        engine.prompter.check_sampling(Sampling(grammar="root ::= ("))


def test_the_fakes_kv_holds_its_tokens() -> None:
    """Only the fake can tell (its cells hold token ids): chunks restored for other
    tokens are refused, as llama.cpp refuses a blob that does not line up."""
    from warmstart.runtime.engine._fake import FakeEngine, FakeOptions

    engine = FakeEngine(512, 1, FakeOptions(prefill_delay=0.0))
    ids, _ = engine.prompter.prompt_ids(ASK)
    res, _ = engine.claim(ids, [len(ids)], None, share=True)
    assert engine.prefill(res, ids, want_logits=False)
    out = np.empty(engine.blob_bytes(len(ids)), dtype=np.uint8)
    engine.cut(engine.snapshot(res.seq), 0, len(ids), out)
    engine.evict(res, counted=False)
    assert not engine.restore(res, [out], list(reversed(ids)), [len(ids)])
    assert res.tokens == [] and engine.restore(res, [out], ids, [len(ids)])
