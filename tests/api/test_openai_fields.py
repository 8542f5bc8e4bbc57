"""Every request field of OpenAI's chat and completions is honoured or refused.

The field lists come from the ``openai`` package's own request types, so a field a
newer client knows is checked too: an unknown one must be a 400
``unsupported_parameter`` naming it, never ignored. Then the shapes of what the
honoured fields add: logprobs (chat and legacy, whole and streamed), JSON mode, and
the cache report on those replies.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import httpx
import openai
import pytest
from openai.types import completion_create_params as completion_params
from openai.types.chat import (
    chat_completion_assistant_message_param,
    chat_completion_developer_message_param,
    chat_completion_system_message_param,
    chat_completion_tool_message_param,
    chat_completion_user_message_param,
)
from openai.types.chat import completion_create_params as chat_params

from tests.api.conftest import Server

TOOL = {"type": "function", "function": {"name": "now", "parameters": {"type": "object"}}}
# field -> a value warmstart honours (the request must succeed)
CHAT_HONOURED: dict[str, Any] = {
    "model": "default",
    "frequency_penalty": 0.5,
    "presence_penalty": 0.5,
    "logit_bias": {"0": -100},
    "logprobs": True,
    "top_logprobs": 2,
    "max_completion_tokens": 4,
    "max_tokens": 4,
    "n": 1,
    "response_format": {"type": "text"},
    "seed": 3,
    "stop": ["zzzz"],
    "stream_options": {"include_usage": True},
    "temperature": 0.5,
    "top_p": 0.9,
    "user": "walk-user",
    "prompt_cache_key": "walk-key",
    "store": False,
    "modalities": ["text"],
    # tool calling's own engineer gives these their meaning (issue 13, item 1)
    "tools": [TOOL],
    "tool_choice": "none",
    "parallel_tool_calls": False,
}
# fields an honoured field needs beside it
TOGETHER: dict[str, dict[str, Any]] = {"top_logprobs": {"logprobs": True}}
# field -> a value warmstart refuses; fields in neither table get PROBE
CHAT_REFUSED: dict[str, Any] = {
    "audio": {"voice": "alloy", "format": "wav"},
    "function_call": "auto",
    "functions": [TOOL["function"]],
    "metadata": {"k": "v"},
    "prediction": {"type": "content", "content": "x"},
    "prompt_cache_retention": "24h",
    "reasoning_effort": "low",
    "safety_identifier": "someone",
    "service_tier": "auto",
    "verbosity": "low",
    "web_search_options": {},
}
# honoured fields that refuse other values than their neutral one
CHAT_REFUSED_VALUES: dict[str, Any] = {
    "n": 2,
    "store": True,
    "modalities": ["text", "audio"],
    "stream_options": {"include_obfuscation": True},
}
COMPLETION_HONOURED: dict[str, Any] = {
    "model": "default",
    "best_of": 1,
    "echo": False,
    "frequency_penalty": 0.5,
    "presence_penalty": 0.5,
    "logit_bias": {"0": -100},
    "logprobs": 2,
    "max_tokens": 4,
    "n": 1,
    "seed": 3,
    "stop": "zzzz",
    "stream_options": {"include_usage": True},
    "temperature": 0.5,
    "top_p": 0.9,
    "user": "walk-user",
}
COMPLETION_REFUSED: dict[str, Any] = {"suffix": "the end"}
COMPLETION_REFUSED_VALUES: dict[str, Any] = {"best_of": 2, "echo": True, "n": 3}
EXTENSIONS: dict[str, Any] = {"top_k": 20, "min_p": 0.05, "repeat_penalty": 1.1}
PROBE = "probe"
MESSAGE_TYPES = (
    chat_completion_system_message_param.ChatCompletionSystemMessageParam,
    chat_completion_developer_message_param.ChatCompletionDeveloperMessageParam,
    chat_completion_user_message_param.ChatCompletionUserMessageParam,
    chat_completion_assistant_message_param.ChatCompletionAssistantMessageParam,
    chat_completion_tool_message_param.ChatCompletionToolMessageParam,
)
MESSAGE_HONOURED = {"role", "content", "tool_calls", "tool_call_id"}  # tools: item 1's
MESSAGE_REFUSED: dict[str, Any] = {
    "name": "alice",
    "refusal": "no",
    "audio": {"id": "a1"},
    "function_call": {"name": "f", "arguments": "{}"},
}


def _fields(params: type) -> set[str]:
    return set(params.__annotations__)


def _chat(**fields: Any) -> dict[str, Any]:
    topic = uuid.uuid4().hex[:8]
    return {"messages": [{"role": "user", "content": f"Hi {topic}"}], "max_tokens": 4, **fields}


def _completion(**fields: Any) -> dict[str, Any]:
    return {"prompt": f"Once {uuid.uuid4().hex[:8]}", "max_tokens": 4, **fields}


def _post(server: Server, route: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{server.v1}/{route}", json=body, timeout=60)


def _assert_refused(response: httpx.Response, field: str) -> None:
    assert response.status_code == 400, (field, response.text)
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["code"] == "unsupported_parameter", (field, error)
    assert error["param"] is not None and field in error["param"], (field, error)
    assert field in error["message"]


def test_every_chat_field_is_honoured_or_refused(server: Server) -> None:
    fields = _fields(chat_params.CompletionCreateParamsBase) | {"stream"}
    for field in sorted(fields - {"messages"}):
        if field in CHAT_HONOURED:
            sent = {field: CHAT_HONOURED[field], **TOGETHER.get(field, {})}
            reply = _post(server, "chat/completions", _chat(**sent))
            assert reply.status_code == 200, (field, reply.text)
            continue
        if field == "stream":
            continue  # streaming is tested throughout the API tests
        value = CHAT_REFUSED.get(field, PROBE)
        _assert_refused(_post(server, "chat/completions", _chat(**{field: value})), field)
    for field, value in CHAT_REFUSED_VALUES.items():
        _assert_refused(_post(server, "chat/completions", _chat(**{field: value})), field)


def test_every_completion_field_is_honoured_or_refused(server: Server) -> None:
    for field in sorted(_fields(completion_params.CompletionCreateParamsBase) - {"prompt"}):
        if field in COMPLETION_HONOURED:
            reply = _post(server, "completions", _completion(**{field: COMPLETION_HONOURED[field]}))
            assert reply.status_code == 200, (field, reply.text)
            continue
        value = COMPLETION_REFUSED.get(field, PROBE)
        _assert_refused(_post(server, "completions", _completion(**{field: value})), field)
    for field, value in COMPLETION_REFUSED_VALUES.items():
        _assert_refused(_post(server, "completions", _completion(**{field: value})), field)


def test_every_message_field_is_honoured_or_refused(server: Server) -> None:
    for params in MESSAGE_TYPES:
        role = params.__name__.removeprefix("ChatCompletion").removesuffix("MessageParam").lower()
        for field in sorted(_fields(params) - MESSAGE_HONOURED):
            message = {"role": role, "content": "Hello.", field: MESSAGE_REFUSED.get(field, PROBE)}
            body = _chat()
            body["messages"] = [message, *body["messages"]]
            _assert_refused(_post(server, "chat/completions", body), field)


def test_llama_cpp_extensions_and_nulls_are_accepted(server: Server) -> None:
    for route, body in (("chat/completions", _chat), ("completions", _completion)):
        assert _post(server, route, body(**EXTENSIONS)).status_code == 200
        # a null asks for nothing, known field or not (clients send unset fields so)
        nulls = {"service_tier": None, "metadata": None, "suffix": None, "seed": None}
        assert _post(server, route, body(**nulls)).status_code == 200
    _assert_refused(_post(server, "chat/completions", _chat(cache_prompt=True)), "cache_prompt")


def test_unconvertible_schema_is_a_400_naming_response_format(server: Server) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}
    reply = _post(server, "chat/completions", _chat(response_format=fmt))
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == "response_format"
    for bad in ({"type": "xml"}, {"type": "json_schema"}):
        reply = _post(server, "chat/completions", _chat(response_format=bad))
        assert reply.status_code == 400 and "response_format" in reply.json()["error"]["param"]


def test_bad_logprob_and_bias_values_are_400s(server: Server) -> None:
    cases = (
        ({"top_logprobs": 2}, "top_logprobs"),  # without logprobs: true
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"logit_bias": {"word": 1}}, "logit_bias"),
        ({"logit_bias": {"5": 101}}, "logit_bias"),
        ({"frequency_penalty": 3}, "frequency_penalty"),
        ({"top_k": -1}, "top_k"),
        ({"repeat_penalty": 0}, "repeat_penalty"),
    )
    for fields, param in cases:
        reply = _post(server, "chat/completions", _chat(**fields))
        assert reply.status_code == 400, (fields, reply.text)
        assert param in (reply.json()["error"]["param"] or reply.json()["error"]["message"])


def _check_chat_logprobs(content: list[Any], top: int) -> None:
    assert content
    for entry in content:
        assert entry.logprob <= 0 and entry.bytes is not None
        assert len(entry.top_logprobs) == top
        if top:
            assert entry.top_logprobs[0].logprob >= entry.logprob


def test_chat_logprobs_whole_and_streamed(client: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": f"Tell me a fact {uuid.uuid4()}"}]
    ask: dict[str, Any] = dict(
        model="default", messages=messages, temperature=0, max_tokens=8, logprobs=True
    )
    whole = client.chat.completions.create(top_logprobs=3, **ask)
    choice = whole.choices[0]
    assert choice.logprobs is not None and choice.logprobs.content is not None
    _check_chat_logprobs(choice.logprobs.content, 3)
    assert whole.usage is not None and len(choice.logprobs.content) == whole.usage.completion_tokens
    assert "x_warmstart" in (whole.model_extra or {})
    chunks = list(client.chat.completions.create(stream=True, **ask))
    streamed = [
        e
        for c in chunks
        if c.choices and c.choices[0].logprobs
        for e in c.choices[0].logprobs.content or []
    ]
    _check_chat_logprobs(streamed, 0)
    assert [e.token for e in streamed] == [e.token for e in choice.logprobs.content]
    assert chunks[-1].usage is not None and chunks[-1].usage.prompt_tokens_details is not None
    assert "x_warmstart" in (chunks[-1].model_extra or {})
    plain = client.chat.completions.create(
        model="default", messages=messages, temperature=0, max_tokens=8
    )
    assert plain.choices[0].logprobs is None


def test_completion_logprobs_have_the_legacy_shape(client: openai.OpenAI) -> None:
    prompt = f"Once upon a time {uuid.uuid4()}"
    reply = client.completions.create(
        model="default", prompt=prompt, max_tokens=6, temperature=0, logprobs=2
    )
    lp = reply.choices[0].logprobs
    assert lp is not None and lp.tokens and lp.token_logprobs and lp.text_offset
    assert lp.top_logprobs is not None
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.text_offset)
    assert "".join(lp.tokens) == reply.choices[0].text
    assert lp.text_offset[0] == len(prompt)
    assert all(len(top) <= 2 for top in lp.top_logprobs)
    stream = client.completions.create(
        model="default", prompt=prompt, max_tokens=6, temperature=0, logprobs=2, stream=True
    )
    tokens = [
        t
        for c in stream
        if c.choices and c.choices[0].logprobs
        for t in c.choices[0].logprobs.tokens or []
    ]
    assert tokens == lp.tokens


def test_json_mode_parses_and_reports_the_cache(client: openai.OpenAI) -> None:
    system = {"role": "system", "content": f"Reply in JSON. {uuid.uuid4()} " + "Be brief. " * 40}
    messages = [system, {"role": "user", "content": "Describe a cat."}]
    replies = [
        client.chat.completions.create(
            model="default",
            messages=messages,
            temperature=0,
            max_tokens=200,
            response_format={"type": "json_object"},
            logprobs=True,
        )
        for _ in range(2)
    ]
    for reply in replies:
        assert reply.choices[0].finish_reason == "stop"
        assert isinstance(json.loads(reply.choices[0].message.content or ""), dict)
        assert reply.choices[0].logprobs is not None
    second = replies[1]
    assert second.usage is not None and second.usage.prompt_tokens_details is not None
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached is not None and cached > 0
    assert (second.model_extra or {})["x_warmstart"]["cached_tokens"] == cached
    chunks = list(
        client.chat.completions.create(
            model="default",
            messages=messages,
            temperature=0,
            max_tokens=200,
            response_format={"type": "json_object"},
            stream=True,
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == replies[0].choices[0].message.content
    last = chunks[-1]
    assert last.usage is not None and last.usage.prompt_tokens_details is not None
    assert (last.usage.prompt_tokens_details.cached_tokens or 0) > 0


@pytest.mark.parametrize("route", ["chat/completions", "completions"])
def test_an_unsupported_field_is_a_400_through_the_client(
    client: openai.OpenAI, route: str
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        if route == "completions":
            client.completions.create(model="default", prompt="Hi", suffix="end")
        else:
            client.chat.completions.create(
                model="default", messages=[{"role": "user", "content": "Hi"}], service_tier="flex"
            )
    body = caught.value.body
    assert isinstance(body, dict) and body["code"] == "unsupported_parameter"
    assert body["param"] in ("suffix", "service_tier")
