"""Replies decoded together in one llama.cpp batch get the bits each gets decoded alone
(runtime/engine/_decode_probe.py), with warmstart's build of llama.cpp on this machine:
2, 4 and 8 replies, 64 steps, every step's logits and the decoded tokens' KV, with the
default model and with a sliding-window one (Gemma 3)."""

from __future__ import annotations

from pathlib import Path

import pytest
from warmstart.runtime.engine._decode_probe import DecodeCheck, probe_decode, proven
from warmstart.runtime.engine._llama import ContextConfig, LlamaModel
from warmstart.runtime.engine._smoke import choose_extra_buffers
from warmstart.runtime.models._manager import DigestCache

from tests.conftest import MODELS_DIR, SHARED_VERDICTS


def _checks(path: Path) -> tuple[DecodeCheck, ...]:
    """The probe, with the extra buffer types the runtime would use here (the repacked
    weights have kernels of their own)."""
    digest = DigestCache(MODELS_DIR.parent / "digests.json").digest(path)
    extra = choose_extra_buffers("auto", path, digest, SHARED_VERDICTS).enabled
    model = LlamaModel(path, n_gpu_layers=0, extra_buffers=extra)
    try:
        config = ContextConfig(n_ctx=0, n_seq_max=1, swa_full=model.n_swa > 0)
        return probe_decode(model, config, counts=(2, 4, 8), steps=64, prompt_tokens=300)
    finally:
        model.close()


@pytest.mark.slow  # about 10 s on a quiet 2-core CPU, 704 decodes
def test_replies_decoded_in_one_batch_get_the_bits_of_each_alone(model_path: Path) -> None:
    checks = _checks(model_path)
    assert [c.n_seqs for c in checks] == [2, 4, 8]
    assert all(c.same for c in checks), [c.describe() for c in checks]
    assert proven(checks) == (8, "")


@pytest.mark.slow
def test_so_do_a_sliding_window_models(gemma_path: Path) -> None:
    checks = _checks(gemma_path)
    assert all(c.same for c in checks), [c.describe() for c in checks]


@pytest.mark.slow
def test_so_do_a_model_of_q8_0_weights(tmp_path: Path) -> None:
    """Every product of a synthetic Llama-shaped model is Q8_0 (of the default model,
    the output layer only): the rowwise Q8_0 kernel carries every layer of its decode
    steps, and each reply still gets the bits it gets alone."""
    from warmstart.runtime.models import synthetic_model

    checks = _checks(synthetic_model("tiny", tmp_path))
    assert [c.n_seqs for c in checks] == [2, 4, 8]
    assert all(c.same for c in checks), [c.describe() for c in checks]


def test_the_probe_stops_when_its_engine_is_interrupted(model_path: Path) -> None:
    """Its context shares the abort flag of the one it is measured for: a request that
    interrupts that engine stops the probe too, with nothing of it kept, and the same
    probe then runs to its end."""
    from warmstart.runtime.engine._llama import LlamaContext
    from warmstart.runtime.errors import EngineError

    model = LlamaModel(model_path, n_gpu_layers=0)
    owner = LlamaContext(model, ContextConfig(n_ctx=256, n_seq_max=1))
    config = ContextConfig(n_ctx=0, n_seq_max=1)
    try:
        owner.abort_decode(True)
        with pytest.raises(EngineError, match="the decode probe was stopped"):
            probe_decode(model, config, counts=(2,), steps=1, prompt_tokens=40, abort_with=owner)
        owner.abort_decode(False)
        (check,) = probe_decode(model, config, (2,), steps=1, prompt_tokens=40, abort_with=owner)
        assert check.n_seqs == 2 and check.steps == 1
    finally:
        owner.close()
        model.close()


def test_what_proven_keeps() -> None:
    same = [DecodeCheck(n, 4, True, True) for n in (2, 4, 8)]
    assert proven(same) == (8, "")
    differ = DecodeCheck(4, 4, False, True, first_step=0, max_diff=0.5)
    most, note = proven([same[0], differ, same[2]])
    assert most == 2
    assert note == "4 replies x 4 steps: logits differ (first at step 0, by up to 0.5)"
    assert proven([DecodeCheck(2, 4, True, False)])[0] == 0
