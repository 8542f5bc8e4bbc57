"""Tools (function calling): how a request's tools reach the model, how a forced call
is constrained, and how the model's output is read back as tool calls.

Two ways, chosen by the model's chat template:

- native: the template knows tools (it reads ``tools`` and writes ``tool_calls``), in
  one of the call formats parsed here: Hermes/Qwen2.5 (``<tool_call>{...}</tool_call>``)
  or Llama 3.x (a bare JSON object). The template renders the tools, the calls and
  the results itself, as in llama.cpp's ``--jinja`` mode.
- generic: any other template (SmolLM2's ChatML has no tools). The idea of llama.cpp's
  "generic" format: the tools are described in the system message, the reply is one
  JSON object, ``{"tool_calls": [...]}`` or ``{"response": "..."}``, held to that shape
  (and each call's arguments to its tool's schema) by a grammar, and past calls and
  results are written into the turns as that same JSON. Everything tool-related is
  then message content, which the template and the tokenizer keep as plain text.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal

from ..errors import RequestError
from ..types import Message, Request, Tool, ToolCall
from ._grammars import check_grammar_text, check_schema

if TYPE_CHECKING:
    from ._prompter import Part, Template

Format = Literal["generic", "hermes", "llama3"]

_HERMES_CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)


def detect_format(source: str | None) -> Format:
    """The call format a chat template speaks natively, else "generic"."""
    if not source or "tools" not in source:
        return "generic"
    if "<tool_call>" in source and "tool_calls" in source:
        return "hermes"
    if "<|python_tag|>" in source or ("ipython" in source and "tool_calls" in source):
        return "llama3"
    return "generic"


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def _loads(text: str) -> Any:
    """JSON text -> value; None where it is not JSON. Grammars let raw control
    characters into strings, hence strict=False."""
    try:
        return json.loads(text, strict=False)
    except ValueError:
        return None


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _schema(tool: Tool) -> dict[str, Any]:
    schema = _loads(tool.parameters)
    return schema if isinstance(schema, dict) and schema else {"type": "object"}


def arguments_value(arguments: str) -> Any:
    """A call's arguments as templates expect them: an object where the text is one."""
    value = _loads(arguments)
    return value if isinstance(value, dict) else arguments


def _call(name: Any, arguments: Any) -> ToolCall | None:
    if not isinstance(name, str) or not name:
        return None
    if arguments is None:
        arguments = {}
    text = arguments if isinstance(arguments, str) else _dumps(arguments)
    return ToolCall(new_call_id(), name, text)


# reading the output back --------------------------------------------------------------


def parse_generic(text: str) -> Message:
    """``{"tool_calls": [{"name", "arguments"}]}`` or ``{"response": "..."}``. Output
    cut short by max_tokens keeps the calls it completed; any other output is text."""
    value = _loads(text.strip())
    if not isinstance(value, dict):
        calls = _complete_calls(text)
        return Message("assistant", "" if calls else text, tool_calls=calls)
    items = value.get("tool_calls")
    if isinstance(value.get("tool_call"), dict):
        items = [value["tool_call"]]
    found = _calls_of(items if isinstance(items, list) else [])
    response = value.get("response")
    if not found and not isinstance(response, str):
        return Message("assistant", text)
    content = response if isinstance(response, str) else ""
    return Message("assistant", content, tool_calls=found)


def _calls_of(items: list[Any]) -> tuple[ToolCall, ...]:
    """The calls among ``items``; a call repeated with the same arguments is made once
    (small models repeat one until max_tokens)."""
    seen: set[tuple[Any, str]] = set()
    calls = []
    for item in items:
        if not isinstance(item, dict):
            continue
        call = _call(item.get("name"), item.get("arguments"))
        if call is not None and (call.name, call.arguments) not in seen:
            seen.add((call.name, call.arguments))
            calls.append(call)
    return tuple(calls)


def _complete_calls(text: str) -> tuple[ToolCall, ...]:
    """The whole call objects at the start of a ``{"tool_calls": [`` cut short."""
    head = re.match(r'\s*\{\s*"tool_calls"\s*:\s*\[\s*', text)
    if head is None:
        return ()
    decoder = json.JSONDecoder(strict=False)
    items, at = [], head.end()
    while True:
        try:
            item, at = decoder.raw_decode(text, at)
        except ValueError:
            break
        items.append(item)
        comma = re.match(r"\s*,\s*", text[at:])
        if comma is None:
            break
        at += comma.end()
    return _calls_of(items)


