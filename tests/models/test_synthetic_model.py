"""The synthetic models `make bench-peers` and the GPU check measure with: written on
first use and reused, a name that asks for an unknown one refused, and a prompt with the
structure of a real chat model's (turn markup of control tokens), so that warmstart
treats it as it treats the models people run."""

from __future__ import annotations

from pathlib import Path

import pytest
from warmstart.runtime.errors import ModelNotFound
from warmstart.runtime.models import synthetic_model, synthetic_name
from warmstart.runtime.models._synthetic import GEOMETRIES
from warmstart.runtime.types import Message, Request


def test_a_synthetic_model_is_written_once_and_reused(tmp_path: Path) -> None:
    assert synthetic_name("synth:llama-1b") == "llama-1b" and synthetic_name("llama3.2") is None
    g = GEOMETRIES["llama-1b"]  # Llama-3.2-1B's shape
    assert (g.n_layer, g.n_embd, g.n_head, g.n_head_kv, g.n_ff) == (16, 2048, 32, 8, 8192)
    path = synthetic_model("tiny", tmp_path)
    written = path.stat().st_mtime_ns
    assert synthetic_model("tiny", tmp_path) == path and path.stat().st_mtime_ns == written
    assert "-v" in path.name  # the writer's version: another one's file is not reused
    with pytest.raises(ModelNotFound, match="synth:llama-8b"):
        synthetic_model("llama-70b", tmp_path)


def test_its_prompts_have_turns_as_a_real_chat_models_do(tmp_path: Path) -> None:
    from warmstart.runtime.engine._engine import EngineConfig, LlamaEngine

    engine = LlamaEngine(EngineConfig(synthetic_model("tiny", tmp_path), "x", 512, 1))
    try:
        prompter = engine.prompter
        assert prompter.opener and prompter.user_header  # the assistant's and the user's
        turns = (Message("system", "Be brief."), Message("user", "Hi"))
        ids, anchors = prompter.prompt_ids(Request(messages=turns))
        # the system prompt's end, the user's text, and the prompt's last batches
        assert len(anchors) >= 4 and anchors[-1] == len(ids)
        assert engine.model.is_eog(engine.model.n_vocab - 1)  # <|eot_id|> ends a reply
    finally:
        engine.close()


def test_its_vocabulary_is_the_real_models_size_with_eot_last() -> None:
    from warmstart.runtime.models._synthetic import vocabulary

    tokens, scores, types = vocabulary(GEOMETRIES["llama-1b"].n_vocab)
    assert len(tokens) == len(scores) == len(types) == 128_256  # Llama 3's
    assert tokens[3 + 0x41] == "<0x41>" and tokens[-1] == "<|eot_id|>"
    assert len(vocabulary()[0]) == 262  # unpadded: the byte tokens and the markup


def test_its_replies_come_back_as_the_tokens_they_were_decoded_as(tmp_path: Path) -> None:
    """A reply is printable ASCII, so the next turn, which sends it back as text,
    reuses the reply's decoded tokens, as a real model's next turn does (the bench's
    traces at a 1B shape measured the re-prefill of noise before: FORMAT 3)."""
    from warmstart.runtime.serving._factory import build_runtime

    from tests.conftest import chat, small_settings

    path = synthetic_model("tiny", tmp_path)
    settings = small_settings(tmp_path / "data", path, n_ctx=1024, extra_buffers="off")
    with build_runtime(settings) as rt:
        text, first = rt.generate(chat("What is KV cache?", max_tokens=12)).text()
        _, second = rt.generate(chat("What is KV cache?", text, "Why?", max_tokens=4)).text()
    assert text and all(0x21 <= ord(c) < 0x7F for c in text)
    # the prompt, and the reply's tokens but its last (sampled, never decoded)
    reused = first.prompt_tokens + first.completion_tokens - 1
    assert second.restored["live"] >= reused


def test_its_q4_k_m_mix_has_the_k_quants_and_still_answers_in_text(tmp_path: Path) -> None:
    """``synth:<shape>-q4km``: the layers as in a Q4_K_M file (Q4_K, Q6_K for attn_v and
    ffn_down; random blocks, no quantizer), which llama.cpp loads and decodes into
    the same printable replies."""
    from gguf import GGUFReader
    from warmstart.runtime.serving._factory import build_runtime

    from tests.conftest import chat, small_settings

    path = synthetic_model("tiny-q4km", tmp_path)
    assert path.name.startswith("synthetic-tiny-q4km-v")
    types = {t.name: t.tensor_type.name for t in GGUFReader(path).tensors}
    assert types["blk.0.attn_q.weight"] == types["blk.1.ffn_up.weight"] == "Q4_K"
    assert types["blk.0.attn_v.weight"] == types["blk.1.ffn_down.weight"] == "Q6_K"
    assert types["output.weight"] == "Q8_0"  # the replies' rows (see the module's doc)
    settings = small_settings(tmp_path / "data", path, n_ctx=1024, extra_buffers="off")
    with build_runtime(settings) as rt:
        text, _ = rt.generate(chat("What is KV cache?", max_tokens=8)).text()
    assert text and all(0x21 <= ord(c) < 0x7F for c in text)
    with pytest.raises(ModelNotFound, match="K-quant blocks"):
        synthetic_model("smollm2-135m-q4km", tmp_path)  # 576 wide
