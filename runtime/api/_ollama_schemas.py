"""Request bodies of the Ollama dialect (/api/*), and their translation to Request.

Ollama's clients send some fields on every request with an empty value (the
official Python client sends ``tools: []``, ``suffix: ""``, ``system: ""``,
``raw: false``); those are accepted empty. A field or option warmstart does not
implement is refused with a 400 ``unsupported_parameter`` naming it, never
ignored: a client that asked for JSON output or images and got prose would not
know.
"""

from __future__ import annotations

from typing import Annotated, Any, cast

from pydantic import Field

from .._embed_queue import MAX_EMBED_INPUTS
from ..engine import json_object_grammar, json_schema_grammar
from ..errors import RequestError
from ..types import Message, Request, Role, Sampling
from ._errors import unsupported
from ._keep_alive import KeepAliveValue, keep_alive_seconds
from ._ollama_body import Body as _Body
from ._ollama_tools import CALL_ID, OllamaTool, OllamaToolCall, call_of
from ._schemas import SESSION_ID, JSONObject, Text

# Ollama's own defaults when a request gives no option (its documented Modelfile values).
OLLAMA_TEMPERATURE = 0.8
OLLAMA_TOP_P = 0.9


class Options(_Body):
    """The options warmstart honours; any other is refused by name. Their values'
    bounds are runtime/serving/_admit.py's, as on /v1."""

    temperature: float | None = Field(None, allow_inf_nan=False)
    top_p: float | None = Field(None, allow_inf_nan=False)
    seed: int | None = Field(None, ge=-(2**63), le=2**64 - 1)
    num_predict: int | None = Field(
        None, ge=-2, le=1_000_000, description="tokens to generate; -1 or -2: as many as fit"
    )
    stop: Text | Annotated[list[Text], Field(max_length=16)] | None = None
    # llama.cpp's own samplers, as on /v1; not given: off (Ollama's Modelfile defaults
    # for these are not applied, so a reply is what the request asked for)
    top_k: int | None = None
    min_p: float | None = Field(None, allow_inf_nan=False)
    repeat_penalty: float | None = Field(None, allow_inf_nan=False)
    frequency_penalty: float | None = Field(None, allow_inf_nan=False)
    presence_penalty: float | None = Field(None, allow_inf_nan=False)

    def sampling(self, max_tokens: int, grammar: str | None = None) -> Sampling:
        self.refuse_extras("options.")
        stops = [self.stop] if isinstance(self.stop, str) else (self.stop or [])
        return Sampling(
            grammar=grammar,
            top_k=self.top_k or 0,
            min_p=self.min_p or 0.0,
            repeat_penalty=1.0 if self.repeat_penalty is None else self.repeat_penalty,
            frequency_penalty=self.frequency_penalty or 0.0,
            presence_penalty=self.presence_penalty or 0.0,
            temperature=OLLAMA_TEMPERATURE if self.temperature is None else self.temperature,
            top_p=OLLAMA_TOP_P if self.top_p is None else self.top_p,
            # llama.cpp seeds are 32-bit; any integer a client sends maps onto one.
            seed=None if self.seed is None else self.seed % 2**32,
            max_tokens=max_tokens,
            stop=tuple(s for s in stops if s),
        )


class OllamaMessage(_Body):
    # which roles there are is runtime/serving/_admit.py's rule (check_request), as on /v1
    role: Text = Field(..., description="system, user, assistant or tool")
    content: Text = ""
    images: list[Any] | None = Field(None, description="refused unless empty")
    tool_calls: Annotated[list[OllamaToolCall], Field(max_length=128)] | None = Field(
        None, description="on an assistant turn: the calls it made"
    )
    tool_name: Annotated[Text, Field(min_length=1, max_length=256)] | None = Field(
        None, description="on a tool turn: the function whose result it is"
    )
    tool_call_id: CALL_ID | None = Field(None, description="on a tool turn: the call it answers")
    thinking: Text | None = Field(None, description="refused unless empty")

    def to_message(self, index: int) -> Message:
        where = f"messages.{index}."
        self.refuse_extras(where)
        for name in ("images", "thinking"):
            if getattr(self, name):
                raise unsupported(where + name)
        if self.tool_calls and self.role != "assistant":
            raise RequestError(
                f"{where}tool_calls: only an assistant message may carry tool_calls",
                where + "tool_calls",
            )
        for name in ("tool_name", "tool_call_id"):
            if getattr(self, name) is not None and self.role != "tool":
                raise RequestError(f"{where}{name}: only a tool message has it", where + name)
        calls = tuple(
            call_of(c, f"{where}tool_calls.{i}") for i, c in enumerate(self.tool_calls or ())
        )
        return Message(
            role=cast(Role, self.role),  # checked at admission
            content=self.content,
            tool_calls=calls,
            tool_call_id=self.tool_call_id,
            name=self.tool_name,
        )

    def text_chars(self) -> int:
        return len(self.content) + sum(len(c.arguments_text()) for c in self.tool_calls or ())


