"""Request bodies of the OpenAI-compatible endpoints, and their translation to Request.

Types are strict (a string where a number belongs is a 400, not a guess), and a
field warmstart does not implement is refused, never ignored: an agent that asked
for something it did not get must hear so. Unknown fields are a 400 with code
``unsupported_parameter`` naming the field (see ``_errors``); fields warmstart knows
but supports only in their neutral value (``store: false``, ``n: 1``, ``echo:
false``) refuse any other value the same way. A null is "not given", so clients
that send every optional field, or echo a reply's message back with ``refusal:
null``, are not refused for that. docs/api.md lists every field.
"""

from __future__ import annotations

import json
import math
from typing import Annotated, Any, Literal, cast

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from ..engine import json_object_grammar, json_schema_grammar
from ..errors import RequestError
from ..serving import MAX_SESSION_ID, SESSION_ID_RULE, session_id_problem
from ..types import Message, Request, Role, Sampling, SessionInfo, Tool, ToolCall

# Requests without max_tokens get at most this many, and never more than fits.
DEFAULT_MAX_TOKENS = 512
MAX_TOP_LOGPROBS = 20
# OpenAI's "-100 should ban the token": a finite -100 does not, on every model
BAN = -100.0


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


def _only(*allowed: object) -> AfterValidator:
    """A field accepted only in the value(s) whose behaviour warmstart has."""

    def check(value: object) -> object:
        if value not in allowed:
            shown = " or ".join(repr(a) for a in allowed)
            raise PydanticCustomError(
                "unsupported_parameter", "warmstart supports only {allowed}", {"allowed": shown}
            )
        return value

    return AfterValidator(check)


# Every string a client sends is checked, so none can fail later as a 500.
def safe_session_id(value: str) -> str:
    """The session id rule (runtime/serving/_sessions.py), as a pydantic validator (a
    400 naming the field)."""
    problem = session_id_problem(value)
    if problem is not None:
        raise ValueError(f"{problem}; {SESSION_ID_RULE}")
    return value


Text = Annotated[str, AfterValidator(_valid_unicode)]
# the bounds are stated in the OpenAPI document and checked with the rest of the rule
SESSION_ID = Annotated[
    Text,
    AfterValidator(safe_session_id),
    Field(json_schema_extra={"minLength": 1, "maxLength": MAX_SESSION_ID}),
]
# value bounds are runtime/serving/_admit.py's (check_request): a schema holds only the JSON shape
Penalty = Annotated[float, Field(allow_inf_nan=False)]


class _Body(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _nulls_are_not_given(cls, data: Any) -> Any:
        # a field sent as null asks for nothing: it gets its default (a required one is
        # then missing), and an unknown one is not refused
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if v is not None}
        return data


class TextPart(_Body):
    type: Literal["text"]
    text: Text


# JSON inside a field may nest this deep: a schema's own limit (grammars), and far
# from Python's recursion limit, which json.dumps/loads of the field meet later
MAX_FIELD_DEPTH = 100


def _plain_json(value: Any) -> Any:
    """JSON a client sent inside a field (a schema, options), every string and key in
    it checked like any Text, its depth bounded. A loop, not json.dumps: as deep as
    the body parser allows must not be a RecursionError (a 500) here."""
    pending = [(value, 0)]
    while pending:
        item, depth = pending.pop()
        if depth > MAX_FIELD_DEPTH:
            raise ValueError(f"nests more than {MAX_FIELD_DEPTH} levels deep")
        if isinstance(item, str):
            _valid_unicode(item)
        elif isinstance(item, dict):
            pending += [(child, depth + 1) for child in (*item, *item.values())]
        elif isinstance(item, list):
            pending += [(child, depth + 1) for child in item]
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
    # "developer" is what newer OpenAI clients send for the system prompt; which
    # roles there are is runtime/serving/_admit.py's rule (check_request), as on /api/chat
    role: Text = Field(..., description="system (or developer), user, assistant or tool")
    # declared before content, which is checked against it
    tool_calls: list[ToolCallIn] | None = Field(None, max_length=128)
    # Null (or absent: a null is "not given") only on an assistant turn that calls
    # tools; any other turn without text is a client error, not an empty turn.
    content: Text | list[TextPart] | None = Field(None, validate_default=True)
    tool_call_id: Annotated[Text, Field(min_length=1, max_length=256)] | None = Field(
        None, validate_default=True, description="on a tool message: the call it answers"
    )
    # on a tool message: the function that answered; a participant's name on other
    # turns is something no chat template here renders, so it is refused, not dropped
    name: Annotated[Text, Field(min_length=1, max_length=256)] | None = None

    @field_validator("name")
    @classmethod
    def _name_on_tool_turns(cls, value: object, info: ValidationInfo) -> object:
        if value is not None and info.data.get("role") != "tool":
            raise PydanticCustomError(
                "unsupported_parameter", "warmstart supports name only on tool messages"
            )
        return value

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
            raise ValueError(
                "content is required (null only on an assistant message with tool_calls)"
            )
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
            role=cast(Role, role),  # checked at admission
            content=content,
            tool_calls=calls,
            tool_call_id=self.tool_call_id,
            name=name,
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
    # OpenAI pads chunks against length side channels; nothing here needs it
    include_obfuscation: Annotated[bool, _only(False)] = False


