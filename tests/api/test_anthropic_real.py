"""Issue 21, items 3 and 6: the official ``anthropic`` client, unchanged, against a
real ``warmstart serve`` on the real default model (SmolLM2-135M, whose template has
no tools: the generic JSON format held by a grammar): text, streamed, and a tool
round trip whose every request after the first reads the cache, with greedy replies
equal to a ``--no-cache`` server's.

Short on purpose: a handful of tokens per reply, two servers for the module.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import pytest

from tests.api.conftest import Server
from tests.api.real import real_server
from tests.api.test_tools_real import WEATHER_PARAMS, _valid

pytestmark = pytest.mark.slow

GREEDY: dict[str, Any] = {"model": "default", "extra_body": {"temperature": 0}}
TOOLS: list[Any] = [
    {
        "name": "get_weather",
        "description": "The weather forecast for a city.",
        "input_schema": WEATHER_PARAMS,
    }
]


@pytest.fixture(scope="module")
def data_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("anthropic-real")


@pytest.fixture(scope="module")
def real(model_path: Path, calibration: Path, data_root: Path) -> Iterator[Server]:
    with real_server(model_path, data_root / "cached", calibration=calibration) as server:
        yield server


@pytest.fixture(scope="module")
def oracle(model_path: Path, calibration: Path, data_root: Path) -> Iterator[Server]:
    no_cache = data_root / "no-cache"
    with real_server(model_path, no_cache, "--no-cache", calibration=calibration) as server:
        yield server


def _client(server: Server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.base_url, api_key="x", max_retries=0, timeout=180)


@pytest.fixture
def claude(real: Server) -> Iterator[anthropic.Anthropic]:
    with _client(real) as c:
        yield c


def _seen(content: list[Any]) -> list[Any]:
    """A reply's blocks as the model made them (a call's id is the server's own)."""
    return [b.text if b.type == "text" else (b.name, b.input) for b in content]


def test_text_whole_and_streamed(claude: anthropic.Anthropic) -> None:
    messages: Any = [{"role": "user", "content": "What is the opposite of hot?"}]
    kw: dict[str, Any] = {"messages": messages, "system": "Answer in one word.", "max_tokens": 8}
    whole = claude.messages.create(**GREEDY, **kw)
    assert whole.content[0].type == "text" and whole.content[0].text.strip()
    assert whole.stop_reason in ("end_turn", "max_tokens") and 0 < whole.usage.output_tokens <= 8
    prompt = (whole.model_extra or {})["x_warmstart"]["prompt_tokens"]
    assert whole.usage.input_tokens + whole.usage.cache_read_input_tokens == prompt
    with claude.messages.stream(**GREEDY, **kw) as stream:
        deltas = [e.delta.text for e in stream if e.type == "content_block_delta"]  # type: ignore[union-attr]
        final = stream.get_final_message()
    assert "".join(deltas) == whole.content[0].text == final.content[0].text
    assert final.usage.cache_read_input_tokens  # the same prompt again: from the cache
    assert final.usage.output_tokens == whole.usage.output_tokens
    # a stop sequence from the reply itself: the same greedy reply stops there
    stop = whole.content[0].text.strip()[:2]
    cut = claude.messages.create(**GREEDY, **kw, stop_sequences=[stop])
    assert cut.stop_reason == "stop_sequence" and cut.stop_sequence == stop
    assert stop not in cut.content[0].text


def test_tool_round_trip_is_cached_and_equals_no_cache(
    claude: anthropic.Anthropic, oracle: Server
) -> None:
    """Call, result and answer, then one more question: each request sent to both
    servers with the same history, the cached server's replies kept as that history."""
    history: list[Any] = [
        {"role": "user", "content": "What is the weather in Paris for 2 days, in celsius?"}
    ]
    kw: dict[str, Any] = {"system": "You are a weather assistant.", "tools": TOOLS}
    steps: list[tuple[dict[str, Any], str | None]] = [
        ({"type": "any"}, None),
        ({"type": "none"}, "Thanks. Is that warm?"),
        ({"type": "none"}, None),
    ]
    with _client(oracle) as cold:
        for turn, (choice, follow_up) in enumerate(steps):
            args = {**GREEDY, **kw, "messages": history, "tool_choice": choice, "max_tokens": 40}
            if turn == 1:  # streamed, as agents run their loop
                with claude.messages.stream(**args) as stream:
                    reply = stream.get_final_message()
            else:
                reply = claude.messages.create(**args)
            expected = cold.messages.create(**args)
            assert _seen(reply.content) == _seen(expected.content), turn
            assert expected.usage.cache_read_input_tokens == 0
            if turn > 0:
                assert reply.usage.cache_read_input_tokens >= 64, (turn, reply.usage)
            history.append({"role": "assistant", "content": reply.model_dump()["content"]})
            if turn == 0:
                assert reply.stop_reason == "tool_use"
                (use,) = reply.content
                assert use.type == "tool_use" and use.name == "get_weather"
                assert _valid(use.input, WEATHER_PARAMS), use.input
                result = {"type": "tool_result", "tool_use_id": use.id, "content": "sunny, 21 C"}
                history.append({"role": "user", "content": [result]})
            else:
                assert reply.stop_reason in ("end_turn", "max_tokens")
                assert reply.content[0].type == "text" and reply.content[0].text.strip()
                if follow_up:
                    history.append({"role": "user", "content": follow_up})
