"""Tools on /api/chat in Ollama's shapes, translated to and from the runtime's.

Ollama's tools are OpenAI's (``{"type": "function", "function": {name, description,
parameters}}``); its calls carry ``arguments`` as a JSON object (OpenAI: as text)
and may lack an ``id``; a result is a ``role: "tool"`` message naming the function
in ``tool_name`` (``tool_call_id`` where a client sends one). Everything after the
translation is the machinery /v1 uses: the tool plan of runtime/engine/_tools.py
(a native template, or the generic grammar-held JSON format), the same parsing of
the model's output, the same cache.
"""

from __future__ import annotations

import hashlib
import json
from typing import Annotated, Any, Literal

from pydantic import Field

from ..engine import arguments_value
from ..types import Tool, ToolCall
from ._ollama_body import Body
from ._schemas import FUNCTION_NAME, JSONObject, Text

CALL_ID = Annotated[Text, Field(min_length=1, max_length=256)]


class OllamaFunction(Body):
    name: FUNCTION_NAME
    description: Text | None = None
    parameters: JSONObject | None = Field(None, description="a JSON schema of the arguments")


class OllamaTool(Body):
    type: Literal["function"] = "function"
    function: OllamaFunction

    def to_tool(self, index: int) -> Tool:
        self.refuse_extras(f"tools.{index}.")
        f = self.function
        f.refuse_extras(f"tools.{index}.function.")
        params = json.dumps(f.parameters or {"type": "object"}, ensure_ascii=False)
        return Tool(f.name, f.description or "", params)

    def schema_chars(self) -> int:
        return len(json.dumps(self.function.parameters or {}, ensure_ascii=False))


class CalledFunction(Body):
    name: FUNCTION_NAME
    # an object in Ollama's shape; a JSON text (OpenAI's) is taken as well
    arguments: JSONObject | Text = Field(default_factory=dict)
    index: int | None = Field(None, ge=0, le=1024, description="the call's place in the reply")


class OllamaToolCall(Body):
    id: CALL_ID | None = None
    type: Literal["function"] | None = None
    function: CalledFunction

    def arguments_text(self) -> str:
        args = self.function.arguments
        return args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)


def call_of(call: OllamaToolCall, where: str) -> ToolCall:
    """A call an assistant turn carries back. Without an id (Ollama's own clients send
    none) it gets one derived from the call itself, so the same history renders the
    same prompt on every request, and finds its cache."""
    call.refuse_extras(where + ".")
    call.function.refuse_extras(where + ".function.")
    name, arguments = call.function.name, call.arguments_text()
    if call.id is not None:
        return ToolCall(call.id, name, arguments)
    digest = hashlib.blake2b(f"{where}\0{name}\0{arguments}".encode(), digest_size=12)
    return ToolCall("call_" + digest.hexdigest(), name, arguments)


def tool_calls_json(calls: tuple[ToolCall, ...]) -> list[dict[str, Any]]:
    """A reply's calls in Ollama's shape: arguments as an object."""
    return [
        {
            "id": c.id,
            "function": {"index": i, "name": c.name, "arguments": arguments_value(c.arguments)},
        }
        for i, c in enumerate(calls)
    ]
