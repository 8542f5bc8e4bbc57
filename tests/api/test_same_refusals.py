"""The rules of a request are written once (runtime/serving/_admit.py): the same bad request
sent to /v1/chat/completions and to /api/chat is refused for the same reason, each
in its dialect's error body, on the fake runtime and on the real model alike.

The real-model test is one short server (no reply is generated: every request here
is refused at admission); run it under the shared lock, as every real-model test."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.api.conftest import Server, run_server

USER = [{"role": "user", "content": "Say hello."}]
LONG = [{"role": "user", "content": "word " * 3000}]  # past a 2048-token context on both

# a sampling value out of range: on /v1 a field of the body, on /api one of its options
OUT_OF_RANGE = (
    ("top_p", 0),
    ("top_p", 1.5),
    ("temperature", 7),
    ("top_k", -1),
    ("min_p", 2),
    ("repeat_penalty", 0),
    ("frequency_penalty", 3),
    ("presence_penalty", -3),
)
ROBOT = [{"role": "robot", "content": "x"}]
# name: (the /v1/chat/completions body, the /api/chat body); the same rule broken
CASES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "unknown role": ({"messages": ROBOT}, {"messages": ROBOT}),
    "longer than the context": ({"messages": LONG}, {"messages": LONG}),
    **{
        f"{field} {value}": (
            {"messages": USER, field: value},
            {"messages": USER, "options": {field: value}},
        )
        for field, value in OUT_OF_RANGE
    },
}
# what /api/chat has no field for: refused by name there (a field not implemented),
# by the same rule as /v1/chat/completions on the other OpenAI-shaped route
TOOL = {"type": "function", "name": "add", "parameters": {"type": "object"}}
BAD_CHOICE = (
    {
        "messages": USER,
        "tools": [{"type": "function", "function": {k: v for k, v in TOOL.items() if k != "type"}}],
        "tool_choice": {"type": "function", "function": {"name": "nope"}},
    },
    {"input": "Say hello.", "tools": [TOOL], "tool_choice": {"type": "function", "name": "nope"}},
)


def _openai(server: Server, path: str, body: dict[str, Any]) -> tuple[str | None, str]:
    reply = httpx.post(f"{server.v1}/{path}", json={"model": "default", **body}, timeout=60)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error["param"], error["message"]


def _ollama(server: Server, body: dict[str, Any]) -> str:
    payload = {"model": "default", "stream": False, **body}
    reply = httpx.post(server.base_url + "/api/chat", json=payload, timeout=60)
    assert reply.status_code == 400, reply.text
    error = reply.json()
    assert set(error) == {"error"} and isinstance(error["error"], str)
    return str(error["error"])


def refusals(server: Server) -> dict[str, tuple[str | None, str]]:
    """Each case's refusal (param, message), the same on both dialects."""
    out = {}
    for name, (v1, api) in CASES.items():
        param, message = _openai(server, "chat/completions", v1)
        assert _ollama(server, api) == message, name
        out[name] = (param, message)
    param, message = _openai(server, "chat/completions", BAD_CHOICE[0])
    assert _openai(server, "responses", BAD_CHOICE[1]) == (param, message)
    out["tool_choice names no tool"] = (param, message)
    assert "tool_choice" in _ollama(server, {"messages": USER, "tool_choice": "required"})
    return out


def _check(found: dict[str, tuple[str | None, str]]) -> None:
    assert found["unknown role"][0] == "messages.0.role"
    for field, value in OUT_OF_RANGE:
        param, message = found[f"{field} {value}"]
        assert param == field and message.startswith(f"{field} must be in "), message
    assert found["longer than the context"][0] == "messages"
    assert "at most 2048 tokens" in found["longer than the context"][1]
    assert found["tool_choice names no tool"][0] == "tool_choice"


def test_the_fake_refuses_alike_on_both_dialects(server: Server) -> None:
    _check(refusals(server))


@pytest.mark.slow
def test_the_real_model_refuses_alike(model_path: Path, calibration: Path, tmp_path: Path) -> None:
    from tests.api.real import real_server

    fake_cmd = [sys.executable, "-m", "warmstart.runtime.api", "--fake"]
    with run_server(fake_cmd) as fake:
        expected = refusals(fake)
    with real_server(model_path, tmp_path / "real", calibration=calibration) as real:
        found = refusals(real)
    _check(found)
    # the same rules: the same words, but for the prompt's length in tokens
    overflow = "longer than the context"
    assert {k: v for k, v in found.items() if k != overflow} == {
        k: v for k, v in expected.items() if k != overflow
    }
