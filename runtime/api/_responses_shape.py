"""The shapes of Responses API replies: the ``response`` object, its output items
(``message`` with ``output_text``, ``function_call``), its usage, and the streamed
events (``response.created`` ... ``response.completed``) as OpenAI's clients parse
them, with warmstart's cache report in ``x_warmstart``."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..types import Message, Report


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def usage(report: Report) -> dict[str, Any]:
    """The Responses API's usage; cached_tokens counts prompt tokens restored from any
    tier (so a chain of responses shows its cache from the second request on)."""
    return {
        "input_tokens": report.prompt_tokens,
        "input_tokens_details": {"cached_tokens": report.cached_tokens},
        "output_tokens": report.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": report.prompt_tokens + report.completion_tokens,
    }


def output_text(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": []}


def message_item(item_id: str, text: str | None, status: str) -> dict[str, Any]:
    """An assistant message item; ``text`` None: the item as first announced, empty."""
    content = [] if text is None else [output_text(text)]
    return {
        "id": item_id,
        "type": "message",
        "status": status,
        "role": "assistant",
        "content": content,
    }


def call_item(call_id: str, name: str, arguments: str, status: str) -> dict[str, Any]:
    return {
        "id": "fc_" + call_id.removeprefix("call_"),
        "type": "function_call",
        "status": status,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
    }


@dataclass
class ResponseShape:
    """Builds the bodies of one response. ``echo``: the request's settings as the
    response object repeats them (instructions, tools, temperature, ...)."""

    model: str
    echo: dict[str, Any]
    id: str = field(default_factory=lambda: new_id("resp"))
    message_id: str = field(default_factory=lambda: new_id("msg"))
    created: int = field(default_factory=lambda: int(time.time()))

    def status(self, report: Report) -> str:
        return "incomplete" if report.finish_reason == "length" else "completed"

    def body(
        self, status: str, output: list[dict[str, Any]], report: Report | None
    ) -> dict[str, Any]:
        """The response object; ``report`` None while it is in progress."""
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        out: dict[str, Any] = {
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "error": None,
            "incomplete_details": incomplete,
            "model": self.model,
            "output": output,
            **self.echo,
            "usage": None if report is None else usage(report),
        }
        if report is not None:
            out["x_warmstart"] = report.as_dict()
        return out

    def output(self, text: str, report: Report, reply: Message | None) -> list[dict[str, Any]]:
        """The output items: the reply's text (when any, or when it is all there is),
        then one item per tool call."""
        status = self.status(report)
        turn = reply or Message("assistant", text)
        items = []
        if turn.content or not turn.tool_calls:
            items.append(message_item(self.message_id, turn.content, status))
        items += [call_item(c.id, c.name, c.arguments, "completed") for c in turn.tool_calls]
        return items

    def whole(self, text: str, report: Report, reply: Message | None) -> dict[str, Any]:
        return self.body(self.status(report), self.output(text, report, reply), report)


@dataclass
class Events:
    """The streamed events of one response, numbered as OpenAI numbers them."""

    shape: ResponseShape
    _seq: int = 0

    def event(self, kind: str, **data: Any) -> dict[str, Any]:
        out = {"type": kind, "sequence_number": self._seq, **data}
        self._seq += 1
        return out

    def opening(self) -> list[dict[str, Any]]:
        started = self.shape.body("in_progress", [], None)
        return [
            self.event("response.created", response=started),
            self.event("response.in_progress", response=started),
        ]

    def text_opening(self, index: int) -> list[dict[str, Any]]:
        item_id = self.shape.message_id
        return [
            self.event(
                "response.output_item.added",
                output_index=index,
                item=message_item(item_id, None, "in_progress"),
            ),
            self.event(
                "response.content_part.added",
                item_id=item_id,
                output_index=index,
                content_index=0,
                part=output_text(""),
            ),
        ]

    def delta(self, index: int, text: str) -> dict[str, Any]:
        return self.event(
            "response.output_text.delta",
            item_id=self.shape.message_id,
            output_index=index,
            content_index=0,
            delta=text,
            logprobs=[],
        )

    def text_closing(self, index: int, item: dict[str, Any]) -> list[dict[str, Any]]:
        text = item["content"][0]["text"] if item["content"] else ""
        where = {"item_id": item["id"], "output_index": index, "content_index": 0}
        return [
            self.event("response.output_text.done", **where, text=text, logprobs=[]),
            self.event("response.content_part.done", **where, part=output_text(text)),
            self.event("response.output_item.done", output_index=index, item=item),
        ]

    def call(self, index: int, item: dict[str, Any]) -> list[dict[str, Any]]:
        """A whole tool call: announced, its arguments in one delta, done."""
        where = {"item_id": item["id"], "output_index": index}
        return [
            self.event(
                "response.output_item.added",
                output_index=index,
                item={**item, "status": "in_progress", "arguments": ""},
            ),
            self.event("response.function_call_arguments.delta", **where, delta=item["arguments"]),
            self.event(
                "response.function_call_arguments.done",
                **where,
                name=item["name"],
                arguments=item["arguments"],
            ),
            self.event("response.output_item.done", output_index=index, item=item),
        ]

    def closing(self, body: dict[str, Any]) -> dict[str, Any]:
        kind = "response.incomplete" if body["status"] == "incomplete" else "response.completed"
        return self.event(kind, response=body)

    def failed(self, message: str) -> dict[str, Any]:
        body = self.shape.body("failed", [], None)
        body["error"] = {"code": "server_error", "message": message}
        return self.event("response.failed", response=body)


# Called with the whole response once the reply is done (to keep it); in a worker thread.
Keeper = Callable[[dict[str, Any], str, Report, Message | None], None]
