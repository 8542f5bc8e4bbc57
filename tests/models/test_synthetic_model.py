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