class TextFormat(_Body):
    type: Literal["text"]


class JSONObjectFormat(_Body):
    type: Literal["json_object"]


class JSONSchemaSpec(_Body):
    name: Text = Field(..., min_length=1, max_length=64)
    description: Text | None = None
    schema_: JSONObject = Field(
        default_factory=dict, alias="schema", description="a JSON schema; {} is any JSON"
    )
    # the grammar holds every reply to the schema, strict or not
    strict: bool | None = None


class JSONSchemaFormat(_Body):
    type: Literal["json_schema"]
    json_schema: JSONSchemaSpec


ResponseFormat = Annotated[
    TextFormat | JSONObjectFormat | JSONSchemaFormat, Field(discriminator="type")
]


class _Sampled(_Body):
    """The sampling fields shared by chat and raw completions."""

    model: Text | None = Field(None, description="the loaded model's id or 'default'")
    temperature: float = Field(1.0, allow_inf_nan=False)
    top_p: float = Field(1.0, allow_inf_nan=False)
    max_tokens: int | None = Field(None, ge=1, le=1_000_000)
    max_completion_tokens: int | None = Field(None, ge=1, le=1_000_000)
    stop: Text | Annotated[list[Text], Field(max_length=4)] | None = None
    seed: int | None = Field(None, ge=-(2**63), le=2**64 - 1)
    n: Annotated[int, _only(1)] = Field(1, description="only one choice is supported")
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: SESSION_ID | None = Field(None, description="session hint (X-Warmstart-Session wins)")
    frequency_penalty: Penalty = 0.0
    presence_penalty: Penalty = 0.0
    logit_bias: Annotated[dict[str, float], Field(max_length=1024)] | None = Field(
        None, description="token id (as a string) -> bias from -100 (ban) to 100"
    )
    # extensions llama.cpp's own server also takes
    top_k: int = Field(0, description="0: off (extension)")
    min_p: float = Field(0.0, allow_inf_nan=False, description="extension")
    repeat_penalty: float = Field(1.0, allow_inf_nan=False, description="1: off (extension)")
    # vLLM's field: only requests with the same salt (and user) share cached prefixes
    cache_salt: Annotated[Text, Field(min_length=1, max_length=256)] | None = Field(
        None, description="only requests with the same salt reuse each other's cached prefix"
    )

    def _top_logprobs(self) -> int | None:
        raise NotImplementedError

    def _grammar(self) -> str | None:
        return None

    def sampling(self, max_tokens: int) -> Sampling:
        stops = [self.stop] if isinstance(self.stop, str) else (self.stop or [])
        return Sampling(
            temperature=self.temperature,
            top_p=self.top_p,
            # llama.cpp seeds are 32-bit; any integer a client sends maps onto one.
            seed=None if self.seed is None else self.seed % 2**32,
            max_tokens=max_tokens,
            stop=tuple(s for s in stops if s),
            grammar=self._grammar(),
            top_k=self.top_k,
            min_p=self.min_p,
            repeat_penalty=self.repeat_penalty,
            frequency_penalty=self.frequency_penalty,
            presence_penalty=self.presence_penalty,
            logit_bias=self._biases(),
            logprobs=self._top_logprobs(),
        )

    def _biases(self) -> tuple[tuple[int, float], ...]:
        out = []
        for key, bias in (self.logit_bias or {}).items():
            if not key.isascii() or not key.isdigit() or not -100.0 <= bias <= 100.0:
                raise RequestError(
                    f"logit_bias: {key!r}: {bias} is not a token id with a bias from -100 to 100",
                    param="logit_bias",
                )
            out.append((int(key), -math.inf if bias <= BAN else bias))
        return tuple(out)

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def session_hint(self) -> str | None:
        return self.user

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
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    response_format: ResponseFormat | None = None
    prompt_cache_key: SESSION_ID | None = Field(
        None, description="session hint, before user (X-Warmstart-Session wins)"
    )
    # OpenAI keeps "stored completions" for its dashboard; warmstart keeps none
    store: Annotated[bool, _only(False)] | None = None
    modalities: Annotated[list[Text], _only(["text"])] | None = None
    _grammar_text: str | None = PrivateAttr(None)

    def _top_logprobs(self) -> int | None:
        if self.top_logprobs is not None and not self.logprobs:
            raise RequestError("top_logprobs needs logprobs: true", param="top_logprobs")
        return (self.top_logprobs or 0) if self.logprobs else None

    def _grammar(self) -> str | None:
        fmt = self.response_format
        if self._grammar_text is None and fmt is not None and not isinstance(fmt, TextFormat):
            self._grammar_text = (
                json_object_grammar()
                if isinstance(fmt, JSONObjectFormat)
                else json_schema_grammar(fmt.json_schema.schema_)
            )
        return self._grammar_text

    def session_hint(self) -> str | None:
        return self.prompt_cache_key or self.user

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
            session_id=session_id or self.session_hint(),
            tools=tuple(t.to_tool() for t in self.tools or ()),
            tool_choice=(choice.function.name if isinstance(choice, NamedToolChoice) else choice)
            or "auto",
            parallel_tool_calls=bool(self.parallel_tool_calls),
            cache_scope=self.cache_salt or "",
        )


