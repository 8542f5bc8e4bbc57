"""Where the app's conversations live: the server's store seen through ServerHistory,
and the app's old database handed over to its local server. No Qt, no HTTP."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from warmstart.app.core.history import (
    IMPORTED_KEY,
    ServerHistory,
    handed_over,
    to_hand_over,
)
from warmstart.app.core.store import DEFAULT_TITLE, ConversationStore
from warmstart.app.core.types import SessionMessage, SessionSummary

from tests.app.fakes import FakeBackend


def summary(sid: str, updated: float, title: str = "", *messages: tuple[str, str]):
    return SessionSummary(
        id=sid,
        title=title,
        updated=updated,
        created=1.0,
        messages=tuple(SessionMessage(r, c) for r, c in messages),
    )


def test_the_list_is_the_servers_plus_drafts_pinned_first() -> None:
    prefs = ConversationStore(":memory:")
    history = ServerHistory(prefs)
    assert not history.synced and history.conversations() == []
    draft = history.create()
    changed, suspects = history.apply_list([summary("a", 5.0, "Alpha"), summary("b", 9.0, "")])
    assert changed and history.synced and suspects == set()
    assert [c.id for c in history.conversations()] == [draft.id, "b", "a"]
    assert history.get("b").title == DEFAULT_TITLE  # a server with history off keeps no titles
    history.set_pinned("a", True)
    assert history.conversations()[0].id == "a"
    # pins are the app's preference: a new view of the same file has them
    assert ServerHistory(prefs).apply_list([summary("a", 5.0)]) and ServerHistory(
        prefs
    )._pinned == {"a"}
    assert [c.id for c in history.conversations("alp")] == ["a"]
    # the same listing again changes nothing
    assert history.apply_list([summary("a", 5.0, "Alpha"), summary("b", 9.0, "")]) == (False, set())


def test_a_draft_becomes_listed_and_deleted_ones_stay_gone() -> None:
    history = ServerHistory(ConversationStore(":memory:"))
    draft = history.create()
    history.append(draft.id, "user", "hello")
    history.hold(draft.id)
    # the server saved it while the reply streams: not compared while held
    assert history.apply_list([summary(draft.id, 3.0, "hello")])[1] == set()
    history.append(draft.id, "assistant", "hi")
    history.release(draft.id)
    _, suspects = history.apply_list([summary(draft.id, 3.0, "hello")])
    assert suspects == {draft.id}  # compared once against the server's copy
    same = summary(
        draft.id, 3.0, "hello", ("system", "be brief"), ("user", "hello"), ("assistant", "hi")
    )
    assert history.refresh(draft.id, same) is False  # the same text: nothing to redraw
    assert history.apply_list([summary(draft.id, 3.0, "hello")])[1] == set()
    # another client went on with it
    later = summary(
        draft.id, 4.0, "hello", ("user", "hello"), ("assistant", "hi"), ("user", "more")
    )
    assert history.apply_list([later])[1] == {draft.id}
    assert history.refresh(draft.id, later) is True
    assert [m.content for m in history.messages(draft.id)] == ["hello", "hi", "more"]
    history.delete(draft.id)
    assert history.apply_list([later]) == (False, set())  # a listing older than the deletion
    assert history.conversations() == []
    history.apply_list([])
    assert history.apply_list([later])[0] and history.get(draft.id) is not None  # came back


def test_messages_of_a_listed_conversation_are_read_when_opened() -> None:
    history = ServerHistory(ConversationStore(":memory:"))
    history.apply_list([summary("c", 2.0, "Cats")])
    assert not history.loaded("c")
    shown = history.set_messages(
        "c", summary("c", 2.0, "Cats", ("system", "s"), ("user", "q"), ("assistant", "a"))
    )
    assert [(m.role, m.position) for m in shown] == [("user", 0), ("assistant", 1)]
    history.truncate("c", 1)
    assert [m.content for m in history.messages("c")] == ["q"]
    history.apply_list([])  # deleted elsewhere
    assert history.get("c") is None and not history.loaded("c")


def old_app_database(path: Path) -> None:
    """A conversations.db as the app wrote it before the server kept conversations:
    the schema of migrations 0001..0006, written with plain SQL."""
    store = ConversationStore(path)
    store.close()
    db = sqlite3.connect(path)
    db.executescript(
        """
        INSERT INTO conversations (id, title, created, updated, pinned) VALUES
            ('c1', 'About cats', 100.0, 200.0, 1),
            ('c2', 'New conversation', 110.0, 210.0, 0),
            ('empty', 'New conversation', 120.0, 220.0, 0);
        INSERT INTO messages (conversation_id, position, role, content, created) VALUES
            ('c1', 0, 'user', 'Tell me about cats', 101.0),
            ('c1', 1, 'assistant', 'They purr.', 102.0),
            ('c2', 0, 'user', 'Second chat', 111.0);
        INSERT INTO preferences (key, value) VALUES ('model', '"m"');
        """
    )
    db.commit()
    db.close()


def test_the_old_database_is_handed_over_once(tmp_path: Path) -> None:
    path = tmp_path / "conversations.db"
    old_app_database(path)
    store = ConversationStore(path)
    backend = FakeBackend()
    history = ServerHistory(store)
    kept = to_hand_over(store)
    assert [k["id"] for k in kept] == ["c1", "c2"]  # the empty one has nothing to keep
    assert kept[0]["title"] == "About cats" and kept[1]["title"] == ""  # the server titles it
    assert kept[0]["messages"][1] == {"role": "assistant", "content": "They purr."}
    assert (kept[0]["created"], kept[0]["updated"]) == (100.0, 200.0)
    # the first answer gets lost (the app quit): nothing leaves the file
    backend.import_sessions(kept)
    assert handed_over(store, history, None) == 0
    assert len(store.conversations()) == 3
    # tried again: the server already has both; the file gives them up, pins kept
    result = backend.import_sessions(to_hand_over(store))
    assert result == {"imported": [], "existing": ["c1", "c2"]}
    assert handed_over(store, history, result) == 2
    assert store.conversations() == []
    assert store.preference(IMPORTED_KEY)["count"] == 2
    assert store.preference("model") == "m"  # preferences stay in the app's file
    assert history._pinned == {"c1"}
    assert backend.session("c1").messages[0].content == "Tell me about cats"
    assert to_hand_over(store) == []


def test_only_what_the_server_confirms_leaves_the_file(tmp_path: Path) -> None:
    store = ConversationStore(tmp_path / "c.db")
    a, b = store.create("A"), store.create("B")
    store.append(a.id, "user", "one")
    store.append(b.id, "user", "two")
    assert handed_over(store, ServerHistory(store), {"imported": [a.id]}) == 1
    assert [c.id for c in store.conversations()] == [b.id]


def test_a_title_given_to_a_draft_reaches_the_server_once_it_lists_it() -> None:
    history = ServerHistory(ConversationStore(":memory:"))
    draft = history.create()
    history.rename(draft.id, "My title")
    history.title_later(draft.id, "My title")
    assert history.titles_due() == {}  # not on the server yet
    history.apply_list([summary(draft.id, 2.0, "what the server chose")])
    assert history.get(draft.id).title == "My title"
    assert history.titles_due() == {draft.id: "My title"}
    assert history.titles_due() == {}  # sent once
    history.apply_list([summary(draft.id, 2.0, "what the server chose")])
    assert history.get(draft.id).title == "My title"  # until the server has it
    history.apply_list([summary(draft.id, 3.0, "My title")])
    history.apply_list([summary(draft.id, 4.0, "Renamed elsewhere")])
    assert history.get(draft.id).title == "Renamed elsewhere"


def test_the_reports_of_the_servers_conversations_outlive_the_run(tmp_path: Path) -> None:
    """The server keeps a reply's text, the app its cache report (the line under the
    reply): a later run, another ServerHistory on the same file, shows it again, for
    that reply only, and forgets it when the reply or the conversation goes."""
    from warmstart.app.core.report import ReplyReport

    path = tmp_path / "conversations.db"
    report = ReplyReport(prompt_tokens=40, restored={"ram": 32}, ttft_ms=12.0, warmstart=True)
    store = ConversationStore(path)
    history = ServerHistory(store, store)
    cid = history.create().id
    history.append(cid, "user", "Hi")
    history.append(cid, "assistant", "Hello! ", report)  # the server saves it trimmed
    store.close()

    store = ConversationStore(path)
    again = ServerHistory(store, store)
    said = (("user", "Hi"), ("assistant", "Hello!"))
    shown = again.set_messages(cid, summary(cid, 5.0, "Hi", ("system", "Be brief."), *said))
    assert [m.report for m in shown] == [None, report]
    # the reply is not that one any more (regenerated by another client): no report
    other = again.set_messages(cid, summary(cid, 6.0, "Hi", ("user", "Hi"), ("assistant", "Yo")))
    assert [m.report for m in other] == [None, None]
    again.truncate(cid, 1)
    assert store.kept_reports(cid) == {}
    again.append(cid, "assistant", "Hello!", report)
    assert list(store.kept_reports(cid)) == [1]
    again.delete(cid)
    assert store.kept_reports(cid) == {}
