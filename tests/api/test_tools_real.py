"""Issue 13, item 1: tools through the official ``openai`` client, on a real
``warmstart serve`` with the real default model (SmolLM2-135M, whose ChatML template
has no tools: the generic JSON format with a grammar), whole and streamed.

Prompts are short: the tool definitions are most of each prompt, and the server
keeps them cached after the first request.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.api.conftest import Server
from tests.api.real import real_server

pytestmark = pytest.mark.slow

WEATHER_PARAMS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer"},
    },
    "required": ["city", "unit", "days"],
    "additionalProperties": False,
}


def _tools(tag: str = "") -> list[Any]:
    """The weather tool; ``tag`` makes its definition (and cached prefix) unique."""
    about = f"The weather forecast for a city. {tag}".strip()
    return [
        {
            "type": "function",
            "function": {"name": "get_weather", "description": about, "parameters": WEATHER_PARAMS},
        }
    ]


def _ask(question: str) -> list[Any]:
    return [{"role": "user", "content": question}]


@pytest.fixture(scope="module")
def server(
    model_path: Path, calibration: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    data_dir = tmp_path_factory.mktemp("tools-real")
    with real_server(model_path, data_dir, calibration=calibration) as s:
        yield s


@pytest.fixture
def client(server: Server) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=server.v1, api_key="x", max_retries=0, timeout=180) as c:
        yield c


def _create(client: openai.OpenAI, messages: list[Any], **kw: Any) -> Any:
    kw.setdefault("max_tokens", 60)
    kw.setdefault("tools", _tools())
    return client.chat.completions.create(model="default", messages=messages, temperature=0, **kw)


def _valid(value: Any, schema: dict[str, Any]) -> bool:
    """The part of JSON schema WEATHER_PARAMS uses (no jsonschema dependency)."""
    kind = schema.get("type")
    if "enum" in schema and value not in schema["enum"]:
        return False
    if kind == "string":
        return isinstance(value, str)
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "object":
        props = schema.get("properties", {})
        if not isinstance(value, dict) or not set(schema.get("required", [])) <= set(value):
            return False
        if schema.get("additionalProperties") is False and not set(value) <= set(props):
            return False
        return all(_valid(v, props[k]) for k, v in value.items() if k in props)
    return True


def _call_of(message: Any) -> Any:
    assert message.tool_calls, message
    call = message.tool_calls[0]
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather"
    assert _valid(json.loads(call.function.arguments), WEATHER_PARAMS), call.function.arguments
    return call


def _result_turns(call: Any) -> list[Any]:
    """The assistant's call and the tool's result, as an agent sends them back."""
    return [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.function.name, "arguments": call.function.arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call.id, "content": '{"forecast": "sunny, 21 C"}'},
    ]


def test_round_trip_call_result_answer(client: openai.OpenAI) -> None:
    messages = _ask("What is the weather in Paris for the next 2 days, in celsius?")
    first = _create(client, messages, tool_choice="required")
    assert first.choices[0].finish_reason == "tool_calls"
    assert first.choices[0].message.content is None
    call = _call_of(first.choices[0].message)
    assert first.usage.prompt_tokens_details is not None  # cache report on tool replies
    assert "x_warmstart" in (first.model_extra or {})
    answer = _create(client, messages + _result_turns(call), tool_choice="none")
    assert answer.choices[0].finish_reason in ("stop", "length")
    assert not answer.choices[0].message.tool_calls
    assert (answer.choices[0].message.content or "").strip()
    # the session keeps every turn: the call as made, the result, the answer
    session = (answer.model_extra or {})["x_warmstart"]["session_id"]
    kept = httpx.get(f"{client.base_url}warmstart/sessions/{session}", timeout=30).json()
    roles = [m["role"] for m in kept["messages"]]
    assert roles == ["user", "assistant", "tool", "assistant"]
    assert kept["messages"][1]["tool_calls"][0]["id"] == call.id


def test_round_trip_streamed(client: openai.OpenAI) -> None:
    messages = _ask("Weather in Rome for 3 days, in fahrenheit?")
    with client.chat.completions.stream(
        model="default",
        messages=messages,
        tools=_tools(),
        tool_choice="required",
        temperature=0,
        max_tokens=60,
        stream_options={"include_usage": True},
    ) as stream:
        chunks = [event.chunk for event in stream if event.type == "chunk"]
        final = stream.get_final_completion()
    assert final.choices[0].finish_reason == "tool_calls"
    call = _call_of(final.choices[0].message)
    finishing = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finishing) == 1 and "x_warmstart" in (finishing[0].model_extra or {})
    assert chunks[-1].usage is not None and chunks[-1].choices == []
    answer = _create(client, messages + _result_turns(call), tool_choice="none", stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in answer if c.choices)
    assert text.strip()


@pytest.mark.parametrize(
    "question",
    [
        "Forecast for Oslo, 5 days, celsius.",
        "Is it going to rain in Lima this week?",
        "Tell me a joke.",
        "weather tokyo 1 day fahrenheit",
    ],
)
def test_required_always_yields_a_valid_call(client: openai.OpenAI, question: str) -> None:
    reply = _create(client, _ask(question), tool_choice="required")
    assert reply.choices[0].finish_reason == "tool_calls"
    _call_of(reply.choices[0].message)


def test_named_function_is_called(client: openai.OpenAI) -> None:
    choice: Any = {"type": "function", "function": {"name": "get_weather"}}
    reply = _create(client, _ask("Hello there."), tool_choice=choice)
    _call_of(reply.choices[0].message)


def test_auto_reply_parses(client: openai.OpenAI) -> None:
    reply = _create(client, _ask("What is the weather in Berlin today, celsius?"))
    message = reply.choices[0].message
    if message.tool_calls:
        _call_of(message)
        assert reply.choices[0].finish_reason == "tool_calls"
    else:
        assert message.content and not message.content.lstrip().startswith("{")


def test_tool_turns_in_history_are_accepted_without_tools(client: openai.OpenAI) -> None:
    call: Any = {"id": "call_abc", "type": "function"}
    call["function"] = {"name": "get_weather", "arguments": '{"city": "Nice"}'}
    messages = [
        *_ask("Weather in Nice?"),
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_abc", "content": "cloudy"},
        {"role": "user", "content": "Thanks. Summarise it."},
    ]
    reply = client.chat.completions.create(
        model="default", messages=messages, temperature=0, max_tokens=8
    )
    assert reply.choices[0].message.content is not None


def test_unknown_named_function_is_a_400(server: Server) -> None:
    body = {
        "messages": _ask("Hi"),
        "tools": _tools(),
        "tool_choice": {"type": "function", "function": {"name": "send_mail"}},
    }
    response = httpx.post(server.v1 + "/chat/completions", json=body, timeout=60)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == "tool_choice"
    assert "send_mail" in response.json()["error"]["message"]


def test_repeated_tool_conversation_reports_tool_definitions_cached(
    client: openai.OpenAI,
) -> None:
    tools = _tools(f"Run {uuid.uuid4()}.")  # a prefix no other test has cached
    messages = _ask("Weather in Cairo, 2 days, celsius?")
    bare = _create(client, messages, tools=None, max_tokens=1)  # the same turn, no tools
    first = _create(client, messages, tools=tools, tool_choice="required")
    call = first.choices[0].message.tool_calls[0]
    # the next turn of the same conversation: its prompt starts with the same tools
    second = _create(client, messages + _result_turns(call), tools=tools, tool_choice="none")
    tool_tokens = first.usage.prompt_tokens - bare.usage.prompt_tokens
    assert tool_tokens > 100  # the definitions and their instructions
    assert first.usage.prompt_tokens_details.cached_tokens < tool_tokens
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached >= tool_tokens, (cached, tool_tokens)
    assert (second.model_extra or {})["x_warmstart"]["cached_tokens"] == cached