class CompletionRequest(_Sampled):
    prompt: Text | Annotated[list[Text], Field(min_length=1, max_length=1)] = Field(
        ..., description="the text to continue (a list holding one string is accepted)"
    )
    logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    echo: Annotated[bool, _only(False)] = False
    best_of: Annotated[int, _only(1)] | None = None

    def _top_logprobs(self) -> int | None:
        return self.logprobs

    @property
    def prompt_text(self) -> str:
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0]

    def text_chars(self) -> int:
        return len(self.prompt_text)

    def to_request(self, session_id: str | None, max_tokens: int) -> Request:
        prompt = self.prompt_text
        if not prompt:
            raise RequestError("prompt must not be empty", "prompt")
        return Request(
            prompt=prompt,
            sampling=self.sampling(max_tokens),
            session_id=session_id or self.session_hint(),
            cache_scope=self.cache_salt or "",
        )


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    """Every 4xx and 5xx body, in OpenAI's shape."""

    error: ErrorDetail


class LoadModelRequest(_Body):
    """``POST /v1/warmstart/models/load``: the installed model to switch to."""

    model: Annotated[Text, Field(min_length=1, max_length=256)]


TITLE = Annotated[Text, Field(max_length=200)]


class SessionPatch(_Body):
    """``PATCH /v1/warmstart/sessions/{id}``: what a client may change."""

    title: Annotated[Text, Field(min_length=1, max_length=200)]


class KeptMessage(_Body):
    role: Literal["system", "user", "assistant"]
    content: Text
    interrupted: bool = False


class KeptSession(_Body):
    """A conversation a client kept itself (the app's old database)."""

    id: SESSION_ID
    title: TITLE = ""
    created: float = Field(ge=0)
    updated: float = Field(ge=0)
    messages: Annotated[list[KeptMessage], Field(max_length=100_000)] = []

    def to_info(self) -> SessionInfo:
        messages = tuple(Message(m.role, m.content, m.interrupted) for m in self.messages)
        return SessionInfo(self.id, self.title, self.created, self.updated, 0, {}, messages)


class SessionImport(_Body):
    """``POST /v1/warmstart/sessions/import``: conversations to add, ids kept."""

    sessions: Annotated[list[KeptSession], Field(max_length=10_000)]
