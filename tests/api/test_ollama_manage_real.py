"""Issue 21 items 1, 4, 5 and 6 on the real default model (SmolLM2-135M, whose ChatML
template has no tools: the generic grammar-held JSON format), through Ollama's own
client, unchanged, against a real ``warmstart serve``:

- tools on /api/chat, whole and streamed: a call with its arguments as an object,
  the result sent back as a ``role: "tool"`` message with ``tool_name``, an answer;
- the same loop by raw HTTP, to read the cache report on the last line: cached
  prompt tokens from the second request on, and greedy replies equal to a
  ``--no-cache`` server's;
- /api/pull with progress from the hub imitation of the pull tests, /api/copy,
  /api/delete;
- ``keep_alive: 0`` unloads the model after the reply, and the next request opens
  it again and restores the conversation from disk instead of recomputing it;
- /tokenize and /detokenize.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import ollama
import pytest

from tests.api.conftest import Server
from tests.api.real import real_server
from tests.gguf_files import tiny_model
from tests.hubfake import Hub, serve_hub

pytestmark = pytest.mark.slow

GREEDY = {"temperature": 0, "num_predict": 48}
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city", "days"],
}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather forecast for a city.",
            "parameters": WEATHER,
        },
    }
]
REPO = "someone/tiny-GGUF"


@pytest.fixture(scope="module")
def hub() -> Iterator[Hub]:
    with serve_hub(Hub()) as h:
        yield h


@pytest.fixture(scope="module")
def served(
    model_path: Path, calibration: Path, tmp_path_factory: pytest.TempPathFactory, hub: Hub
) -> Iterator[Server]:
    data_dir = tmp_path_factory.mktemp("ollama-manage")
    env = {"HF_ENDPOINT": hub.url, "HF_HUB_OFFLINE": "0"}
    with real_server(model_path, data_dir, calibration=calibration, env=env) as server:
        yield server


@pytest.fixture(scope="module")
def uncached(
    model_path: Path, calibration: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    data_dir = tmp_path_factory.mktemp("ollama-nocache")
    with real_server(model_path, data_dir, "--no-cache", calibration=calibration) as s:
        yield s


@pytest.fixture
def client(served: Server) -> Iterator[ollama.Client]:
    with ollama.Client(host=served.base_url, timeout=180) as c:
        yield c


def _ask(city: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": f"What is the weather in {city} for 2 days?"}]


def _result(name: str) -> dict[str, Any]:
    return {"role": "tool", "content": '{"forecast": "sunny, 21 C"}', "tool_name": name}


def test_tool_round_trip_whole(client: ollama.Client) -> None:
    messages = _ask("Paris")
    first = client.chat(model="default", messages=messages, tools=TOOLS, options=GREEDY)
    assert first.done and first.message.tool_calls, first.message
    call = first.message.tool_calls[0]
    assert call.function.name == "get_weather"
    assert isinstance(call.function.arguments, dict) and "city" in call.function.arguments
    messages += [first.message, _result(call.function.name)]
    # tools no longer offered: the answer is text (offered, a 135M model calls again)
    answer = client.chat(model="default", messages=messages, options=GREEDY)
    assert answer.done and not answer.message.tool_calls
    assert (answer.message.content or "").strip()


def test_tool_round_trip_streamed(client: ollama.Client) -> None:
    messages = _ask("Rome")
    parts = list(
        client.chat(model="default", messages=messages, tools=TOOLS, options=GREEDY, stream=True)
    )
    assert parts[-1].done and not any(p.done for p in parts[:-1])
    calls = [c for p in parts for c in p.message.tool_calls or ()]
    assert len(calls) == 1 and calls[0].function.name == "get_weather"
    assert isinstance(calls[0].function.arguments, dict)
    turn = {"role": "assistant", "content": "", "tool_calls": calls}
    messages += [turn, _result("get_weather")]
    answer = client.chat(model="default", messages=messages, options=GREEDY, stream=True)
    assert "".join(p.message.content or "" for p in answer).strip()


def _chat(server: Server, messages: list[dict[str, Any]]) -> dict[str, Any]:
    body = {"model": "default", "messages": messages, "tools": TOOLS}
    body.update(options=GREEDY, stream=False)
    reply = httpx.post(server.base_url + "/api/chat", json=body, timeout=180)
    assert reply.status_code == 200, reply.text
    return dict(reply.json())


def _loop(server: Server, tag: str) -> list[dict[str, Any]]:
    """A tool loop (call, result, answer, follow-up) as raw HTTP: every reply's body."""
    messages = [{"role": "system", "content": f"You help with the weather. ({tag})"}]
    messages += _ask("Oslo")
    replies = [_chat(server, messages)]
    calls = replies[0]["message"].get("tool_calls")
    assert calls, replies[0]["message"]
    messages += [replies[0]["message"], _result(calls[0]["function"]["name"])]
    replies.append(_chat(server, messages))
    messages += [replies[1]["message"], {"role": "user", "content": "And for Bergen?"}]
    replies.append(_chat(server, messages))
    return replies


