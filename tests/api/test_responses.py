"""The Responses API (/v1/responses) through the official ``openai`` client, unchanged,
on the fake runtime's server: text, the typed stream, function tools and their
outputs, previous_response_id, store, GET and DELETE, and refusals by name. The real
model's replies and cache are tested in test_responses_real.py."""

from __future__ import annotations

import json
import uuid
from typing import Any

import httpx
import openai
import pytest

from tests.api.conftest import Server

TOOLS: list[Any] = [
    {
        "type": "function",
        "name": "lookup",
        "description": "Looks a word up.",
        "parameters": {"type": "object", "properties": {"word": {"type": "string"}}},
    }
]


def _create(client: openai.OpenAI, **kw: Any) -> Any:
    kw.setdefault("input", f"Define cache {uuid.uuid4().hex[:8]}")
    kw.setdefault("max_output_tokens", 40)
    return client.responses.create(model="default", temperature=0, **kw)


def _post(server: Server, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(server.v1 + "/responses", json={"model": "default", **body}, timeout=30)


def test_a_text_response_in_openais_shape(client: openai.OpenAI) -> None:
    reply = _create(client, instructions="Be brief.", metadata={"run": "1"})
    assert reply.object == "response" and reply.id.startswith("resp_")
    assert reply.status == "completed" and reply.error is None
    (item,) = reply.output
    assert item.type == "message" and item.role == "assistant" and item.id.startswith("msg_")
    assert item.content[0].type == "output_text" and reply.output_text.strip()
    assert reply.instructions == "Be brief." and reply.metadata == {"run": "1"}
    assert reply.store is True and reply.tools == [] and reply.tool_choice == "auto"
    usage = reply.usage
    assert usage is not None and usage.input_tokens > 0 and usage.output_tokens > 0
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    extra = (reply.model_extra or {})["x_warmstart"]
    assert extra["prompt_tokens"] == usage.input_tokens


def test_max_output_tokens_makes_it_incomplete(client: openai.OpenAI) -> None:
    reply = _create(client, max_output_tokens=2)
    assert reply.status == "incomplete"
    assert reply.incomplete_details is not None
    assert reply.incomplete_details.reason == "max_output_tokens"
    assert reply.usage is not None and reply.usage.output_tokens == 2


def test_the_stream_is_openais_events_and_ends_as_the_whole_reply(client: openai.OpenAI) -> None:
    question = f"Stream cache {uuid.uuid4().hex[:8]}"
    with client.responses.stream(model="default", input=question, temperature=0) as stream:
        kinds, deltas = [], []
        for event in stream:
            kinds.append(event.type)
            if event.type == "response.output_text.delta":
                deltas.append(event.delta)
        final = stream.get_final_response()
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert deltas and "".join(deltas) == final.output_text
    whole = _create(client, input=question)
    assert whole.output_text == final.output_text
    assert final.usage is not None and final.usage.output_tokens == len(deltas)


def test_a_stream_numbers_its_events(server: Server) -> None:
    with httpx.stream(
        "POST", server.v1 + "/responses", json={"input": "Number me", "stream": True}, timeout=30
    ) as r:
        lines = [line for line in r.iter_lines() if line]
    names = [line.removeprefix("event: ") for line in lines if line.startswith("event: ")]
    data = [json.loads(line.removeprefix("data: ")) for line in lines if line.startswith("data: ")]
    assert r.headers["content-type"].startswith("text/event-stream")
    assert names == [d["type"] for d in data]
    assert [d["sequence_number"] for d in data] == list(range(len(data)))
    assert data[-1]["response"]["usage"]["input_tokens"] > 0
    assert "x_warmstart" in data[-1]["response"]


def test_previous_response_id_continues_the_conversation(client: openai.OpenAI) -> None:
    first = _create(client, instructions="Be brief.")
    second = _create(
        client, instructions="Be brief.", input="And then?", previous_response_id=first.id
    )
    assert second.previous_response_id == first.id
    assert first.usage is not None and second.usage is not None
    # the first turn, its reply and the new one: more than the first prompt and reply
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    assert second.usage.input_tokens_details.cached_tokens > 0


def test_a_conversation_sent_back_item_by_item_is_the_chained_prompt(
    client: openai.OpenAI,
) -> None:
    question = f"Define chain {uuid.uuid4().hex[:8]}"
    first = _create(client, input=question)
    chained = _create(client, input="More?", previous_response_id=first.id)
    echoed = [{"role": "user", "content": question}, *[o.model_dump() for o in first.output]]
    explicit = _create(client, input=[*echoed, {"role": "user", "content": "More?"}])
    assert chained.usage is not None and explicit.usage is not None
    assert explicit.usage.input_tokens == chained.usage.input_tokens
    assert explicit.output_text == chained.output_text


def test_a_function_tool_round_trip(client: openai.OpenAI) -> None:
    called = _create(client, tools=TOOLS, tool_choice="required")
    (call,) = called.output
    assert call.type == "function_call" and call.name == "lookup"
    assert call.call_id.startswith("call_") and call.id.startswith("fc_")
    assert json.loads(call.arguments) == {}
    assert called.tools[0].name == "lookup" and called.tool_choice == "required"
    output = {"type": "function_call_output", "call_id": call.call_id, "output": "a store"}
    answer = _create(client, tools=TOOLS, input=[output], previous_response_id=called.id)
    assert answer.output[0].type == "message" and answer.output_text
    # the same round trip sent whole, as clients that keep their own history do
    question = {"role": "user", "content": "Define lookup"}
    first = _create(client, tools=TOOLS, input=[question], tool_choice="required")
    echoed = [o.model_dump() for o in first.output]
    output["call_id"] = first.output[0].call_id
    whole = _create(client, tools=TOOLS, input=[question, *echoed, output])
    assert whole.status == "completed" and whole.output_text


def test_a_streamed_call_arrives_whole(client: openai.OpenAI) -> None:
    choice = {"type": "function", "name": "lookup"}
    with client.responses.stream(
        model="default", input="Define stream", tools=TOOLS, tool_choice=choice
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert "response.function_call_arguments.done" in kinds and kinds[-1] == "response.completed"
    (call,) = final.output
    assert call.type == "function_call" and call.name == "lookup"


def test_stored_responses_are_read_back_and_deleted(client: openai.OpenAI) -> None:
    reply = _create(client)
    again = client.responses.retrieve(reply.id)
    assert again.output_text == reply.output_text and again.id == reply.id
    client.responses.delete(reply.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(reply.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(reply.id)


def test_store_false_keeps_nothing_to_continue(client: openai.OpenAI) -> None:
    reply = _create(client, store=False)
    assert reply.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(reply.id)
    with pytest.raises(openai.BadRequestError) as exc:
        _create(client, previous_response_id=reply.id)
    body = exc.value.body
    assert isinstance(body, dict)
    assert body["param"] == "previous_response_id"
    assert body["code"] == "previous_response_not_found"


def test_deleting_the_session_forgets_its_responses(server: Server, client: openai.OpenAI) -> None:
    session = f"responses-{uuid.uuid4().hex[:8]}"
    reply = _create(client, prompt_cache_key=session)
    assert (reply.model_extra or {})["x_warmstart"]["session_id"] == session
    gone = httpx.delete(f"{server.v1}/warmstart/sessions/{session}", timeout=30)
    assert gone.status_code in (200, 204)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(reply.id)


def test_a_chain_stays_in_the_session_its_client_named(client: openai.OpenAI) -> None:
    session = f"chain-{uuid.uuid4().hex[:8]}"
    first = _create(client, extra_headers={"X-Warmstart-Session": session})
    second = _create(client, input="Go on", previous_response_id=first.id)
    assert (second.model_extra or {})["x_warmstart"]["session_id"] == session


@pytest.mark.parametrize(
    "body,param",
    [
        ({"reasoning": {"effort": "low"}}, "reasoning"),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"include": ["message.output_text.logprobs"]}, "include"),
        ({"truncation": "disabled"}, "truncation"),
        ({"background": True}, "background"),
        ({"service_tier": "flex"}, "service_tier"),
        ({"conversation": "conv_1"}, "conversation"),
        ({"text": {"format": {"type": "text"}, "verbosity": "low"}}, "text.verbosity"),
        ({"tools": [{"type": "web_search"}]}, "tools"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            "input.0.content",
        ),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input"),
    ],
)
def test_what_is_not_served_is_refused_by_name(
    server: Server, body: dict[str, Any], param: str
) -> None:
    r = _post(server, {"input": "Hello", **body})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["code"] == "unsupported_parameter", error
    assert error["type"] == "invalid_request_error"


def test_bad_input_is_a_clear_400(server: Server) -> None:
    cases = [
        ({"input": []}, "input"),
        ({"input": [{"role": "system", "content": "Only a system turn"}]}, "input"),
        ({"input": "x", "max_output_tokens": 10**6}, "max_output_tokens"),
        ({"input": "x", "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice"),
        ({"input": [{"type": "function_call_output", "output": "x"}]}, "input.0.call_id"),
    ]
    for body, param in cases:
        r = _post(server, body)
        assert r.status_code == 400, (body, r.text)
        assert r.json()["error"]["param"] == param, (body, r.text)


def test_json_output_follows_text_format(client: openai.OpenAI) -> None:
    reply = _create(client, text={"format": {"type": "json_object"}})
    assert isinstance(json.loads(reply.output_text), dict)
    assert reply.text is not None and reply.text.format.type == "json_object"


# field -> a value warmstart honours (the request must succeed); every other field of
# the openai package's own request type must be refused by name
HONOURED: dict[str, Any] = {
    "model": "default",
    "include": [],
    "instructions": "Be brief.",
    "max_output_tokens": 4,
    "metadata": {"k": "v"},
    "parallel_tool_calls": False,
    "prompt_cache_key": "walk-key",
    "store": False,
    "stream_options": {"include_obfuscation": False},
    "temperature": 0.5,
    "text": {"format": {"type": "text"}},
    "tool_choice": "none",
    "tools": TOOLS,
    "top_p": 0.9,
    "truncation": "auto",
    "user": "walk-user",
    "background": False,
}
REFUSED_VALUES: dict[str, Any] = {
    "background": True,
    "include": ["reasoning.encrypted_content"],
    "truncation": "disabled",
    "stream_options": {"include_obfuscation": True},
}


def test_every_field_of_the_openai_client_is_honoured_or_refused(
    server: Server, client: openai.OpenAI
) -> None:
    from openai.types.responses import response_create_params as params

    earlier = _create(client).id
    fields = set(params.ResponseCreateParamsBase.__annotations__) - {"input"}
    for field in sorted(fields):
        if field == "previous_response_id":
            assert _post(server, {"input": "Hi", field: earlier}).status_code == 200
        elif field in HONOURED:
            r = _post(server, {"input": "Hi", "max_output_tokens": 4, field: HONOURED[field]})
            assert r.status_code == 200, (field, r.text)
        else:
            r = _post(server, {"input": "Hi", field: "probe"})
            assert r.status_code == 400, (field, r.text)
            error = r.json()["error"]
            assert error["param"] == field and error["code"] == "unsupported_parameter", error
    for field, value in REFUSED_VALUES.items():
        r = _post(server, {"input": "Hi", field: value})
        assert r.status_code == 400, (field, r.text)
        assert r.json()["error"]["param"].startswith(field), r.text
