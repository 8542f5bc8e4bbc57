"""Server-sent events, as OpenAI-compatible servers stream them: ``data: <json>`` lines,
events separated by a blank line, ``data: [DONE]`` at the end."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any

from .errors import ProtocolError

DONE = object()


def iter_sse_data(lines: Iterable[str]) -> Iterator[str]:
    """The ``data`` of each event. Comments (``:``) and other fields are skipped; the
    lines of a multi-line ``data`` are joined with newlines, as the SSE spec says."""
    buf: list[str] = []
    for raw in lines:
        line = raw.rstrip("\r\n")
        if not line:
            if buf:
                yield "\n".join(buf)
                buf = []
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        if name == "data":
            buf.append(value[1:] if value.startswith(" ") else value)
    if buf:
        yield "\n".join(buf)


def iter_sse_json(lines: Iterable[str]) -> Iterator[Any]:
    """Decoded JSON payloads, then :data:`DONE` if the stream said ``[DONE]``."""
    for data in iter_sse_data(lines):
        if data.strip() == "[DONE]":
            yield DONE
            return
        try:
            yield json.loads(data)
        except json.JSONDecodeError as exc:
            raise ProtocolError(f"bad event in the stream: {data[:80]!r}") from exc
