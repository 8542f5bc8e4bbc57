"""The Ollama dialect (/api/*) driven by Ollama's own Python client, on the fake runtime.

The same routes on the real model: test_ollama_real.py.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import ollama
import pytest
from warmstart.runtime.api import create_app
from warmstart.runtime.settings import load_settings

from tests.api.conftest import Server
from tests.conftest import fake_runtime

GREEDY = {"temperature": 0, "num_predict": 12}


@pytest.fixture
def client(server: Server) -> Iterator[ollama.Client]:
    with ollama.Client(host=server.base_url, timeout=60) as c:
        yield c


def _chat(topic: str) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": f"One fact about {topic}."},
    ]


def test_chat_whole_and_streamed_agree(client: ollama.Client) -> None:
    messages = _chat(f"owls {uuid.uuid4()}")
    whole = client.chat(model="default", messages=messages, options=GREEDY)
    assert whole.done and whole.done_reason in ("stop", "length")
    assert whole.message.role == "assistant" and whole.message.content
    assert whole.prompt_eval_count and whole.eval_count
    assert whole.total_duration and whole.total_duration > 0
    parts = list(client.chat(model="default", messages=messages, options=GREEDY, stream=True))
    assert [p.done for p in parts] == [False] * (len(parts) - 1) + [True]
    assert "".join(p.message.content or "" for p in parts) == whole.message.content
    assert parts[-1].eval_count == whole.eval_count


def test_generate_whole_and_streamed(client: ollama.Client) -> None:
    prompt = f"Say something about {uuid.uuid4()}"
    whole = client.generate(model="default", prompt=prompt, options=GREEDY)
    assert whole.done and whole.response
    parts = list(client.generate(model="default", prompt=prompt, options=GREEDY, stream=True))
    assert "".join(p.response or "" for p in parts) == whole.response
    raw = client.generate(model="default", prompt=prompt, raw=True, options=GREEDY)
    assert raw.done and raw.response


def test_empty_prompt_only_loads(client: ollama.Client) -> None:
    reply = client.generate(model="default")
    assert reply.done and reply.done_reason == "load" and reply.response == ""


def test_list_show_ps_version(client: ollama.Client, server: Server) -> None:
    names = [m.model for m in client.list().models]
    assert len(names) == 1 and names[0] and names[0].endswith(":latest")
    shown = client.show(names[0])
    assert shown.details is not None and shown.details.format == "gguf"
    assert shown.modelinfo is not None
    assert any(k.endswith(".context_length") for k in shown.modelinfo)
    assert client.ps().models[0].context_length
    assert httpx.get(server.base_url + "/api/version").json()["version"]
    with pytest.raises(ollama.ResponseError) as missing:
        client.show("no-such-model")
    assert missing.value.status_code == 404


def test_repeat_reports_cached_tokens(server: Server) -> None:
    """The client drops fields it does not know, so the report is read over HTTP."""
    body = {"model": "default", "messages": _chat(f"bees {uuid.uuid4()}"), "stream": False}
    first = httpx.post(server.base_url + "/api/chat", json=body, timeout=60).json()
    second = httpx.post(server.base_url + "/api/chat", json=body, timeout=60).json()
    assert first["cached_tokens"] == first["x_warmstart"]["cached_tokens"]
    assert second["cached_tokens"] > 0
    assert second["x_warmstart"]["prompt_tokens"] == second["prompt_eval_count"]


def test_streamed_last_line_carries_the_report(server: Server) -> None:
    body = {"messages": _chat(f"ants {uuid.uuid4()}"), "options": GREEDY}
    with httpx.stream("POST", server.base_url + "/api/chat", json=body, timeout=60) as reply:
        assert reply.headers["content-type"].startswith("application/x-ndjson")
        lines = [json.loads(line) for line in reply.iter_lines() if line]
    assert lines[-1]["done"] is True
    assert "cached_tokens" in lines[-1] and "x_warmstart" in lines[-1]


@pytest.mark.parametrize(
    "extra,param",
    [
        ({"options": {"mirostat": 1}}, "options.mirostat"),
        ({"options": {"num_ctx": 4096}}, "options.num_ctx"),
        ({"format": "yaml"}, "format"),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "strict": True}}]},
            "tools.0.function.strict",
        ),
        ({"think": True}, "think"),
        ({"keep_alive": 0}, "keep_alive"),  # the fake server cannot open its model again
        ({"mystery": 1}, "mystery"),
    ],
)
def test_unsupported_fields_are_refused_by_name(
    client: ollama.Client, server: Server, extra: dict[str, Any], param: str
) -> None:
    body = {"model": "default", "messages": _chat("x"), "stream": False, **extra}
    reply = httpx.post(server.base_url + "/api/chat", json=body, timeout=30)
    assert reply.status_code == 400
    assert reply.json() == {"error": f"{param} is not supported by warmstart" + _why(param)}


def _why(param: str) -> str:
    reasons = {
        "format": ': give "json" or a JSON schema',
        "think": ": the model runs without a thinking mode",
        "keep_alive": ": this server cannot open its model again once unloaded (no model file)",
    }
    return reasons.get(param, "")


def test_samplers_and_json_format_are_honoured(server: Server) -> None:
    """The options /v1 honours are honoured here too, and format holds the reply to
    JSON (the fake runtime answers any grammar with a JSON object)."""
    options = {"top_k": 5, "min_p": 0.05, "repeat_penalty": 1.1, "presence_penalty": 0.5}
    for fmt in ("json", {"type": "object", "properties": {"a": {"type": "string"}}}):
        body = {"model": "default", "messages": _chat("x"), "stream": False}
        reply = httpx.post(
            server.base_url + "/api/chat", json={**body, "options": options, "format": fmt}
        )
        assert reply.status_code == 200, reply.text
        json.loads(reply.json()["message"]["content"])
    body = {"model": "default", "messages": _chat("x"), "stream": False, "format": {"minimum": 1}}
    refused = httpx.post(server.base_url + "/api/chat", json=body)
    assert refused.status_code == 400 and "format" in refused.json()["error"]


def test_the_client_sees_the_refusal(client: ollama.Client) -> None:
    with pytest.raises(ollama.ResponseError) as refused:
        client.chat(model="default", messages=_chat("x"), options={"mirostat": 1})
    assert refused.value.status_code == 400
    assert "options.mirostat" in str(refused.value.error)


def test_unknown_model_is_404(client: ollama.Client) -> None:
    with pytest.raises(ollama.ResponseError) as missing:
        client.chat(model="llama3:8b", messages=_chat("x"))
    assert missing.value.status_code == 404 and "llama3:8b" in str(missing.value.error)


def test_embed(client: ollama.Client) -> None:
    reply = client.embed(model="default", input=["the cat sat", "the cat sat", "stocks fell"])
    a, b, c = reply.embeddings
    assert a == b and a != c
    assert abs(sum(x * x for x in a) - 1.0) < 1e-6
    assert reply.prompt_eval_count


def test_key_and_host_rules_apply(start: Any) -> None:
    key = "ollama-test-key-123"
    with start("--api-key", key) as server:
        with (
            ollama.Client(host=server.base_url, timeout=30) as bare,
            pytest.raises(ollama.ResponseError) as refused,
        ):
            bare.list()
        assert refused.value.status_code == 401
        assert "API key" in str(refused.value.error)  # Ollama's shape: a string
        auth = {"Authorization": f"Bearer {key}"}
        with ollama.Client(host=server.base_url, headers=auth, timeout=30) as keyed:
            assert keyed.list().models
            assert keyed.chat(model="default", messages=_chat("keys"), options=GREEDY).done
        rebound = httpx.get(
            server.base_url + "/api/tags",
            headers={"Authorization": f"Bearer {key}", "Host": "evil.example"},
        )
        assert rebound.status_code == 403
        assert "evil.example" in rebound.json()["error"]
        cross = httpx.post(
            server.base_url + "/api/chat",
            headers={"Authorization": f"Bearer {key}", "Origin": "http://evil.example"},
            json={"messages": _chat("x")},
        )
        assert cross.status_code == 403


def test_warmstart_routes_can_be_switched_off(tmp_path: Path) -> None:
    """``serve --no-warmstart-routes``: a plain OpenAI-compatible surface, as vLLM's."""
    from fastapi.testclient import TestClient

    runtime = fake_runtime(tmp_path)
    try:
        for on in (True, False):
            app = create_app(load_settings(warmstart_routes=on), runtime)
            with TestClient(app, base_url="http://localhost") as http:
                assert (http.get("/v1/warmstart/stats").status_code == 200) is on
                assert http.get("/v1/models").status_code == 200
                assert http.get("/api/tags").status_code == 200
    finally:
        runtime.close()
