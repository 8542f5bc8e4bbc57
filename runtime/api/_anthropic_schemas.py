"""Request bodies of Anthropic's Messages API, and their translation to Request.

The same rules as the OpenAI bodies (``_schemas``): strict types, a null is "not
given", and a field or content block warmstart does not implement is a 400 naming
it. Anthropic's blocks map onto the runtime's messages as the chat-completions
route's do, so a conversation finds the same tool machinery and the same cache:
text blocks are joined, a ``tool_use`` block is a ToolCall of its assistant turn,
and a ``tool_result`` block is a ``tool`` message of its own. docs/api.md lists
every field.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BeforeValidator, Field, model_validator
from pydantic_core import PydanticCustomError

from ..engine import json_schema_grammar
from ..errors import RequestError
from ..types import Message, Request, Sampling, Tool, ToolCall
from ._schemas import FUNCTION_NAME, SESSION_ID, JSONObject, Text, _Body, _only

# Anthropic documents no limit; the OpenAI route's four is too few for its clients.
MAX_STOP_SEQUENCES = 16
ID = Annotated[Text, Field(min_length=1, max_length=256)]
_BLOCKS = frozenset({"text", "tool_use", "tool_result"})


def _known_block(value: Any) -> Any:
    """A content block of a type warmstart does not read (image, document, thinking,
    server tools...) is refused by its type, not as a failed union."""
    kind = value.get("type") if isinstance(value, dict) else None
    if isinstance(kind, str) and kind not in _BLOCKS:
        raise PydanticCustomError(
            "unsupported_parameter",
            "content blocks of type '{kind}' are not supported by warmstart "
            "(text, tool_use and tool_result are)",
            {"kind": kind[:64]},
        )
    return value


class CacheControl(_Body):
    """A cache breakpoint. warmstart caches every prompt prefix, so every breakpoint
    is one already; the ttl does not apply (the cache lives while its budget holds it)."""

    type: Literal["ephemeral"]
    ttl: Literal["5m", "1h"] | None = None


class TextBlock(_Body):
    type: Literal["text"]
    text: Text
    cache_control: CacheControl | None = None


class ToolUseBlock(_Body):
    type: Literal["tool_use"]
    id: ID
    name: FUNCTION_NAME
    input: JSONObject
    cache_control: CacheControl | None = None

    def to_call(self) -> ToolCall:
        return ToolCall(self.id, self.name, json.dumps(self.input, ensure_ascii=False))


class ToolResultBlock(_Body):
    type: Literal["tool_result"]
    tool_use_id: ID
    content: Text | Annotated[list[TextBlock], Field(max_length=1024)] = ""
    is_error: bool = False
    cache_control: CacheControl | None = None

    def text(self) -> str:
        content = self.content
        text = content if isinstance(content, str) else "".join(b.text for b in content)
        # the runtime's tool turns have no error flag: the model reads it in the result
        return f"Error: {text}" if self.is_error else text


Block = Annotated[
    TextBlock | ToolUseBlock | ToolResultBlock,
    Field(discriminator="type"),
    BeforeValidator(_known_block),
]
# which blocks each role may carry
_ALLOWED = {
    "user": {"text", "tool_result"},
    "assistant": {"text", "tool_use"},
    "system": {"text"},
}


class AnthropicMessage(_Body):
    # "system" messages: the newest clients send them beside the top-level system
    role: Literal["user", "assistant", "system"]
    content: Text | Annotated[list[Block], Field(min_length=1, max_length=4096)]

    @model_validator(mode="after")
    def _blocks_of_the_role(self) -> AnthropicMessage:
        if isinstance(self.content, list):
            for block in self.content:
                if block.type not in _ALLOWED[self.role]:
                    raise ValueError(f"a {self.role} message cannot carry a {block.type} block")
        return self

    def to_messages(self, names: dict[str, str]) -> list[Message]:
        """The runtime's messages: each tool_result a ``tool`` turn (``names``: tool_use
        id -> function), the text around them user turns, in their order."""
        if isinstance(self.content, str):
            return [Message(self.role, self.content)]
        if self.role != "user":
            text = "".join(b.text for b in self.content if isinstance(b, TextBlock))
            calls = tuple(b.to_call() for b in self.content if isinstance(b, ToolUseBlock))
            return [Message(self.role, text, tool_calls=calls)]
        out: list[Message] = []
        texts: list[str] = []
        for block in self.content:
            if isinstance(block, TextBlock):
                texts.append(block.text)
                continue
            assert isinstance(block, ToolResultBlock)
            if texts:
                out.append(Message("user", "".join(texts)))
                texts = []
            name = names.get(block.tool_use_id)
            out.append(Message("tool", block.text(), tool_call_id=block.tool_use_id, name=name))
        if texts:
            out.append(Message("user", "".join(texts)))
        return out

    def text_chars(self) -> int:
        if isinstance(self.content, str):
            return len(self.content)
        chars = 0
        for block in self.content:
            if isinstance(block, TextBlock):
                chars += len(block.text)
            elif isinstance(block, ToolUseBlock):
                chars += len(block.to_call().arguments)
            else:
                chars += len(block.text())
        return chars


def _custom_only(value: str) -> str:
    if value != "custom":
        raise PydanticCustomError(
            "unsupported_parameter",
            "server tools ('{kind}') are not supported by warmstart; only custom tools are",
            {"kind": value[:64]},
        )
    return value


class AnthropicTool(_Body):
    name: FUNCTION_NAME
    description: Text | None = None
    input_schema: JSONObject = Field(..., description="a JSON schema of the input")
    type: Annotated[Text, AfterValidator(_custom_only)] | None = None
    cache_control: CacheControl | None = None
    # the input always follows the schema (a grammar holds it to it)
    strict: bool | None = None

    def to_tool(self) -> Tool:
        params = json.dumps(self.input_schema, ensure_ascii=False)
        return Tool(self.name, self.description or "", params)


class ToolChoice(_Body):
    type: Literal["auto", "any", "tool", "none"]
    name: FUNCTION_NAME | None = None
    disable_parallel_tool_use: bool | None = None

    @model_validator(mode="after")
    def _name_for_tool(self) -> ToolChoice:
        if (self.type == "tool") != (self.name is not None):
            raise ValueError('name is required with type "tool", and only with it')
        return self

    def runtime_choice(self) -> str:
        """The runtime's tool_choice: auto, none, required, or the function's name."""
        if self.type == "tool":
            assert self.name is not None
            return self.name
        return {"any": "required"}.get(self.type, self.type)


class Metadata(_Body):
    user_id: SESSION_ID | None = Field(None, description="session hint, as OpenAI's user")


class ThinkingDisabled(_Body):
    type: Annotated[Text, _only("disabled")]


class JSONOutputFormat(_Body):
    type: Literal["json_schema"]
    schema_: JSONObject = Field(..., alias="schema", description="a JSON schema of the reply")


class OutputConfig(_Body):
    # the reply is held to the schema by a grammar, as response_format on /v1
    format: JSONOutputFormat | None = None


class _Conversation(_Body):
    """What Messages and count_tokens share: the prompt."""

    model: Annotated[Text, Field(min_length=1, max_length=256)] = Field(
        ..., description="the loaded model's id or 'default'"
    )
    messages: Annotated[list[AnthropicMessage], Field(min_length=1)]
    system: Text | Annotated[list[TextBlock], Field(max_length=1024)] | None = None
    tools: list[AnthropicTool] | None = Field(None, max_length=128)
    tool_choice: ToolChoice | None = None
    thinking: ThinkingDisabled | None = None
    cache_control: CacheControl | None = None
    output_config: OutputConfig | None = None  # shapes the reply only, not the prompt

    def _system_text(self) -> str | None:
        system = self.system
        if system is None or isinstance(system, str):
            return system
        return "".join(b.text for b in system)

    def runtime_messages(self) -> tuple[Message, ...]:
        last = self.messages[-1]
        if last.role == "assistant":
            n = len(self.messages) - 1
            raise RequestError(
                f"messages.{n}: a final assistant message (a prefill for the reply to "
                "continue) is not supported by warmstart",
                param=f"messages.{n}",
            )
        system = self._system_text()
        out = [Message("system", system)] if system is not None else []
        names: dict[str, str] = {}
        for message in self.messages:
            if isinstance(message.content, list):
                names.update((b.id, b.name) for b in message.content if isinstance(b, ToolUseBlock))
            out.extend(message.to_messages(names))
        return tuple(out)

    def text_chars(self) -> int:
        tools = sum(len(t.to_tool().parameters) for t in self.tools or ())
        return sum(m.text_chars() for m in self.messages) + len(self._system_text() or "") + tools

    def _tool_fields(self) -> dict[str, Any]:
        choice = self.tool_choice
        return {
            "tools": tuple(t.to_tool() for t in self.tools or ()),
            "tool_choice": choice.runtime_choice() if choice else "auto",
            # off unless asked for, as on /v1/chat/completions: a small model repeats
            # its call until max_tokens (Anthropic's default is on)
            "parallel_tool_calls": bool(choice and choice.disable_parallel_tool_use is False),
        }


class MessagesRequest(_Conversation):
    """``POST /v1/messages``."""

    max_tokens: int = Field(..., ge=1, le=1_000_000)
    stop_sequences: Annotated[list[Text], Field(max_length=MAX_STOP_SEQUENCES)] | None = None
    stream: bool = False
    # Anthropic's own range, narrower than warmstart's (its clients expect 0 to 1)
    temperature: float = Field(1.0, ge=0.0, le=1.0, allow_inf_nan=False)
    # their bounds are runtime/serving/_admit.py's (check_request)
    top_p: float = Field(1.0, allow_inf_nan=False)
    top_k: int = Field(0, description="0: off")
    metadata: Metadata | None = None

    def to_request(self, session_id: str | None) -> Request:
        sampling = Sampling(
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            max_tokens=self.max_tokens,
            stop=tuple(s for s in self.stop_sequences or () if s),
            grammar=self._grammar(),
        )
        hint = self.metadata.user_id if self.metadata else None
        return Request(
            messages=self.runtime_messages(),
            sampling=sampling,
            session_id=session_id or hint,
            **self._tool_fields(),
        )

    def _grammar(self) -> str | None:
        fmt = self.output_config.format if self.output_config else None
        if fmt is None:
            return None
        return json_schema_grammar(fmt.schema_, "output_config.format.schema")


class CountTokensRequest(_Conversation):
    """``POST /v1/messages/count_tokens``: the prompt a Messages request would make."""

    def to_request(self) -> Request:
        return Request(
            messages=self.runtime_messages(), sampling=Sampling(max_tokens=1), **self._tool_fields()
        )
