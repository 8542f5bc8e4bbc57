"""What the serving tests share: a reply generated to its end."""

from __future__ import annotations

from typing import Any

from warmstart.runtime.types import Done, Message, Request


def answer(rt: Any, request: Request, wait: bool = False) -> tuple[Message, Done]:
    """``request``'s reply, as the next turn's message (with its tool calls, if any),
    and its ``Done``; ``wait``: then until the runtime is idle, so what the reply
    computed is kept before the next request."""
    parts, done = [], None
    for event in rt.generate(request):
        if isinstance(event, Done):
            done = event
        else:
            parts.append(event.text)
    assert done is not None
    if wait:
        rt.wait_idle()
    return done.reply or Message("assistant", "".join(parts)), done
