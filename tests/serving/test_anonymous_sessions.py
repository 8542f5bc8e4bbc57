"""Requests that name no conversation (plain OpenAI or Ollama clients, curl) are kept for
their cache but left out of the conversation list, which stays the user's chats; they
are listed on request (``anonymous=True``, ``?all=1``, ``sessions list --all``)."""

from __future__ import annotations

from pathlib import Path

from warmstart.runtime import sqlite
from warmstart.runtime.engine._fake import FakeOptions
from warmstart.runtime.serving._sessions import MIGRATIONS, SessionBook, derived_session_id
from warmstart.runtime.types import Message, Request

from tests.conftest import fake_runtime

HI = (Message("user", "Hi"),)


def test_the_book_lists_named_sessions_unless_asked_for_all(tmp_path: Path) -> None:
    book = SessionBook(tmp_path / "sessions.db")
    try:
        anonymous = derived_session_id(HI)
        assert anonymous is not None
        book.save(anonymous, HI, 3, None, None, anonymous=True)
        book.save("trip", (Message("user", "Plan a trip"),), 4, None, None)
        assert [r.id for r in book.list(anonymous=False)] == ["trip"]
        assert {r.id for r in book.list()} == {"trip", anonymous}  # the store's own view
        assert book.get(anonymous) is not None and book.get(anonymous).anonymous  # type: ignore[union-attr]
        assert [r.id for r in book.list(search="Hi", anonymous=False)] == []
        # a turn that names it (chat --session ID) makes it one of the user's for good
        book.save(anonymous, HI, 5, None, None, anonymous=False)
        book.save(anonymous, HI, 6, None, None, anonymous=True)
        assert {r.id for r in book.list(anonymous=False)} == {"trip", anonymous}
    finally:
        book.close()


def test_rows_from_before_are_sorted_out_by_their_ids(tmp_path: Path) -> None:
    """A database written before the column existed: derived ids ("c" and 12 hex
    digits) were requests without a session id; the others stay listed."""
    path = tmp_path / "sessions.db"
    db = sqlite.connect(path, MIGRATIONS[:1])  # the schema as it shipped before
    db.executescript(
        "INSERT INTO sessions (id, title, created, updated) VALUES "
        "('c0123456789ab', 'Hi', 1, 1), ('4ecb1d2e3f40', 'Rome', 2, 2), "
        "('chat-with-mum', 'Mum', 3, 3), ('c0123456789abc', 'longer', 4, 4);"
    )
    db.close()
    book = SessionBook(path)
    try:
        listed = [r.id for r in book.list(anonymous=False)]
        assert listed == ["c0123456789abc", "chat-with-mum", "4ecb1d2e3f40"]
        assert len(book.list()) == 4
    finally:
        book.close()


def test_the_runtime_keeps_the_same_rule(tmp_path: Path) -> None:
    rt = fake_runtime(tmp_path, FakeOptions(prefill_delay=0.0))
    try:
        rt.generate(Request(messages=HI)).text()
        rt.generate(Request(messages=(Message("user", "Plan a trip"),), session_id="trip")).text()
        assert [s.id for s in rt.sessions()] == ["trip"]
        everything = rt.sessions(anonymous=True)
        assert len(everything) == 2 and sum(s.anonymous for s in everything) == 1
    finally:
        rt.close()


def test_a_listing_sees_an_import_whole_or_not_at_all(tmp_path: Path) -> None:
    """The app hands its old conversations over in one import: a listing meanwhile (the
    app's own, refreshing) showed half of them, one chat without the other."""
    import threading

    from warmstart.runtime.types import SessionInfo

    book = SessionBook(tmp_path / "sessions.db")
    rows = [SessionInfo(f"old-{i}", f"Chat {i}", 1.0, 2.0, 0, {}, HI) for i in range(300)]
    seen: list[int] = []
    done = threading.Event()

    def listing() -> None:
        while not done.is_set():
            seen.append(sum(r.id.startswith("old-") for r in book.list()))

    reader = threading.Thread(target=listing)
    reader.start()
    try:
        assert book.import_(rows) == (True,) * len(rows)
    finally:
        done.set()
        reader.join()
        book.close()
    assert set(seen) <= {0, len(rows)}