class _Generating(_Body):
    """Fields /api/chat and /api/generate share."""

    model: Text = Field("", description="the loaded model's name (see /api/tags) or 'default'")
    stream: bool = Field(True, description="NDJSON lines as tokens come (Ollama's default)")
    options: Options | None = None
    format: Text | JSONObject | None = Field(
        None, description='"json" or a JSON schema: the reply is held to it by a grammar'
    )
    keep_alive: KeepAliveValue = Field(
        None,
        description="how long the model stays loaded after this reply: seconds or a "
        'duration ("5m"); 0 unloads it after the reply, negative: for good (the default)',
    )
    think: bool | Text | None = Field(None, description="refused unless false")
    logprobs: bool | None = Field(None, description="refused unless false")
    top_logprobs: int | None = Field(None, description="refused unless 0")
    user: SESSION_ID | None = Field(None, description="session hint (X-Warmstart-Session wins)")

    def check_common(self) -> None:
        """Refuses what no route here implements (after the route's own fields)."""
        self.refuse_extras()
        if isinstance(self.format, str) and self.format not in ("", "json"):
            raise unsupported("format", 'give "json" or a JSON schema')
        if self.think:
            raise unsupported("think", "the model runs without a thinking mode")
        if self.logprobs or self.top_logprobs:
            raise unsupported("logprobs" if self.logprobs else "top_logprobs")

    def sampling(self, max_tokens: int) -> Sampling:
        options = self.options or Options.model_validate({})
        return options.sampling(max_tokens, self._grammar())

    def _grammar(self) -> str | None:
        if isinstance(self.format, dict) and self.format:
            return json_schema_grammar(self.format, param="format")
        return json_object_grammar() if self.format == "json" else None

    @property
    def num_predict(self) -> int | None:
        return self.options.num_predict if self.options else None

    @property
    def keep_alive_s(self) -> float | None:
        """keep_alive in seconds (None: not given; inf: for good)."""
        return keep_alive_seconds(self.keep_alive)


class OllamaChatRequest(_Generating):
    messages: list[OllamaMessage] = Field(
        default_factory=list, description="the conversation; empty: only 'load' the model"
    )
    tools: Annotated[list[OllamaTool], Field(max_length=128)] | None = Field(
        None, description="functions the model may call (it chooses: Ollama has no tool_choice)"
    )

    def text_chars(self) -> int:
        tools = sum(t.schema_chars() for t in self.tools or ())
        return sum(m.text_chars() for m in self.messages) + tools

    def to_request(self, session_id: str | None, max_tokens: int) -> Request:
        self.check_common()
        messages = tuple(m.to_message(i) for i, m in enumerate(self.messages))
        return Request(
            messages=messages,
            sampling=self.sampling(max_tokens),
            session_id=session_id or self.user,
            tools=tuple(t.to_tool(i) for i, t in enumerate(self.tools or ())),
        )


class OllamaGenerateRequest(_Generating):
    prompt: Text = Field("", description="empty: only 'load' the model")
    system: Text = Field("", description="a system prompt (not with raw)")
    raw: bool = Field(False, description="true: the prompt as is, without the chat template")
    suffix: Text = Field("", description="refused unless empty (no fill-in-the-middle)")
    template: Text = Field("", description="refused unless empty")
    context: list[int] | None = Field(None, description="refused unless empty")
    images: list[Any] | None = Field(None, description="refused unless empty")

    def text_chars(self) -> int:
        return len(self.prompt) + len(self.system)

    def to_request(self, session_id: str | None, max_tokens: int) -> Request:
        for name in ("suffix", "template", "context", "images"):
            if getattr(self, name):
                raise unsupported(name)
        if self.raw and self.system:
            raise unsupported("system", "a raw prompt has no chat template to put it in")
        self.check_common()
        sampling = self.sampling(max_tokens)
        session = session_id or self.user
        if self.raw:
            return Request(prompt=self.prompt, sampling=sampling, session_id=session)
        turns = [Message("system", self.system)] if self.system else []
        turns.append(Message("user", self.prompt))
        return Request(messages=tuple(turns), sampling=sampling, session_id=session)


class OllamaShowRequest(_Body):
    model: Text = Field("", description="the model's name")
    name: Text = Field("", description="older clients' name for 'model'")
    verbose: bool = False

    @property
    def wanted(self) -> str:
        return self.model or self.name


class OllamaEmbedRequest(_Body):
    model: Text = ""
    input: Text | Annotated[list[Text], Field(min_length=1, max_length=MAX_EMBED_INPUTS)] = Field(
        ..., description="a text or a list of texts"
    )
    truncate: bool | None = Field(None, description="refused when true: too long is a 400")
    options: JSONObject | None = Field(None, description="refused unless empty")
    keep_alive: KeepAliveValue = Field(None, description="as on /api/chat")
    dimensions: int | None = Field(None, description="refused (the model's own size only)")

    @property
    def keep_alive_s(self) -> float | None:
        return keep_alive_seconds(self.keep_alive)

    def texts(self) -> list[str]:
        self.refuse_extras()
        if self.truncate:
            raise unsupported("truncate", "an input longer than the context is refused")
        if self.options:
            raise unsupported("options." + next(iter(self.options)))
        if self.dimensions is not None:
            raise unsupported("dimensions")
        return [self.input] if isinstance(self.input, str) else list(self.input)
