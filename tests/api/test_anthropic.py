"""Anthropic's Messages API (/v1/messages) through the official ``anthropic`` client,
unchanged, on the server's default runtime (the fake: fast; the real model is in
test_anthropic_real.py): text, streamed events, tools, the cache report, errors in
Anthropic's shape, the key and Host/Origin rules, and every field honoured or refused.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import pytest
from anthropic.types import (
    message_create_params,
    text_block_param,
    tool_param,
    tool_result_block_param,
    tool_use_block_param,
)

from tests.api.conftest import Server

# temperature is no argument of this client's create(): extra_body is its own way
GREEDY: dict[str, Any] = {"extra_body": {"temperature": 0}}
TOOLS: list[Any] = [
    {
        "name": "lookup",
        "description": "Looks a word up.",
        "input_schema": {"type": "object", "properties": {"word": {"type": "string"}}},
    }
]


@pytest.fixture
def claude(server: Server) -> Iterator[anthropic.Anthropic]:
    # any key works on loopback without --api-key; the client insists on one
    with anthropic.Anthropic(base_url=server.base_url, api_key="x", max_retries=0) as c:
        yield c


def _ask(text: str | None = None) -> list[Any]:
    return [{"role": "user", "content": text or f"Define cache {uuid.uuid4()}"}]


def _create(claude: anthropic.Anthropic, **kw: Any) -> Any:
    kw.setdefault("messages", _ask())
    kw.setdefault("max_tokens", 32)
    return claude.messages.create(model="default", **GREEDY, **kw)


def _post(server: Server, body: dict[str, Any], path: str = "", **kw: Any) -> httpx.Response:
    return httpx.post(f"{server.v1}/messages{path}", json=body, timeout=60, **kw)


def _body(**fields: Any) -> dict[str, Any]:
    return {"model": "default", "max_tokens": 4, "messages": _ask(), **fields}


def _assert_error(response: httpx.Response, status: int, kind: str, *named: str) -> None:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["type"] == "error" and body["error"]["type"] == kind, body
    for name in named:
        assert name in body["error"]["message"], (name, body)


def test_text_reply_with_usage_and_x_warmstart(claude: anthropic.Anthropic) -> None:
    reply = _create(claude, system="Answer briefly.")
    assert reply.type == "message" and reply.role == "assistant" and reply.id.startswith("msg_")
    (block,) = reply.content
    assert block.type == "text" and block.text.strip()
    assert reply.stop_reason in ("end_turn", "max_tokens") and reply.stop_sequence is None
    extra = (reply.model_extra or {})["x_warmstart"]
    usage = reply.usage
    assert usage.input_tokens + usage.cache_read_input_tokens == extra["prompt_tokens"]
    assert usage.cache_read_input_tokens == extra["cached_tokens"]
    assert usage.output_tokens == extra["completion_tokens"] > 0
    assert usage.cache_creation_input_tokens == 0


def test_the_second_request_reads_the_cache(claude: anthropic.Anthropic) -> None:
    messages = _ask()
    first = _create(claude, messages=messages)
    turn = [{"role": "assistant", "content": first.content[0].text}, *_ask("And then?")]
    second = _create(claude, messages=messages + turn)
    assert second.usage.cache_read_input_tokens > 0
    assert second.usage.input_tokens < (second.model_extra or {})["x_warmstart"]["prompt_tokens"]


def test_stream_matches_the_whole_reply(claude: anthropic.Anthropic) -> None:
    messages = _ask()
    whole = _create(claude, messages=messages)
    with claude.messages.stream(
        model="default", messages=messages, max_tokens=32, **GREEDY
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert final.content[0].text == whole.content[0].text
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert kinds[1] == "content_block_start" and "text" in kinds
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    # the totals arrive on message_delta and overwrite message_start's zeros
    assert final.usage.output_tokens == whole.usage.output_tokens
    total = final.usage.input_tokens + (final.usage.cache_read_input_tokens or 0)
    assert total == whole.usage.input_tokens + whole.usage.cache_read_input_tokens
    assert final.usage.cache_read_input_tokens and final.stop_reason == whole.stop_reason


def test_raw_events_are_named_sse(server: Server) -> None:
    with httpx.stream("POST", server.v1 + "/messages", json=_body(stream=True)) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in response.iter_lines() if line]
    names = [line.removeprefix("event: ") for line in lines if line.startswith("event: ")]
    assert names[:3] == ["message_start", "content_block_start", "ping"]
    assert names[-1] == "message_stop" and "message_delta" in names
    assert len(names) * 2 == len(lines)  # every event is a name and its data


def test_system_as_blocks_equals_system_as_text(claude: anthropic.Anthropic) -> None:
    messages = _ask()
    text = _create(claude, messages=messages, system="Be brief. Be kind.")
    blocks: Any = [
        {"type": "text", "text": "Be brief. "},
        {"type": "text", "text": "Be kind.", "cache_control": {"type": "ephemeral"}},
    ]
    again = _create(claude, messages=messages, system=blocks)
    assert again.content[0].text == text.content[0].text
    total = again.usage.input_tokens + again.usage.cache_read_input_tokens
    assert total == text.usage.input_tokens + text.usage.cache_read_input_tokens
    assert again.usage.cache_read_input_tokens > 0


def test_stop_sequences_name_the_one_that_stopped(claude: anthropic.Anthropic) -> None:
    messages = _ask()
    whole = _create(claude, messages=messages).content[0].text
    word = whole.split()[2]
    reply = _create(claude, messages=messages, stop_sequences=["zzzz", word])
    assert reply.stop_reason == "stop_sequence" and reply.stop_sequence == word
    assert word not in reply.content[0].text
    short = _create(claude, messages=messages, max_tokens=1)
    assert short.stop_reason == "max_tokens" and short.usage.output_tokens == 1


def test_output_config_format_holds_the_reply_to_a_schema(claude: anthropic.Anthropic) -> None:
    schema = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}
    fmt: Any = {"format": {"type": "json_schema", "schema": schema}}
    reply = _create(claude, output_config=fmt)
    assert isinstance(json.loads(reply.content[0].text)["text"], str)


def test_a_forced_tool_call_and_its_result(claude: anthropic.Anthropic, server: Server) -> None:
    messages = _ask()
    call = _create(claude, messages=messages, tools=TOOLS, tool_choice={"type": "any"})
    assert call.stop_reason == "tool_use"
    (use,) = call.content
    assert use.type == "tool_use" and use.name == "lookup" and use.input == {}
    result = {"type": "tool_result", "tool_use_id": use.id, "content": "a store of copies"}
    turns = [{"role": "assistant", "content": call.model_dump()["content"]}]
    turns.append({"role": "user", "content": [result, {"type": "text", "text": "Thanks."}]})
    answer = _create(claude, messages=messages + turns, tools=TOOLS, tool_choice={"type": "none"})
    assert answer.stop_reason in ("end_turn", "max_tokens")
    assert answer.content[0].type == "text" and answer.content[0].text.strip()
    assert answer.usage.cache_read_input_tokens > 0
    # the session keeps every turn: the call as made, its result, the next question
    session = (answer.model_extra or {})["x_warmstart"]["session_id"]
    kept = httpx.get(f"{server.v1}/warmstart/sessions/{session}", timeout=30).json()
    roles = [m["role"] for m in kept["messages"]]
    assert roles == ["user", "assistant", "tool", "user", "assistant"]
    assert kept["messages"][1]["tool_calls"][0]["id"] == use.id


def test_a_streamed_tool_call_is_rebuilt_by_the_client(claude: anthropic.Anthropic) -> None:
    choice: Any = {"type": "tool", "name": "lookup"}
    with claude.messages.stream(
        model="default", messages=_ask(), max_tokens=32, tools=TOOLS, tool_choice=choice
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    (use,) = final.content
    assert use.type == "tool_use" and use.name == "lookup" and use.input == {}
    assert final.stop_reason == "tool_use" and "input_json" in kinds


def test_count_tokens_is_the_prompt(claude: anthropic.Anthropic) -> None:
    messages = _ask()
    counted = claude.messages.count_tokens(model="default", messages=messages, system="Hi.")
    reply = _create(claude, messages=messages, system="Hi.")
    assert counted.input_tokens == reply.usage.input_tokens + reply.usage.cache_read_input_tokens
    tools: dict[str, Any] = {"tools": TOOLS, "tool_choice": {"type": "any"}}
    with_tools = claude.messages.count_tokens(model="default", messages=messages, **tools)
    call = _create(claude, messages=messages, **tools)
    assert with_tools.input_tokens == call.usage.input_tokens + call.usage.cache_read_input_tokens


def test_errors_are_in_anthropics_shape(claude: anthropic.Anthropic, server: Server) -> None:
    with pytest.raises(anthropic.NotFoundError) as missing:
        claude.messages.create(model="claude-nope", max_tokens=4, messages=_ask())
    assert missing.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    with pytest.raises(anthropic.BadRequestError):
        claude.messages.create(
            model="default", max_tokens=4, messages=_ask(), extra_body={"temperature": 3}
        )
    body = _body()
    del body["max_tokens"]  # required, as on Anthropic's API
    _assert_error(_post(server, body), 400, "invalid_request_error", "max_tokens")
    _assert_error(_post(server, {"x": 1}, "/nowhere"), 404, "not_found_error")
    response = httpx.get(server.v1 + "/messages")
    _assert_error(response, 405, "invalid_request_error", "GET")
    bad_json = httpx.post(server.v1 + "/messages", content=b"{", timeout=30)
    _assert_error(bad_json, 400, "invalid_request_error", "JSON")


@pytest.mark.parametrize(
    "change,named",
    [
        ({"messages": [{"role": "assistant", "content": "Sure,"}]}, "final assistant"),
        ({"messages": [{"role": "user", "content": []}]}, "messages.0.content"),
        ({"tool_choice": {"type": "tool"}}, "name"),
        ({"tool_choice": {"type": "tool", "name": "send"}, "tools": TOOLS}, "send"),
        ({"tools": [{"name": "web_search", "type": "web_search_20250305"}]}, "web_search_2025"),
        ({"thinking": {"type": "enabled", "budget_tokens": 2048}}, "thinking"),
        ({"stop_sequences": ["x"] * 17}, "stop_sequences"),
        ({"metadata": {"user_id": "a/b"}}, "metadata.user_id"),
        ({"output_config": {"effort": "low"}}, "output_config.effort"),
        ({"output_config": {"format": {"type": "json_schema", "schema": {"type": "x"}}}}, "schema"),
    ],
)
def test_bad_requests_are_refused_by_name(
    server: Server, change: dict[str, Any], named: str
) -> None:
    _assert_error(_post(server, _body(**change)), 400, "invalid_request_error", named)


@pytest.mark.parametrize(
    "block,named",
    [
        ({"type": "image", "source": {"type": "url", "url": "http://x"}}, "'image'"),
        ({"type": "thinking", "thinking": "hmm", "signature": "s"}, "'thinking'"),
        ({"type": "tool_use", "id": "t1", "name": "lookup", "input": {}}, "tool_use"),
        ({"type": "text", "text": "hi", "citations": [{"type": "x"}]}, "citations"),
    ],
)
def test_content_blocks_are_read_or_refused_by_type(
    server: Server, block: dict[str, Any], named: str
) -> None:
    body = _body(messages=[{"role": "user", "content": [block]}])
    _assert_error(_post(server, body), 400, "invalid_request_error", named)


def test_a_keyed_server_takes_x_api_key_or_bearer(start: Any) -> None:
    key = "anthropic-test-key-0123"
    with start("--api-key", key) as srv:
        url = srv.v1 + "/messages"
        for headers in ({}, {"x-api-key": "wrong"}, {"Authorization": key}):
            response = httpx.post(url, json=_body(), headers=headers, timeout=30)
            _assert_error(response, 401, "authentication_error", "x-api-key")
        for headers in ({"x-api-key": key}, {"Authorization": f"Bearer {key}"}):
            assert httpx.post(url, json=_body(), headers=headers, timeout=30).status_code == 200
        # the x-api-key opens the other routes too
        models = httpx.get(srv.v1 + "/models", headers={"x-api-key": key}, timeout=30)
        assert models.status_code == 200
        with anthropic.Anthropic(base_url=srv.base_url, api_key=key, max_retries=0) as good:
            assert good.messages.create(model="default", max_tokens=4, messages=_ask()).content
        with (
            anthropic.Anthropic(base_url=srv.base_url, api_key="nope", max_retries=0) as bad,
            pytest.raises(anthropic.AuthenticationError),
        ):
            bad.messages.create(model="default", max_tokens=4, messages=_ask())


def test_host_and_origin_rules_hold(server: Server) -> None:
    rebound = _post(server, _body(), headers={"Host": "evil.example"})
    _assert_error(rebound, 403, "permission_error", "evil.example")
    cross = _post(server, _body(), headers={"Origin": "http://evil.example"})
    _assert_error(cross, 403, "permission_error", "evil.example")


# field -> a value warmstart honours (the request must succeed)
HONOURED: dict[str, Any] = {
    "model": "default",
    "max_tokens": 4,
    "system": [{"type": "text", "text": "Be brief."}],
    "stop_sequences": ["zzzz"],
    "tools": TOOLS,
    "tool_choice": {"type": "auto", "disable_parallel_tool_use": True},
    "metadata": {"user_id": "walk-user"},
    "cache_control": {"type": "ephemeral", "ttl": "5m"},
    "thinking": {"type": "disabled"},
    "output_config": {"format": {"type": "json_schema", "schema": {"type": "object"}}},
}
REFUSED: dict[str, Any] = {
    "container": "c1",
    "inference_geo": "us",
    "service_tier": "auto",
    "speed": "fast",
}
EXTENSIONS = {"temperature": 0.5, "top_p": 0.9, "top_k": 20, "stream": False}
PROBE = "probe"
BLOCKS: dict[type, tuple[dict[str, Any], set[str]]] = {
    text_block_param.TextBlockParam: ({"type": "text", "text": "Hi"}, {"cache_control"}),
    tool_result_block_param.ToolResultBlockParam: (
        {"type": "tool_result", "tool_use_id": "t1", "content": "ok"},
        {"cache_control", "is_error"},
    ),
}


def test_every_request_field_is_honoured_or_refused(server: Server) -> None:
    fields = set(message_create_params.MessageCreateParamsBase.__annotations__)
    for field in sorted(fields - {"messages"}):
        if field in HONOURED:
            reply = _post(server, _body(**{field: HONOURED[field]}))
            assert reply.status_code == 200, (field, reply.text)
            continue
        response = _post(server, _body(**{field: REFUSED.get(field, PROBE)}))
        _assert_error(response, 400, "invalid_request_error", field)
    assert _post(server, _body(**EXTENSIONS)).status_code == 200
    nulls = {"service_tier": None, "metadata": None, "container": None, "top_k": None}
    assert _post(server, _body(**nulls)).status_code == 200  # a null asks for nothing


def test_every_block_and_tool_field_is_honoured_or_refused(server: Server) -> None:
    calls = [{"type": "tool_use", "id": "t1", "name": "lookup", "input": {}}]
    for params, (block, honoured) in BLOCKS.items():
        for field in sorted(set(params.__annotations__) - set(block)):
            value = {"cache_control": {"type": "ephemeral"}, "is_error": True}.get(field, PROBE)
            turns = [*_ask(), {"role": "assistant", "content": calls}]
            turns.append({"role": "user", "content": [{**block, field: value}]})
            response = _post(server, _body(messages=turns))
            if field in honoured:
                assert response.status_code == 200, (field, response.text)
            else:
                _assert_error(response, 400, "invalid_request_error", field)
    for field in sorted(set(tool_use_block_param.ToolUseBlockParam.__annotations__)):
        if field not in calls[0] and field != "cache_control":
            turns = [*_ask(), {"role": "assistant", "content": [{**calls[0], field: PROBE}]}]
            turns.append(
                {
                    "role": "user",
                    "content": [BLOCKS[tool_result_block_param.ToolResultBlockParam][0]],
                }
            )
            _assert_error(_post(server, _body(messages=turns)), 400, "invalid_request_error", field)
    tool_honoured = {"name", "description", "input_schema", "cache_control", "strict", "type"}
    for field in sorted(set(tool_param.ToolParam.__annotations__) - tool_honoured):
        tools = [{**TOOLS[0], field: PROBE}]
        _assert_error(_post(server, _body(tools=tools)), 400, "invalid_request_error", field)
    custom = [
        {**TOOLS[0], "type": "custom", "strict": True, "cache_control": {"type": "ephemeral"}}
    ]
    assert _post(server, _body(tools=custom)).status_code == 200


def test_a_claude_code_shaped_request_is_served(server: Server) -> None:
    """What an agent CLI sends: system blocks with breakpoints, cached tools, a user
    id, streaming, beta headers and query."""
    body = _body(
        max_tokens=16,
        stream=True,
        temperature=1,
        system=[
            {"type": "text", "text": "You are a coding agent."},
            {"type": "text", "text": "Be terse.", "cache_control": {"type": "ephemeral"}},
        ],
        tools=[{**TOOLS[0], "cache_control": {"type": "ephemeral", "ttl": "1h"}}],
        metadata={"user_id": f"user_{uuid.uuid4().hex}_session_{uuid.uuid4()}"},
    )
    body["messages"][0]["content"] = [
        {"type": "text", "text": "Fix the bug.", "cache_control": {"type": "ephemeral"}}
    ]
    headers = {"anthropic-version": "2023-06-01", "anthropic-beta": "prompt-caching-2024-07-31"}
    url = server.v1 + "/messages?beta=true"
    with httpx.stream("POST", url, json=body, headers=headers, timeout=60) as response:
        assert response.status_code == 200
        names = [line for line in response.iter_lines() if line.startswith("event: ")]
    assert names[-1] == "event: message_stop"
