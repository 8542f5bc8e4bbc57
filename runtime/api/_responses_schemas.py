"""The request body of the OpenAI Responses API (``POST /v1/responses``), and its
translation to the runtime's Request.

The same rules as the chat route (see ``_schemas``): strict types, an unknown field
refused by name (``unsupported_parameter``), a null taken as "not given". Input
items become chat messages: an assistant ``message`` item and the ``function_call``
items after it are one assistant turn with tool calls (the shape the runtime reads a
reply back in, so a conversation sent back item by item renders, and hits the
cache, as the chain of stored responses does), a ``function_call_output`` is a
``tool`` turn. docs/api.md lists every field.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Discriminator, Field, PrivateAttr, Tag, field_validator
from pydantic_core import PydanticCustomError

from ..engine import json_object_grammar, json_schema_grammar
from ..errors import RequestError
from ..types import Message, Request, Sampling, Tool, ToolCall
from ._schemas import (
    FUNCTION_NAME,
    SESSION_ID,
    JSONObject,
    Text,
    _Body,
    _only,
)

# Input item and content part types OpenAI has that warmstart does not serve: refused
# by name rather than as an unknown union tag.
_TEXT_PARTS = frozenset({"input_text", "output_text"})
_ITEMS = frozenset({"message", "function_call", "function_call_output"})
ID = Annotated[Text, Field(min_length=1, max_length=256)]


def _refuse_types(value: Any, known: frozenset[str], what: str) -> Any:
    if isinstance(value, list):
        for entry in value:
            kind = entry.get("type") if isinstance(entry, dict) else None
            if isinstance(kind, str) and kind not in known:
                raise PydanticCustomError(
                    "unsupported_parameter",
                    "{what} of type '{kind}' are not supported by warmstart (only {known})",
                    {"what": what, "kind": kind, "known": ", ".join(sorted(known))},
                )
    return value


class InputText(_Body):
    type: Literal["input_text"]
    text: Text


class OutputText(_Body):
    """An earlier reply's text sent back; its annotations and logprobs are part of
    that echo (warmstart writes none), not a request."""

    type: Literal["output_text"]
    text: Text
    annotations: Annotated[list[JSONObject], Field(max_length=1024)] = Field(default_factory=list)
    logprobs: Annotated[list[JSONObject], Field(max_length=100_000)] | None = None


TextPart = Annotated[InputText | OutputText, Field(discriminator="type")]
Status = Literal["completed", "incomplete", "in_progress"]


class MessageItem(_Body):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: Text | Annotated[list[TextPart], Field(max_length=1024)]
    id: ID | None = None  # an earlier output item sent back
    status: Status | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _text_only(cls, value: Any) -> Any:
        return _refuse_types(value, _TEXT_PARTS, "content parts")

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class FunctionCallItem(_Body):
    type: Literal["function_call"]
    call_id: ID
    name: FUNCTION_NAME
    arguments: Text = Field(..., description="the arguments, a JSON object as text")
    id: ID | None = None
    status: Status | None = None


class FunctionCallOutputItem(_Body):
    type: Literal["function_call_output"]
    call_id: ID
    output: Text | Annotated[list[InputText], Field(max_length=1024)]
    id: ID | None = None
    status: Status | None = None

    def text(self) -> str:
        return self.output if isinstance(self.output, str) else "".join(p.text for p in self.output)


def _item_kind(value: Any) -> str:
    """An item's tag: its type (a message's may be left out). Tags are not identifiers,
    so an error's ``param`` names the field (``input.0.content``), not the tag."""
    kind = value.get("type", "message") if isinstance(value, dict) else getattr(value, "type", "")
    return f"{kind} item" if isinstance(kind, str) else ""


