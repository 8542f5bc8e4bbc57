"""Tool-call replies in OpenAI's shapes, whole and streamed, through the official
client, on the server's default runtime (the fake: fast; the real model's formats
are tested in test_tools_real.py). Also the session keeps the tool turns."""

from __future__ import annotations

import json
import uuid
from typing import Any

import httpx
import openai

from tests.api.conftest import Server

TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Looks a word up.",
            "parameters": {"type": "object", "properties": {"word": {"type": "string"}}},
        },
    }
]


def _ask(client: openai.OpenAI, **kw: Any) -> Any:
    kw.setdefault("messages", [{"role": "user", "content": f"Define cache {uuid.uuid4()}"}])
    return client.chat.completions.create(model="default", tools=TOOLS, max_tokens=8, **kw)


def test_a_forced_call_is_a_tool_calls_reply(client: openai.OpenAI) -> None:
    reply = _ask(client, tool_choice="required")
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    (call,) = choice.message.tool_calls or []
    assert call.id.startswith("call_") and call.type == "function"
    assert call.function.name == "lookup" and json.loads(call.function.arguments) == {}
    assert reply.usage is not None and reply.usage.prompt_tokens_details is not None
    assert "x_warmstart" in (reply.model_extra or {})


def test_a_streamed_call_is_rebuilt_by_the_client(client: openai.OpenAI) -> None:
    with client.chat.completions.stream(
        model="default",
        messages=[{"role": "user", "content": "Define stream"}],
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "lookup"}},
        max_tokens=8,
    ) as stream:
        chunks = [e.chunk for e in stream if e.type == "chunk"]
        final = stream.get_final_completion()
    (call,) = final.choices[0].message.tool_calls or []
    assert call.function.name == "lookup" and call.id.startswith("call_")
    assert final.choices[0].finish_reason == "tool_calls"
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].usage is not None and "x_warmstart" in (chunks[-1].model_extra or {})


def test_auto_streams_the_text_whole(client: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": f"Define tool {uuid.uuid4()}"}]
    reply = _ask(client, messages=messages, temperature=0)
    chunks = list(_ask(client, messages=messages, stream=True, temperature=0))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == reply.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")


def test_tool_turns_are_accepted_and_kept(client: openai.OpenAI, server: Server) -> None:
    session = f"tools-{uuid.uuid4().hex[:8]}"
    call: Any = {"id": "call_x1", "type": "function"}
    call["function"] = {"name": "lookup", "arguments": '{"word": "cache"}'}
    messages: list[Any] = [
        {"role": "user", "content": "Define cache"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_x1", "content": "a store of copies"},
    ]
    reply = _ask(client, messages=messages, extra_headers={"X-Warmstart-Session": session})
    assert reply.choices[0].message.content is not None
    kept = httpx.get(f"{server.v1}/warmstart/sessions/{session}", timeout=10).json()["messages"]
    assert kept[1]["tool_calls"][0]["function"] == call["function"]
    assert kept[1]["content"] is None
    assert kept[2]["role"] == "tool" and kept[2]["tool_call_id"] == "call_x1"


def test_bad_tool_requests_are_400s(server: Server) -> None:
    url = server.v1 + "/chat/completions"
    user = {"role": "user", "content": "hi"}
    cases = [
        (
            {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "x"}}},
            "tool_choice",
        ),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"messages": [user, {"role": "user", "content": None}]}, "messages.1.content"),
    ]
    for extra, param in cases:
        body = {"messages": [user], **extra}
        response = httpx.post(url, json=body, timeout=10)
        assert response.status_code == 400, (extra, response.text)
        assert response.json()["error"]["param"] == param, response.text