def parse_hermes(text: str) -> Message:
    """``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks, anywhere in
    the text; the text around them is the content."""
    calls: list[ToolCall] = []
    for match in _HERMES_CALL.finditer(text):
        value = _loads(match.group(1))
        call = _call(value.get("name"), value.get("arguments")) if isinstance(value, dict) else None
        if call is not None:
            calls.append(call)
    if not calls:
        return Message("assistant", text)
    content = _HERMES_CALL.sub("", text).strip()
    return Message("assistant", content, tool_calls=tuple(calls))


def parse_llama3(text: str) -> Message:
    """Llama 3.x: the reply is one JSON object ``{"name", "parameters"}`` (after an
    optional ``<|python_tag|>``); calls separated by ``;`` are read too."""
    body = text.strip().removeprefix("<|python_tag|>").strip()
    calls: list[ToolCall] = []
    for piece in body.split(";") if body.startswith("{") else ():
        value = _loads(piece.strip())
        if not isinstance(value, dict):
            return Message("assistant", text)
        args = value.get("parameters", value.get("arguments"))
        call = _call(value.get("name"), args)
        if call is None:
            return Message("assistant", text)
        calls.append(call)
    if not calls:
        return Message("assistant", text)
    return Message("assistant", "", tool_calls=tuple(calls))


PARSERS = {"generic": parse_generic, "hermes": parse_hermes, "llama3": parse_llama3}


# the plan of one request -------------------------------------------------------------------


@dataclass(frozen=True)
class ToolPlan:
    """How one request's tools and tool turns are rendered, constrained and read."""

    format: Format
    messages: tuple[Message, ...]  # what the template renders
    tools: list[dict[str, Any]] | None  # the template's ``tools`` (native formats)
    request: Request

    @property
    def active(self) -> bool:
        """Is the reply read back as tool calls (not returned as raw text)?"""
        return self.request.uses_tools

    def offered(self) -> tuple[Tool, ...]:
        """The tools the model may call under the request's tool_choice."""
        choice = self.request.tool_choice
        if choice == "none":
            return ()
        if choice in ("auto", "required"):
            return self.request.tools
        return tuple(t for t in self.request.tools if t.name == choice)

    def forced(self) -> bool:
        return self.active and self.request.tool_choice not in ("auto", "none")

    def grammar(self) -> str | None:
        """The GBNF the reply must match: in the generic format always (one JSON
        object, of the shapes tool_choice allows), in a native one only where a call
        is forced (else the model may answer in text)."""
        if not self.active:
            return None
        if self.format == "generic":
            return _gbnf(self._generic_schema())
        if not self.forced():
            return None
        if self.format == "llama3":
            items = [_call_schema(t, "parameters") for t in self.offered()]
            return _gbnf(_any_of(items))
        items = [_call_schema(t, "arguments") for t in self.offered()]
        call = _gbnf(_any_of(items))
        call = re.sub(r"^root ::=", "tool-call-json ::=", call, flags=re.MULTILINE)
        one = r'"<tool_call>\n" tool-call-json "\n</tool_call>"'
        more = f' ("\\n" {one})*' if self.request.parallel_tool_calls else ""
        return f"root ::= {one}{more}\n{call}"

    def _generic_schema(self) -> dict[str, Any]:
        calls: dict[str, Any] = {
            "type": "array",
            "items": _any_of([_call_schema(t, "arguments") for t in self.offered()]),
            "minItems": 1,
        }
        if not self.request.parallel_tool_calls:
            calls["maxItems"] = 1
        call = _object({"tool_calls": calls})
        answer = _object({"response": {"type": "string"}})
        if self.request.tool_choice == "none":
            return answer
        if self.forced():
            return call
        return {"anyOf": [call, answer]}

    def parse(self, text: str) -> Message:
        if self.format != "generic" and self.request.tool_choice == "none":
            return Message("assistant", text)  # the template was given no tools
        return PARSERS[self.format](text)


def _gbnf(schema: dict[str, Any]) -> str:
    """llama-cpp-python's JSON schema -> GBNF converter; a schema it cannot convert
    is the client's error. Imported here: the rest of this module is pure, and the
    fake runtime uses it without a model. Each tool's schema was bounded in plan();
    the grammar of them all is bounded here, before llama.cpp sees it."""
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    try:
        grammar = str(json_schema_to_gbnf(_dumps(schema)))
    except Exception as exc:  # the converter raises bare ValueError/KeyError/... on bad input
        raise RequestError(f"a tool's parameters schema cannot be used: {exc!r}", "tools") from exc
    check_grammar_text(grammar, "tools")
    return grammar


def check_schemas(request: Request) -> None:
    """Every tool's parameters within the grammar limits, named by their path."""
    for i, tool in enumerate(request.tools):
        check_schema(_schema(tool), "tools", f"tools[{i}].function.parameters")