InputItem = Annotated[
    Annotated[MessageItem, Tag("message item")]
    | Annotated[FunctionCallItem, Tag("function_call item")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output item")],
    Discriminator(_item_kind),
]


class FunctionTool(_Body):
    type: Literal["function"]
    name: FUNCTION_NAME
    description: Text | None = None
    parameters: JSONObject | None = Field(None, description="a JSON schema of the arguments")
    strict: bool | None = None  # a grammar holds the arguments to the schema anyway

    def to_tool(self) -> Tool:
        params = json.dumps(self.parameters or {"type": "object"}, ensure_ascii=False)
        return Tool(self.name, self.description or "", params)


class ChosenFunction(_Body):
    type: Literal["function"]
    name: FUNCTION_NAME


class TextFormat(_Body):
    type: Literal["text"]


class JSONObjectFormat(_Body):
    type: Literal["json_object"]


class JSONSchemaFormat(_Body):
    type: Literal["json_schema"]
    name: Text = Field(..., min_length=1, max_length=64)
    schema_: JSONObject = Field(default_factory=dict, alias="schema")
    description: Text | None = None
    strict: bool | None = None


class TextConfig(_Body):
    format: Annotated[
        TextFormat | JSONObjectFormat | JSONSchemaFormat, Field(discriminator="type")
    ] = TextFormat(type="text")


class StreamOptions(_Body):
    include_obfuscation: Annotated[bool, _only(False)] = False


class ResponsesRequest(_Body):
    model: Text | None = Field(None, description="the loaded model's id or 'default'")
    input: Annotated[
        Annotated[Text, Tag("a text")]
        | Annotated[list[InputItem], Field(min_length=1, max_length=100_000), Tag("a list")],
        # one arm's errors only: what is wrong in an item, not "not a string" as well
        Discriminator(lambda v: "a text" if isinstance(v, str) else "a list"),
    ] = Field(..., description="a user message, or a list of input items")
    instructions: Text | None = Field(None, description="the system message (not carried on)")
    previous_response_id: ID | None = Field(
        None, description="continue the conversation of a stored response"
    )
    store: bool = Field(True, description="keep the response, to be continued or read back")
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_output_tokens: int | None = Field(None, ge=1, le=1_000_000)
    # their bounds are runtime/serving/_admit.py's (check_request)
    temperature: float = Field(1.0, allow_inf_nan=False)
    top_p: float = Field(1.0, allow_inf_nan=False)
    tools: Annotated[list[FunctionTool], Field(max_length=128)] | None = None
    tool_choice: Literal["none", "auto", "required"] | ChosenFunction | None = None
    parallel_tool_calls: bool | None = Field(
        None, description="allow several calls in one reply (off unless true)"
    )
    text: TextConfig | None = None
    user: SESSION_ID | None = Field(None, description="session hint (X-Warmstart-Session wins)")
    prompt_cache_key: SESSION_ID | None = Field(None, description="session hint, before user")
    metadata: Annotated[dict[Annotated[Text, Field(max_length=64)], Text], Field(max_length=16)] = (
        Field(default_factory=dict, description="kept with the response and repeated in it")
    )
    # what the runtime does to a conversation too long for the context: its earliest
    # turns are left out ("auto"); it cannot refuse instead
    truncation: Annotated[str, _only("auto")] = "auto"
    include: Annotated[list[Text], _only([])] = Field(default_factory=list)
    background: Annotated[bool, _only(False)] = False
    _grammar_text: str | None = PrivateAttr(None)

    @field_validator("input", mode="before")
    @classmethod
    def _known_items(cls, value: Any) -> Any:
        return _refuse_types(value, _ITEMS, "input items")

    @field_validator("tools", mode="before")
    @classmethod
    def _function_tools(cls, value: Any) -> Any:
        return _refuse_types(value, frozenset({"function"}), "tools")

    def items(self) -> list[MessageItem | FunctionCallItem | FunctionCallOutputItem]:
        if isinstance(self.input, str):
            return [MessageItem(role="user", content=self.input)]
        return list(self.input)

    def new_messages(self, earlier: tuple[Message, ...] = ()) -> tuple[Message, ...]:
        """The input items as chat turns, after ``earlier`` (a stored conversation,
        whose calls name the functions its outputs answer)."""
        turns = list(earlier)
        start = len(turns)
        for item in self.items():
            if isinstance(item, FunctionCallItem):
                call = ToolCall(item.call_id, item.name, item.arguments)
                last = turns[-1] if len(turns) > start else None
                if last is not None and last.role == "assistant":  # the same reply's calls
                    turns[-1] = Message(
                        "assistant", last.content, tool_calls=(*last.tool_calls, call)
                    )
                else:
                    turns.append(Message("assistant", "", tool_calls=(call,)))
            elif isinstance(item, FunctionCallOutputItem):
                name = _called(turns, item.call_id)
                turns.append(Message("tool", item.text(), tool_call_id=item.call_id, name=name))
            else:
                role = "system" if item.role == "developer" else item.role
                turns.append(Message(role, item.text()))
        return tuple(turns[start:])

    def grammar(self) -> str | None:
        fmt = self.text.format if self.text else None
        if self._grammar_text is None and fmt is not None and not isinstance(fmt, TextFormat):
            self._grammar_text = (
                json_object_grammar()
                if isinstance(fmt, JSONObjectFormat)
                else json_schema_grammar(fmt.schema_)
            )
        return self._grammar_text

    def sampling(self, max_tokens: int) -> Sampling:
        return Sampling(
            temperature=self.temperature,
            top_p=self.top_p,
            max_tokens=max_tokens,
            grammar=self.grammar(),
        )

    def session_hint(self) -> str | None:
        return self.prompt_cache_key or self.user

    def to_request(
        self, messages: tuple[Message, ...], session_id: str | None, max_tokens: int
    ) -> Request:
        """``messages``: the whole conversation (instructions first, when given)."""
        if not any(m.role != "system" for m in messages):
            raise RequestError("input must hold at least one message or item", "input")
        choice = self.tool_choice
        return Request(
            messages=messages,
            sampling=self.sampling(max_tokens),
            session_id=session_id,
            tools=tuple(t.to_tool() for t in self.tools or ()),
            tool_choice=(choice.name if isinstance(choice, ChosenFunction) else choice) or "auto",
            parallel_tool_calls=bool(self.parallel_tool_calls),
        )


def _called(turns: list[Message], call_id: str) -> str | None:
    for turn in reversed(turns):
        for call in turn.tool_calls:
            if call.id == call_id:
                return call.name
    return None


class DeletedResponse(BaseModel):
    id: str
    object: Literal["response"] = "response"
    deleted: bool = True
