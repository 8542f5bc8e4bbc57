"""A conversation with tool turns is kept whole by the session store: read back, it
equals what was saved, so it renders (and keys its cache) the same."""

from __future__ import annotations

from pathlib import Path

from warmstart.runtime.serving._sessions import SessionBook
from warmstart.runtime.types import Message, ToolCall

TURNS = (
    Message("system", "Be brief."),
    Message("user", "Weather in Oslo?"),
    Message("assistant", "", tool_calls=(ToolCall("call_1", "get_weather", '{"city": "Oslo"}'),)),
    Message("tool", '{"sky": "grey"}', tool_call_id="call_1", name="get_weather"),
    Message("assistant", "Grey skies.", interrupted=True),
)


def test_tool_turns_survive_the_store(tmp_path: Path) -> None:
    book = SessionBook(tmp_path / "sessions.db")
    try:
        book.save("s1", TURNS, 42, None, None)
        row = book.get("s1")
    finally:
        book.close()
    assert row is not None and row.messages == TURNS
    reopened = SessionBook(tmp_path / "sessions.db")
    try:
        again = reopened.get("s1")
    finally:
        reopened.close()
    assert again is not None and again.messages == TURNS
