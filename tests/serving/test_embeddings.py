"""Embeddings on the real model: their own context, the chat's KV untouched, and a
separately configured embedding GGUF (the ``embedding_model`` setting)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from warmstart.runtime.errors import RequestError

from tests.conftest import chat


def test_embedding_between_turns_changes_no_reply(make_runtime: Callable) -> None:
    rt = make_runtime()
    request = chat("Name a colour of the sky.", session_id="emb-1")
    first, _ = rt.generate(request).text()
    rt.embed(["a text that is not in the chat", "and another one"])
    again, report = rt.generate(request).text()
    assert again == first
    assert report.cached_tokens > 0  # the live sequence is still there


def test_too_long_an_input_is_refused(make_runtime: Callable) -> None:
    rt = make_runtime()
    with pytest.raises(RequestError) as refused:
        rt.embed(["word " * 3000])
    assert refused.value.param == "input"


def test_a_configured_embedding_model(make_runtime: Callable, model_path: Path) -> None:
    """The same GGUF as a separate embedding model: its own id, the same vectors."""
    own = make_runtime(embedding_model=str(model_path))
    shared = make_runtime(data_dir=own.settings.data_dir / "other")
    texts = ["Bees make honey."]
    separate = own.embed(texts)
    assert separate.model == model_path.stem
    assert separate.vectors[0] == pytest.approx(shared.embed(texts).vectors[0], abs=1e-5)