def _shown(reply: dict[str, Any]) -> Any:
    """What a greedy reply says (call ids are drawn afresh each time)."""
    message = reply["message"]
    calls = [
        (c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls") or ()
    ]
    return message["content"], calls


def test_a_tool_loop_is_cached_and_equals_no_cache(served: Server, uncached: Server) -> None:
    tag = uuid.uuid4().hex
    cached, cold = _loop(served, tag), _loop(uncached, tag)
    assert [_shown(r) for r in cached] == [_shown(r) for r in cold]
    assert all(r["cached_tokens"] > 0 for r in cached[1:]), [r["x_warmstart"] for r in cached]
    assert all(r["cached_tokens"] == 0 for r in cold)


def test_pull_with_progress_copy_and_delete(
    client: ollama.Client, hub: Hub, tmp_path: Path
) -> None:
    data = tiny_model(tmp_path / "tiny.gguf").read_bytes() + bytes(2 << 20)
    hub.add_hub_file(REPO, "tiny.gguf", data)
    lines = list(client.pull(f"hf:{REPO}/tiny.gguf", stream=True))
    assert lines[0].status == "pulling manifest" and lines[-1].status == "success"
    progress = [p for p in lines if p.total]
    assert progress and progress[-1].completed == progress[-1].total == len(data)
    assert progress[0].digest and all(p.digest == progress[0].digest for p in progress)
    names = {m.model for m in client.list().models}
    assert "tiny:latest" in names
    assert client.copy("tiny", "tiny-copy").status == "success"
    assert "tiny-copy:latest" in {m.model for m in client.list().models}
    assert client.delete("tiny-copy").status == "success"
    assert client.delete("tiny:latest").status == "success"
    assert not {"tiny:latest", "tiny-copy:latest"} & {m.model for m in client.list().models}
    with pytest.raises(ollama.ResponseError) as missing:
        client.delete("tiny")
    assert missing.value.status_code == 404


def test_a_pull_the_hub_refuses_ends_with_one_error_line(served: Server) -> None:
    body = {"model": f"hf:{REPO}/missing.gguf"}
    with httpx.stream("POST", served.base_url + "/api/pull", json=body, timeout=60) as r:
        lines = [line for line in r.iter_lines() if line]
    assert r.status_code == 200 and '"error"' in lines[-1]
    assert sum('"error"' in line for line in lines) == 1


def _report(server: Server, messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    body = {"model": "default", "messages": messages, "options": GREEDY, "stream": False}
    reply = httpx.post(server.base_url + "/api/chat", json={**body, **extra}, timeout=180)
    assert reply.status_code == 200, reply.text
    return dict(reply.json())


def test_keep_alive_0_unloads_and_the_next_request_restores_from_disk(
    client: ollama.Client, served: Server
) -> None:
    messages = [
        {"role": "system", "content": f"You are terse. {uuid.uuid4().hex} " + "Be kind. " * 40},
        {"role": "user", "content": "Name a colour."},
    ]
    first = _report(served, messages, keep_alive=0)
    assert first["cached_tokens"] == 0
    deadline = time.monotonic() + 120
    while client.ps().models and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not client.ps().models  # unloaded
    again = _report(served, messages)
    assert again["x_warmstart"]["restored"]["disk"] > 0, again["x_warmstart"]
    assert again["message"]["content"] == first["message"]["content"]
    assert client.ps().models  # loaded again


def test_tokenize_and_detokenize(served: Server) -> None:
    text = "Hello world, 媽 🤗"
    base = served.base_url
    ids = httpx.post(base + "/tokenize", json={"content": text}).json()["tokens"]
    assert ids and all(isinstance(i, int) for i in ids)
    back = httpx.post(base + "/detokenize", json={"tokens": ids}).json()["content"]
    assert back == text
    pieces = httpx.post(base + "/tokenize", json={"content": text, "with_pieces": True}).json()
    assert [p["id"] for p in pieces["tokens"]] == ids
    assert pieces["tokens"][0]["piece"] == "Hello"
    bad = httpx.post(base + "/detokenize", json={"tokens": [10**9]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens"
