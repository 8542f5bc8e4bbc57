"""Responses of the Responses API kept in the session store: read back whole (so a
continuation renders, and keys its cache, as the chain did), forgotten with their
session, and not kept at all where no conversation text is kept."""

from __future__ import annotations

from pathlib import Path

from warmstart.runtime import sqlite
from warmstart.runtime.serving._sessions import MIGRATIONS, SessionBook
from warmstart.runtime.types import Message, StoredResponse, ToolCall

TURNS = (
    Message("user", "Weather in Oslo?"),
    Message("assistant", "Let me look.", tool_calls=(ToolCall("call_1", "weather", "{}"),)),
    Message("tool", '{"sky": "grey"}', tool_call_id="call_1", name="weather"),
    Message("assistant", "Grey skies."),
)


def _kept(response_id: str, session: str = "s1") -> StoredResponse:
    return StoredResponse(response_id, session, True, TURNS, {"id": response_id, "n": [1]}, 5.0)


def test_a_response_is_read_back_whole_after_reopening(tmp_path: Path) -> None:
    book = SessionBook(tmp_path / "sessions.db")
    try:
        assert book.keep_response(_kept("resp_1"))
        assert book.response("resp_2") is None
    finally:
        book.close()
    reopened = SessionBook(tmp_path / "sessions.db")
    try:
        assert reopened.response("resp_1") == _kept("resp_1")
        assert reopened.delete_response("resp_1")
        assert not reopened.delete_response("resp_1")
        assert reopened.response("resp_1") is None
    finally:
        reopened.close()


def test_deleting_a_session_forgets_its_responses(tmp_path: Path) -> None:
    book = SessionBook(tmp_path / "sessions.db")
    try:
        book.save("s1", TURNS, 10, None, None)
        book.keep_response(_kept("resp_a", "s1"))
        book.keep_response(_kept("resp_b", "s2"))
        assert book.delete("s1")
        assert book.response("resp_a") is None
        assert book.response("resp_b") is not None
    finally:
        book.close()


def test_without_history_nothing_is_kept(tmp_path: Path) -> None:
    book = SessionBook(tmp_path / "sessions.db", keep_text=False)
    try:
        assert not book.keep_response(_kept("resp_1"))
        assert book.response("resp_1") is None
    finally:
        book.close()


def test_a_database_from_before_gets_the_responses_table(tmp_path: Path) -> None:
    path = tmp_path / "sessions.db"
    names = [name for name, _ in MIGRATIONS]
    # as the release before the responses table wrote it
    old = sqlite.connect(path, MIGRATIONS[: names.index("0003_responses")])
    old.execute("INSERT INTO sessions (id, title, created, updated) VALUES ('s0', 't', 1, 1)")
    old.close()
    book = SessionBook(path)
    try:
        assert book.get("s0") is not None
        assert book.keep_response(_kept("resp_1"))
    finally:
        book.close()
