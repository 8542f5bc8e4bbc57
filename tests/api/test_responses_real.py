"""Issue 21, items 2 and 6: the Responses API on a real ``warmstart serve`` with the
real default model (SmolLM2-135M), through the official ``openai`` client's
``responses.create`` unchanged and through the OpenAI Agents SDK: text, the stream,
a function tool round trip, and a ``previous_response_id`` chain that reports cached
prompt tokens from its second request on while its greedy replies equal those of a
``--no-cache`` server sent the same conversation.

Replies are a few tokens: the model is tiny and the machine is shared.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.api.conftest import Server
from tests.api.real import real_server

pytestmark = pytest.mark.slow

INSTRUCTIONS = "Answer in one short sentence."
WEATHER: dict[str, Any] = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather now in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
}


@pytest.fixture(scope="module")
def servers(
    model_path: Path, calibration: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Any]:
    root = tmp_path_factory.mktemp("responses-real")
    with (
        real_server(model_path, root / "cached", calibration=calibration) as cached,
        real_server(model_path, root / "cold", "--no-cache", calibration=calibration) as cold,
    ):
        yield cached, cold


def _client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.v1, api_key="x", max_retries=0, timeout=180)


@pytest.fixture(scope="module")
def client(servers: Any) -> Iterator[openai.OpenAI]:
    with _client(servers[0]) as c:
        yield c


def _create(client: openai.OpenAI, **kw: Any) -> Any:
    kw.setdefault("max_output_tokens", 12)
    kw.setdefault("instructions", INSTRUCTIONS)
    return client.responses.create(model="default", temperature=0, **kw)


def _cached(reply: Any) -> int:
    assert reply.usage is not None
    return int(reply.usage.input_tokens_details.cached_tokens)


def test_text_whole_and_streamed_are_the_same_reply(client: openai.OpenAI) -> None:
    question = f"What is the capital of France? ({uuid.uuid4().hex[:6]})"
    whole = _create(client, input=question)
    assert whole.status in ("completed", "incomplete") and whole.output_text.strip()
    with client.responses.stream(
        model="default", input=question, instructions=INSTRUCTIONS, temperature=0,
        max_output_tokens=12,
    ) as stream:  # fmt: skip
        events = list(stream)
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert "".join(deltas) == whole.output_text
    last = events[-1]
    assert last.type == f"response.{whole.status}"
    assert last.response.output_text == whole.output_text
    assert _cached(last.response) > 0  # the same prompt again


def test_a_chain_is_cached_and_its_greedy_replies_equal_no_cache(
    servers: Any, client: openai.OpenAI
) -> None:
    questions = ["Name a fruit that is red.", "Name another one.", "And a yellow one?"]
    chain, previous = [], None
    for question in questions:
        reply = _create(client, input=question, previous_response_id=previous)
        chain.append(reply)
        previous = reply.id
    assert all(_cached(r) > 0 for r in chain[1:]), [r.usage for r in chain]
    # most of each continuation comes from the cache: only the new turn is computed
    for before, after in itertools.pairwise(chain):
        assert before.usage is not None
        assert _cached(after) >= before.usage.input_tokens
    # the same conversations, sent whole (a --no-cache server keeps no responses)
    with _client(servers[1]) as cold:
        items: list[Any] = []
        for question, reply in zip(questions, chain, strict=True):
            items.append({"role": "user", "content": question})
            oracle = _create(cold, input=items)
            assert _cached(oracle) == 0
            assert oracle.output_text == reply.output_text, (question, oracle, reply)
            assert oracle.usage is not None and reply.usage is not None
            assert oracle.usage.input_tokens == reply.usage.input_tokens
            items += [o.model_dump() for o in oracle.output]


def test_a_function_tool_round_trip(client: openai.OpenAI) -> None:
    question = f"What is the weather in Oslo? ({uuid.uuid4().hex[:6]})"
    called = _create(
        client, input=question, tools=[WEATHER], tool_choice="required", max_output_tokens=40
    )
    calls = [o for o in called.output if o.type == "function_call"]
    assert calls and calls[0].name == "get_weather", called.output
    assert isinstance(json.loads(calls[0].arguments)["city"], str)
    result = {"type": "function_call_output", "call_id": calls[0].call_id, "output": "Sunny, 20 C"}
    answer = _create(client, input=[result], tools=[WEATHER], previous_response_id=called.id)
    assert answer.output and answer.status in ("completed", "incomplete")
    assert _cached(answer) > 0


def test_the_agents_sdk_runs_an_agent_with_a_tool(servers: Any) -> None:
    """One agent, one tool, on the Responses API. The tiny model calls a tool again
    whenever it may, so the run stops at the tool's result, and a second run of the
    same agent, sent the first one's items (call and output) and told to answer in
    text, replies to it: a conversation the SDK keeps itself, cached all the same."""
    agents = pytest.importorskip("agents")
    agents.set_tracing_disabled(True)  # no network: traces would go to OpenAI
    asked: list[str] = []

    @agents.function_tool
    def get_weather(city: str) -> str:
        """The weather now in a city."""
        asked.append(city)
        return f"Sunny in {city}, 20 C."

    async def run() -> tuple[Any, Any]:
        async with openai.AsyncOpenAI(
            base_url=servers[0].v1, api_key="x", max_retries=0, timeout=180
        ) as client:
            agent = agents.Agent(
                name="weather",
                instructions=INSTRUCTIONS,
                tools=[get_weather],
                model=agents.OpenAIResponsesModel(model="default", openai_client=client),
                model_settings=agents.ModelSettings(
                    tool_choice="required", temperature=0, max_tokens=40
                ),
                tool_use_behavior="stop_on_first_tool",
            )
            first = await agents.Runner.run(agent, "What is the weather in Paris?", max_turns=2)
            answering = agent.clone(
                model_settings=agents.ModelSettings(
                    tool_choice="none", temperature=0, max_tokens=100
                )
            )
            items = [*first.to_input_list(), {"role": "user", "content": "So, is it warm?"}]
            return first, await agents.Runner.run(answering, items, max_turns=1)

    first, second = asyncio.run(run())
    assert asked and first.final_output == f"Sunny in {asked[0]}, 20 C."
    assert isinstance(second.final_output, str) and second.final_output.strip()
    (reply,) = second.raw_responses
    assert reply.usage.input_tokens_details.cached_tokens > 0, reply.usage
    assert len(asked) == 1