def _object(properties: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": list(properties)}


def _any_of(schemas: list[dict[str, Any]]) -> dict[str, Any]:
    return schemas[0] if len(schemas) == 1 else {"anyOf": schemas}


def _call_schema(tool: Tool, arguments_key: str) -> dict[str, Any]:
    return _object({"name": {"const": tool.name}, arguments_key: _schema(tool)})


def check_choice(request: Request) -> None:
    """tool_choice must name one of the tools; a forced call needs tools at all."""
    choice = request.tool_choice
    if choice in ("auto", "none"):
        return
    if not request.tools:
        raise RequestError(f"tool_choice is {choice!r} but the request has no tools", "tool_choice")
    if choice != "required" and choice not in {t.name for t in request.tools}:
        message = f"tool_choice names the function {choice!r}, which is not one of the tools"
        raise RequestError(message, "tool_choice")


def has_tool_turns(messages: tuple[Message, ...]) -> bool:
    return any(m.role == "tool" or m.tool_calls for m in messages)


def plan(request: Request, fmt: Format) -> ToolPlan | None:
    """The plan for a request with tools or tool turns; None for any other (whose
    rendering stays exactly what it was)."""
    check_choice(request)
    if not request.tools and not has_tool_turns(request.messages):
        return None
    check_schemas(request)
    if fmt != "generic":
        offered = request.tools if request.tool_choice != "none" else ()
        tools = [_native_tool(t) for t in offered]
        return ToolPlan(fmt, request.messages, tools or None, request)
    draft = ToolPlan(fmt, request.messages, None, request)
    messages = _generic_turns(request.messages, wrap_replies=draft.active)
    if draft.active:
        messages = _with_system(messages, _generic_instructions(draft))
    return replace(draft, messages=messages)


def _native_tool(tool: Tool) -> dict[str, Any]:
    function: dict[str, Any] = {"name": tool.name}
    if tool.description:
        function["description"] = tool.description
    function["parameters"] = _schema(tool)
    return {"type": "function", "function": function}


def _generic_instructions(draft: ToolPlan) -> str:
    """The same text whatever tool_choice says (the grammar enforces that), so every
    turn of a conversation shares this prefix, and its cache."""
    listed = [
        {"name": t.name, "description": t.description, "parameters": _schema(t)}
        for t in draft.request.tools
    ]
    call = '{"tool_calls": [{"name": "<tool name>", "arguments": {<its arguments>}}]}'
    answer = (
        f"Reply with one JSON object and nothing else: {call} to call tools, or "
        '{"response": "<your answer>"} to answer the user.'
    )
    return f"You can call these tools:\n{_dumps(listed)}\n{answer}"


def _with_system(messages: tuple[Message, ...], text: str) -> tuple[Message, ...]:
    """The tool instructions after the system prompt (a shared prefix stays shared)."""
    if messages and messages[0].role == "system":
        first = messages[0]
        return (replace(first, content=f"{first.content}\n\n{text}"), *messages[1:])
    return (Message("system", text), *messages)


def _generic_turns(messages: tuple[Message, ...], wrap_replies: bool) -> tuple[Message, ...]:
    """Calls and results as the JSON the generic format speaks, in roles every
    template renders (a result becomes a user turn)."""
    names = {c.id: c.name for m in messages for c in m.tool_calls}
    out: list[Message] = []
    for m in messages:
        if m.role == "tool":
            result = _loads(m.content)
            response = {
                "name": m.name or names.get(m.tool_call_id or "", ""),
                "tool_call_id": m.tool_call_id or "",
                "content": m.content if result is None else result,
            }
            out.append(Message("user", _dumps({"tool_response": response})))
        elif m.role == "assistant" and m.tool_calls:
            calls = [
                {"name": c.name, "arguments": arguments_value(c.arguments)} for c in m.tool_calls
            ]
            body: dict[str, Any] = {"tool_calls": calls}
            if m.content:
                body["response"] = m.content
            out.append(Message("assistant", _dumps(body)))
        elif m.role == "assistant" and wrap_replies:
            out.append(Message("assistant", _dumps({"response": m.content})))
        else:
            out.append(m)
    return tuple(out)


def render_parts(
    template: Template,
    plan: ToolPlan | None,
    messages: tuple[Message, ...],
    generation: bool = True,
) -> list[Part]:
    """The prompt's parts, rendered as the plan says. A template that refuses even the
    generic turns (plain system, user and assistant messages) is a clear 400: the
    model's template has no tool support."""
    tools = plan.tools if plan else None
    try:
        return template.render_parts(messages, add_generation_prompt=generation, tools=tools)
    except RequestError as exc:
        if plan is None or plan.format != "generic":
            raise
        raise RequestError(
            "this model's chat template has no tool support, and it refused the plain "
            f"turns that describe the tools and calls instead: {exc}",
            param="tools",
        ) from exc
