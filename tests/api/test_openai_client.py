"""The server driven by the official openai client, streaming and not."""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import openai

from tests.api.conftest import Server


def _chat(topic: str) -> list[Any]:
    return [
        {"role": "system", "content": "You are a terse assistant. " * 20},
        {"role": "user", "content": f"Tell me one fact about {topic}."},
    ]


def _ask(client: openai.OpenAI, messages: list[Any], **kw: Any) -> Any:
    kw.setdefault("max_tokens", 24)
    return client.chat.completions.create(model="default", messages=messages, temperature=0, **kw)


def test_models_lists_the_loaded_model(client: openai.OpenAI) -> None:
    models = client.models.list().data
    assert len(models) == 1
    assert client.models.retrieve(models[0].id).id == models[0].id


def test_chat_reply_has_usage_and_x_warmstart(client: openai.OpenAI) -> None:
    reply = _ask(client, _chat(f"whales {uuid.uuid4()}"))
    assert reply.object == "chat.completion"
    assert reply.choices[0].message.role == "assistant"
    assert reply.choices[0].message.content
    assert reply.choices[0].finish_reason in ("stop", "length")
    usage = reply.usage
    assert usage is not None and usage.prompt_tokens > 0
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert usage.prompt_tokens_details is not None
    extra = (reply.model_extra or {})["x_warmstart"]
    assert extra["prompt_tokens"] == usage.prompt_tokens
    assert extra["cached_tokens"] == usage.prompt_tokens_details.cached_tokens
    assert set(extra["restored"]) == {"live", "ram", "disk"}
    assert extra["ttft_ms"] > 0


def test_stream_matches_the_whole_reply(client: openai.OpenAI) -> None:
    messages = _chat(f"owls {uuid.uuid4()}")
    whole = _ask(client, messages).choices[0].message.content
    chunks = list(_ask(client, messages, stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole
    assert chunks[0].choices[0].delta.role == "assistant"
    finishing = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finishing) == 1
    # warmstart always puts usage and x_warmstart on the finishing chunk ...
    assert finishing[0].usage is not None
    assert "x_warmstart" in (finishing[0].model_extra or {})
    # ... and include_usage adds OpenAI's choice-less usage chunk at the end.
    assert chunks[-1].choices == [] and chunks[-1].usage is not None


def test_stream_without_include_usage_still_reports_on_last_chunk(client: openai.OpenAI) -> None:
    chunks = list(_ask(client, _chat(f"bees {uuid.uuid4()}"), stream=True))
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    assert chunks[-1].usage is not None


def test_repeat_reports_cached_tokens_and_lower_ttft(client: openai.OpenAI) -> None:
    # A long prompt no other test shares, so the first reply computes all of it.
    unique = f"Context {uuid.uuid4()}: " + "volcanoes erupt when pressure builds. " * 60
    messages = [{"role": "system", "content": unique}, {"role": "user", "content": "Why?"}]
    first = _ask(client, messages)
    second = _ask(client, messages)
    assert first.choices[0].message.content == second.choices[0].message.content
    assert second.usage is not None and second.usage.prompt_tokens_details is not None
    assert second.usage.prompt_tokens_details.cached_tokens > 0
    ttft = [(r.model_extra or {})["x_warmstart"]["ttft_ms"] for r in (first, second)]
    assert ttft[1] < ttft[0]


def test_follow_up_turn_restores_the_earlier_turn(client: openai.OpenAI) -> None:
    messages = _chat(f"rivers {uuid.uuid4()}")
    first = _ask(client, messages)
    follow = [
        *messages,
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "And another?"},
    ]
    second = _ask(client, follow)
    assert second.usage is not None and second.usage.prompt_tokens_details is not None
    assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens  # type: ignore[union-attr]


def test_session_header_names_the_conversation(client: openai.OpenAI, server: Server) -> None:
    session = f"s-{uuid.uuid4()}"
    _ask(client, _chat("moss"), extra_headers={"X-Warmstart-Session": session})
    reply = _ask(client, _chat("moss"), user=session)
    assert (reply.model_extra or {})["x_warmstart"]["session_id"] == session


def test_completions_stream_and_whole(client: openai.OpenAI) -> None:
    prompt = f"Once upon a time {uuid.uuid4()}"
    whole = client.completions.create(model="default", prompt=prompt, max_tokens=5, temperature=0)
    assert whole.object == "text_completion"
    assert whole.usage is not None and whole.usage.completion_tokens <= 5
    stream = client.completions.create(
        model="default", prompt=prompt, max_tokens=5, temperature=0, stream=True
    )
    assert "".join(c.choices[0].text for c in stream if c.choices) == whole.choices[0].text


def test_seeded_sampling_is_reproducible(client: openai.OpenAI) -> None:
    messages = _chat(f"clouds {uuid.uuid4()}")
    replies = [
        client.chat.completions.create(
            model="default", messages=messages, temperature=0.9, seed=7, max_tokens=16
        )
        for _ in range(2)
    ]
    assert replies[0].choices[0].message.content == replies[1].choices[0].message.content


def test_max_tokens_ends_with_length(client: openai.OpenAI) -> None:
    short = _ask(client, _chat(f"glaciers {uuid.uuid4()}"), max_tokens=2)
    assert short.choices[0].finish_reason == "length"
    assert short.usage is not None and short.usage.completion_tokens == 2


def test_stop_string_cuts_the_reply(client: openai.OpenAI) -> None:
    messages = _chat(f"deserts {uuid.uuid4()}")
    full = _ask(client, messages, max_tokens=64).choices[0].message.content
    stop = full.split()[2]  # a word from the middle of the greedy reply
    cut = _ask(client, messages, max_tokens=64, stop=[stop])
    assert stop not in cut.choices[0].message.content
    assert full.startswith(cut.choices[0].message.content)
    assert cut.choices[0].finish_reason == "stop"


def test_eight_concurrent_conversations_get_their_solo_replies(client: openai.OpenAI) -> None:
    chats = [_chat(f"topic {i} {uuid.uuid4()}") for i in range(8)]
    alone = [_ask(client, c).choices[0].message.content for c in chats]

    def streamed(messages: list[Any]) -> str:
        chunks = _ask(client, messages, stream=True)
        return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

    with ThreadPoolExecutor(max_workers=8) as pool:
        together = list(pool.map(streamed, chats))
    assert together == alone
