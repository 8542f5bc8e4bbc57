"""Request bodies of the OpenAI-compatible endpoints, and their translation to Request.

Types are strict (a string where a number belongs is a 400, not a guess). Fields
that OpenAI defines but warmstart does not use (``frequency_penalty``, ``logprobs``
...) are ignored, so clients that always send them keep working.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from ..errors import RequestError
from ..types import Message, Request, Sampling, Tool, ToolCall

# Requests without max_tokens get at most this many, and never more than fits.
DEFAULT_MAX_TOKENS = 512


def _valid_unicode(value: str) -> str:
    """JSON may carry lone surrogates (\\ud800) that no UTF-8 encoder accepts; the
    tokenizer would fail on them far from here, so they are a 400 naming the field."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(
            f"contains a lone surrogate (U+{ord(value[exc.start]):04X}) at character "
            f"{exc.start}, which is not valid Unicode text"
        ) from None
    return value


# Every string a client sends is checked, so none can fail later as a 500.
Text = Annotated[str, AfterValidator(_valid_unicode)]
SESSION_ID = Annotated[Text, Field(min_length=1, max_length=256)]


class _Body(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class TextPart(_Body):
    type: Literal["text"]
    text: Text


def _plain_json(value: Any) -> Any:
    """JSON a client sent inside a field, checked like every string (see Text)."""
    _valid_unicode(json.dumps(value, ensure_ascii=False))
    return value


JSONObject = Annotated[dict[str, Any], AfterValidator(_plain_json)]
FUNCTION_NAME = Annotated[Text, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.\-]+$")]


class CalledFunction(_Body):
    name: FUNCTION_NAME
    arguments: Text = Field(..., description="the arguments, a JSON object as text")


class ToolCallIn(_Body):
    id: Annotated[Text, Field(min_length=1, max_length=256)]
    type: Literal["function"] = "function"
    function: CalledFunction


class ChatMessage(_Body):
    # "developer" is what newer OpenAI clients send for the system prompt.
    role: Literal["system", "developer", "user", "assistant", "tool"]
    # declared before content, which is checked against it
    tool_calls: list[ToolCallIn] | None = Field(None, max_length=128)
    # Null only on an assistant turn that calls tools; any other turn without text is
    # a client error, not an empty turn.
    content: Text | list[TextPart] | None = Field(...)
    tool_call_id: Annotated[Text, Field(min_length=1, max_length=256)] | None = Field(
        None, validate_default=True, description="on a tool message: the call it answers"
    )
    name: Annotated[Text, Field(min_length=1, max_length=256)] | None = None

    @field_validator("tool_call_id")
    @classmethod
    def _answers_a_call(cls, value: object, info: ValidationInfo) -> object:
        if value is None and info.data.get("role") == "tool":
            raise ValueError("a tool message needs the tool_call_id of the call it answers")
        return value

    @field_validator("content")
    @classmethod
    def _content_or_calls(cls, value: object, info: ValidationInfo) -> object:
        calls = info.data.get("tool_calls")
        if value is None and not (info.data.get("role") == "assistant" and calls):
            raise ValueError("content may be null only on an assistant message with tool_calls")
        return value

    @model_validator(mode="after")
    def _turn_shape(self) -> ChatMessage:
        if self.tool_calls and self.role != "assistant":
            raise ValueError("only an assistant message may carry tool_calls")
        return self

    def to_message(self) -> Message:
        content = self.content or ""
        if isinstance(content, list):
            content = "".join(part.text for part in content)
        role = "system" if self.role == "developer" else self.role
        calls = tuple(
            ToolCall(c.id, c.function.name, c.function.arguments) for c in self.tool_calls or ()
        )
        name = self.name if role == "tool" else None
        return Message(
            role=role, content=content, tool_calls=calls, tool_call_id=self.tool_call_id, name=name
        )

    def text_chars(self) -> int:
        calls = sum(len(c.function.arguments) for c in self.tool_calls or ())
        return len(self.to_message().content) + calls


class FunctionDef(_Body):
    name: FUNCTION_NAME
    description: Text | None = None
    parameters: JSONObject | None = Field(None, description="a JSON schema of the arguments")
    # the arguments always follow the schema (a grammar holds them to it)
    strict: bool | None = None


class ToolDef(_Body):
    type: Literal["function"]
    function: FunctionDef

    def to_tool(self) -> Tool:
        f = self.function
        params = json.dumps(f.parameters or {"type": "object"}, ensure_ascii=False)
        return Tool(f.name, f.description or "", params)


class ChosenFunction(_Body):
    name: FUNCTION_NAME


class NamedToolChoice(_Body):
    type: Literal["function"]
    function: ChosenFunction


class StreamOptions(_Body):
    include_usage: bool = False


class _Sampled(_Body):
    """The sampling fields shared by chat and raw completions."""

    model: Text | None = Field(None, description="the loaded model's id or 'default'")
    temperature: float = Field(1.0, ge=0.0, le=2.0, allow_inf_nan=False)
    top_p: float = Field(1.0, ge=0.0, le=1.0, allow_inf_nan=False)
    max_tokens: int | None = Field(None, ge=1, le=1_000_000)
    max_completion_tokens: int | None = Field(None, ge=1, le=1_000_000)
    stop: Text | Annotated[list[Text], Field(max_length=4)] | None = None
    seed: int | None = Field(None, ge=-(2**63), le=2**64 - 1)
    n: int = Field(1, ge=1, le=1, description="only one choice is supported")
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: SESSION_ID | None = Field(None, description="session hint (X-Warmstart-Session wins)")

    def sampling(self, max_tokens: int) -> Sampling:
        stops = [self.stop] if isinstance(self.stop, str) else (self.stop or [])
        return Sampling(
            temperature=self.temperature,
            top_p=self.top_p,
            # llama.cpp seeds are 32-bit; any integer a client sends maps onto one.
            seed=None if self.seed is None else self.seed % 2**32,
            max_tokens=max_tokens,
            stop=tuple(s for s in stops if s),
        )

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class ChatCompletionRequest(_Sampled):
    messages: list[ChatMessage] = Field(..., description="the conversation, oldest first")
    tools: list[ToolDef] | None = Field(None, max_length=128, description="functions to call")
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = Field(
        None, description="auto (the default with tools), none, required, or one function"
    )
    parallel_tool_calls: bool | None = Field(
        None, description="allow several calls in one reply (off unless true, as in llama.cpp)"
    )

    def text_chars(self) -> int:
        tools = sum(len(t.to_tool().parameters) for t in self.tools or ())
        return sum(m.text_chars() for m in self.messages) + tools

    def to_request(self, session_id: str | None, max_tokens: int) -> Request:
        if not self.messages:
            raise RequestError("messages must contain at least one message", "messages")
        choice = self.tool_choice
        return Request(
            messages=tuple(m.to_message() for m in self.messages),
            sampling=self.sampling(max_tokens),
            session_id=session_id or self.user,
            tools=tuple(t.to_tool() for t in self.tools or ()),
            tool_choice=(choice.function.name if isinstance(choice, NamedToolChoice) else choice)
            or "auto",
            parallel_tool_calls=bool(self.parallel_tool_calls),
        )


class CompletionRequest(_Sampled):
    prompt: Text | Annotated[list[Text], Field(min_length=1, max_length=1)] = Field(
        ..., description="the text to continue (a list holding one string is accepted)"
    )

    def text_chars(self) -> int:
        return len(self.prompt if isinstance(self.prompt, str) else self.prompt[0])

    def to_request(self, session_id: str | None, max_tokens: int) -> Request:
        prompt = self.prompt if isinstance(self.prompt, str) else self.prompt[0]
        if not prompt:
            raise RequestError("prompt must not be empty", "prompt")
        return Request(
            prompt=prompt,
            sampling=self.sampling(max_tokens),
            session_id=session_id or self.user,
        )


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    """Every 4xx and 5xx body, in OpenAI's shape."""

    error: ErrorDetail


class PrewarmResult(BaseModel):
    session_id: str
    promoted_tokens: int
