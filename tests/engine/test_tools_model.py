"""Forced calls on the real model (SmolLM2), in the generic format its own template
gets and in the Hermes format of a tool-capable template put in its place: the
grammars are ones llama.cpp accepts, and the reply is read back as the call."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from warmstart.runtime.engine._template import ChatTemplate
from warmstart.runtime.types import Message, Request, Sampling, Tool

pytestmark = pytest.mark.slow

QWEN = (Path(__file__).parent / "data" / "qwen25_tools.jinja").read_text()
PARAMS = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
WEATHER = Tool("get_weather", "The weather in a city", json.dumps(PARAMS))


def _call(rt, choice: str = "required"):  # type: ignore[no-untyped-def]
    request = Request(
        messages=(Message("user", "Weather in Paris?"),),
        sampling=Sampling(max_tokens=40),
        tools=(WEATHER,),
        tool_choice=choice,
        use_cache=False,
    )
    events = list(rt.generate(request))
    text = "".join(e.text for e in events[:-1])
    return text, events[-1].reply


def test_generic_forced_call(make_runtime) -> None:  # type: ignore[no-untyped-def]
    rt = make_runtime()
    text, reply = _call(rt)
    assert json.loads(text)["tool_calls"][0]["name"] == "get_weather"
    (call,) = reply.tool_calls
    assert call.name == "get_weather" and isinstance(json.loads(call.arguments)["city"], str)


def test_hermes_forced_call(make_runtime) -> None:  # type: ignore[no-untyped-def]
    rt = make_runtime()
    prompter, model = rt.prompter, rt.engine.model
    prompter.template = ChatTemplate(QWEN, model.token_text(model.bos), "<|im_end|>")
    prompter.tool_format = "hermes"
    text, reply = _call(rt)
    assert text.startswith("<tool_call>\n{") and text.rstrip().endswith("</tool_call>")
    (call,) = reply.tool_calls
    assert call.name == "get_weather" and isinstance(json.loads(call.arguments)["city"], str)
    # none: no tools reach the template, the reply is text
    text, reply = _call(rt, "none")
    assert reply.content == text and not reply.tool_calls
