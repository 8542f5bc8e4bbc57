"""Issue 4's acceptance on the real default model (SmolLM2-135M), not the fake.

A real ``warmstart serve`` process on a loopback port, driven by the official
``openai`` client (whole and streamed) and by raw HTTP for the error cases. The
settings are small so the module stays within a couple of minutes on two CPU cores:
prompts are short except where a difference in TTFT must be clear.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.api.conftest import Server
from tests.api.real import N_CTX, real_server

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
KEY = "real-test-key-0123456789"
GREEDY: dict[str, Any] = {"model": "default", "temperature": 0}
QUESTIONS = (
    "Name a fruit that is red.",
    "What is the capital of Italy?",
    "How many legs does a spider have?",
    "What colour is the sky on a clear day?",
    "Name a planet in the solar system.",
    "What do bees make?",
    "What is frozen water called?",
    "Name an animal that can fly.",
)


@pytest.fixture(scope="module")
def data_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("real-api")


@pytest.fixture(scope="module")
def real(model_path: Path, calibration: Path, data_root: Path) -> Iterator[Server]:
    with real_server(model_path, data_root / "main", calibration=calibration) as server:
        yield server


@pytest.fixture
def real_client(real: Server) -> Iterator[openai.OpenAI]:
    # No --api-key on loopback: any key is accepted, and the client insists on one.
    with openai.OpenAI(base_url=real.v1, api_key="x", max_retries=0, timeout=120) as c:
        yield c


def _chat(question: str, system: str = "Answer in one short sentence.") -> list[Any]:
    return [{"role": "system", "content": system}, {"role": "user", "content": question}]


def _extra(reply: Any) -> dict[str, Any]:
    return dict((reply.model_extra or {})["x_warmstart"])


def _post(real: Server, path: str, body: Any) -> httpx.Response:
    if isinstance(body, bytes):
        headers = {"Content-Type": "application/json"}
        return httpx.post(real.v1 + path, content=body, headers=headers, timeout=60)
    return httpx.post(real.v1 + path, json=body, timeout=60)


def test_chat_whole_reply(real_client: openai.OpenAI) -> None:
    reply = real_client.chat.completions.create(
        messages=_chat("What is the opposite of hot?"), max_tokens=8, **GREEDY
    )
    assert reply.object == "chat.completion"
    assert (reply.choices[0].message.content or "").strip()
    assert reply.choices[0].finish_reason in ("stop", "length")
    usage = reply.usage
    assert usage is not None and usage.prompt_tokens > 0 and 0 < usage.completion_tokens <= 8
    assert usage.prompt_tokens_details is not None
    extra = _extra(reply)
    assert extra["prompt_tokens"] == usage.prompt_tokens
    assert extra["cached_tokens"] == usage.prompt_tokens_details.cached_tokens
    assert extra["ttft_ms"] > 0
    assert reply.model == real_client.models.list().data[0].id


def test_chat_streamed_matches_whole(real_client: openai.OpenAI) -> None:
    messages = _chat("Name a musical instrument.")
    whole = real_client.chat.completions.create(messages=messages, max_tokens=8, **GREEDY)
    chunks = list(
        real_client.chat.completions.create(
            messages=messages,
            max_tokens=8,
            stream=True,
            stream_options={"include_usage": True},
            **GREEDY,
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.strip() and text == whole.choices[0].message.content
    finishing = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finishing) == 1 and finishing[0].usage is not None
    assert "x_warmstart" in (finishing[0].model_extra or {})
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage is not None
    assert usage.completion_tokens == whole.usage.completion_tokens  # type: ignore[union-attr]


def test_raw_completion(real_client: openai.OpenAI) -> None:
    reply = real_client.completions.create(
        prompt="The three primary colours are", max_tokens=8, **GREEDY
    )
    assert reply.object == "text_completion"
    assert reply.choices[0].text.strip()
    assert reply.usage is not None and reply.usage.prompt_tokens > 0
    assert _extra(reply)["prompt_tokens"] == reply.usage.prompt_tokens


def test_eight_concurrent_clients_get_their_alone_replies(real: Server) -> None:
    """Eight clients at once get, bit for bit, the greedy replies each gets alone, five
    times over: every conversation has a KV stream of its own (what else is resident
    never changes its attention), every prompt is prefilled in the same batches cold
    or cached, and each request samples from its own logits."""

    def ask(question: str, barrier: threading.Barrier | None = None) -> str:
        with openai.OpenAI(base_url=real.v1, api_key="x", max_retries=0, timeout=300) as c:
            if barrier is not None:
                barrier.wait()  # all eight requests arrive together
            reply = c.chat.completions.create(messages=_chat(question), max_tokens=12, **GREEDY)
        return reply.choices[0].message.content or ""

    alone = [ask(q) for q in QUESTIONS]
    assert all(a.strip() for a in alone)
    for _ in range(5):
        barrier = threading.Barrier(len(QUESTIONS))
        with ThreadPoolExecutor(len(QUESTIONS)) as pool:
            together = list(pool.map(ask, QUESTIONS, [barrier] * len(QUESTIONS)))
        assert together == alone


def test_new_conversations_get_replies_while_every_resident_holds_another(
    real: Server,
) -> None:
    # Fill every resident sequence with a long conversation (over a chunk beyond the
    # few chat-template tokens all chats share), then let eight new ones arrive at once:
    # each must find a sequence to run in, however the others were placed.
    for i in range(8):
        system = f"Topic {i}: " + f"keep notes on shelf {i} of the archive room. " * 8
        body = {"messages": _chat("Anything new?", system), "max_tokens": 2, **GREEDY}
        assert _post(real, "/chat/completions", body).status_code == 200
    barrier = threading.Barrier(8)

    def ask(i: int) -> httpx.Response:
        body = {"messages": _chat(f"Say the number {i}."), "max_tokens": 4, **GREEDY}
        barrier.wait()
        return _post(real, "/chat/completions", body)

    with ThreadPoolExecutor(8) as pool:
        replies = list(pool.map(ask, range(8)))
    assert [r.status_code for r in replies] == [200] * 8, [r.text for r in replies]


def test_repeat_is_cached_and_faster(real_client: openai.OpenAI, real: Server) -> None:
    # About 250 tokens no other test shares, so the first reply computes all of them.
    system = "You help the staff of a small hardware shop called Ferro & Sons. " + " ".join(
        f"Rule {i}: stay polite, answer briefly, and never guess the price of item {i}."
        for i in range(12)
    )
    messages = _chat("Do you sell hammers?", system)
    first = real_client.chat.completions.create(messages=messages, max_tokens=8, **GREEDY)
    second = real_client.chat.completions.create(messages=messages, max_tokens=8, **GREEDY)
    assert first.usage is not None and first.usage.prompt_tokens >= 200
    assert second.choices[0].message.content == first.choices[0].message.content
    cached = second.usage.prompt_tokens_details.cached_tokens  # type: ignore[union-attr]
    assert cached > first.usage.prompt_tokens // 2
    cold, warm = _extra(first)["ttft_ms"], _extra(second)["ttft_ms"]
    assert warm < cold / 2, (cold, warm)

    # The session counts each cached token once, however many tiers hold it.
    session_id = _extra(second)["session_id"]
    session = httpx.get(f"{real.v1}/warmstart/sessions/{session_id}").json()
    assert 0 < session["cached_tokens"] <= session["n_tokens"], session


TOO_LONG = " ".join(f"note{i}" for i in range(N_CTX))  # several tokens per word
HI: list[Any] = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    ("path", "body", "status", "param", "code"),
    [
        ("/chat/completions", b'{"messages": [', 400, None, None),
        ("/chat/completions", {"messages": []}, 400, "messages", None),
        ("/chat/completions", {"model": "gpt-4o", "messages": HI}, 404, "model", "model_not_found"),
        ("/chat/completions", {"messages": HI, "max_tokens": 0}, 400, "max_tokens", None),
        ("/chat/completions", {"messages": HI, "max_tokens": N_CTX + 1}, 400, "max_tokens", None),
        (
            "/chat/completions",
            {"messages": [{"role": "user", "content": TOO_LONG}], "max_tokens": 8},
            400,
            "messages",
            "context_length_exceeded",
        ),
        (
            "/chat/completions",
            {"messages": [{"role": "user", "content": TOO_LONG}]},  # max_tokens chosen
            400,
            "messages",
            "context_length_exceeded",
        ),
        ("/completions", {"prompt": TOO_LONG}, 400, "prompt", "context_length_exceeded"),
        ("/completions", {"prompt": ""}, 400, "prompt", None),
    ],
    ids=[
        "malformed-json",
        "empty-messages",
        "unknown-model",
        "max-tokens-zero",
        "max-tokens-over-context",
        "prompt-over-context",
        "prompt-over-context-no-max-tokens",
        "completion-over-context",
        "empty-prompt",
    ],
)
def test_bad_requests_get_openai_errors_and_the_server_goes_on(
    real: Server, path: str, body: Any, status: int, param: str | None, code: str | None
) -> None:
    response = _post(real, path, body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and error["message"]
    assert (error["param"], error["code"]) == (param, code)
    after = _post(real, "/chat/completions", {"messages": HI, "max_tokens": 2})
    assert after.status_code == 200, after.text
    assert after.json()["usage"]["completion_tokens"] > 0


def test_context_overflow_is_a_bad_request_for_the_openai_client(
    real_client: openai.OpenAI,
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        real_client.chat.completions.create(
            messages=[{"role": "user", "content": TOO_LONG}], max_tokens=8, **GREEDY
        )
    assert caught.value.code == "context_length_exceeded"


def test_loopback_without_a_key_works(real: Server) -> None:
    assert httpx.get(real.v1 + "/models").status_code == 200  # no Authorization at all


def test_api_key_is_required_when_set(
    real: Server, model_path: Path, calibration: Path, data_root: Path
) -> None:
    # The bind rule (no exposed bind without a key) is tested on serve() in test_auth;
    # this checks the key itself on the real model.
    keyed_dir = data_root / "keyed"
    body = {"messages": HI, "max_tokens": 2}
    with real_server(model_path, keyed_dir, "--api-key", KEY, calibration=calibration) as keyed:
        url = keyed.v1 + "/chat/completions"
        for headers in ({}, {"Authorization": "Bearer wrong-key-0000"}, {"Authorization": KEY}):
            response = httpx.post(url, json=body, headers=headers, timeout=60)
            assert response.status_code == 401, headers
            assert response.json()["error"]["code"] == "invalid_api_key"
        good = httpx.post(url, json=body, headers={"Authorization": f"Bearer {KEY}"}, timeout=60)
        assert good.status_code == 200, good.text
        assert good.json()["choices"][0]["message"]["content"]
        bad = openai.OpenAI(base_url=keyed.v1, api_key="nope-nope", max_retries=0)
        with bad, pytest.raises(openai.AuthenticationError):
            bad.chat.completions.create(messages=HI, max_tokens=2, **GREEDY)
