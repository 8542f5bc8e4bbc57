"""Controllers with a fake backend: behaviour without widgets and without HTTP."""

from __future__ import annotations

import threading

import pytest
from warmstart.app.core.preferences import Preferences
from warmstart.app.core.store import ConversationStore
from warmstart.app.core.types import Sampling
from warmstart.app.qt.controllers import (
    ChatController,
    ConnectionController,
    LibraryController,
    MemoryController,
)
from warmstart.app.qt.models import ConversationListModel, Roles
from warmstart.app.qt.workers import Jobs


@pytest.fixture
def parts(qapp, fake_backend):
    store = ConversationStore(":memory:")
    jobs = Jobs()
    conn = ConnectionController(jobs, fake_backend, poll_ready_ms=50, poll_down_ms=50)
    chat = ChatController(store, conn, jobs, Preferences)
    model = ConversationListModel()
    library = LibraryController(store, model, conn, jobs)
    chat.conversations_changed.connect(library.reload)
    memory = MemoryController(conn, jobs, interval_ms=50)
    yield store, jobs, conn, chat, library, memory
    conn.shutdown()
    jobs.wait(5000)


def connect(qtbot, conn):
    with qtbot.waitSignal(conn.became_ready, timeout=5000):
        conn.start()


def test_send_streams_and_stores_the_reply(qtbot, parts, fake_backend):
    store, _jobs, conn, chat, library, _memory = parts
    connect(qtbot, conn)
    deltas: list[str] = []
    chat.reply_delta.connect(deltas.append)
    with qtbot.waitSignal(chat.reply_finished, timeout=5000) as done:
        assert chat.send("hi there")
    assert "".join(deltas) == "Hello there!"
    assert done.args[0].content == "Hello there!"
    cid = chat.current
    assert [m.role for m in store.messages(cid)] == ["user", "assistant"]
    assert fake_backend.requests[0]["session_id"] == cid
    assert store.get(cid).title == "hi there"
    assert library.model.rowCount() == 1


def test_second_reply_reports_a_cache_hit(qtbot, parts):
    _store, _jobs, conn, chat, _library, _memory = parts
    connect(qtbot, conn)
    statuses: list[str] = []
    chat.status.connect(statuses.append)
    for text in ("first", "second"):
        with qtbot.waitSignal(chat.reply_finished, timeout=5000):
            chat.send(text)
    assert statuses[-1].startswith("restored ")
    assert "from RAM in 9 ms" in statuses[-1]


def test_stop_keeps_the_partial_reply(qtbot, parts, fake_backend):
    store, _jobs, conn, chat, _library, _memory = parts
    connect(qtbot, conn)
    fake_backend.gate = threading.Event()
    with qtbot.waitSignal(chat.reply_delta, timeout=5000):
        chat.send("tell me")
    assert chat.busy
    with qtbot.waitSignal(chat.reply_finished, timeout=5000):
        chat.stop()
    assert not chat.busy
    assert store.messages(chat.current)[-1].content == "Hello"
    assert store.messages(chat.current)[-1].report.finish_reason == "cancelled"


def test_regenerate_and_edit_last(qtbot, parts, fake_backend):
    store, _jobs, conn, chat, _library, _memory = parts
    connect(qtbot, conn)
    with qtbot.waitSignal(chat.reply_finished, timeout=5000):
        chat.send("one")
    fake_backend.reply = ["Again"]
    with qtbot.waitSignal(chat.reply_finished, timeout=5000):
        assert chat.regenerate()
    assert [m.content for m in store.messages(chat.current)] == ["one", "Again"]
    assert chat.edit_last() == "one"
    with qtbot.waitSignal(chat.reply_finished, timeout=5000):
        chat.send("uno")
    assert [m.content for m in store.messages(chat.current)] == ["uno", "Again"]
    assert fake_backend.requests[-1]["messages"] == [{"role": "user", "content": "uno"}]


def test_server_down_then_back(qtbot, parts, fake_backend):
    _store, _jobs, conn, chat, _library, _memory = parts
    connect(qtbot, conn)
    fake_backend.up = False
    errors: list[str] = []
    chat.error.connect(errors.append)
    with qtbot.waitSignal(chat.reply_finished, timeout=5000):
        chat.send("anyone?")
    assert "not answering" in errors[-1]
    assert conn.state == "down"
    fake_backend.up = True
    with qtbot.waitSignal(conn.became_ready, timeout=5000):
        pass
    with qtbot.waitSignal(chat.reply_finished, timeout=5000):
        assert chat.regenerate()


def test_message_sent_before_the_server_is_ready_waits_for_it(qtbot, parts, fake_backend):
    _store, _jobs, conn, chat, _library, _memory = parts
    fake_backend.up = False
    conn.start()
    qtbot.waitUntil(lambda: conn.state == "down", timeout=5000)
    assert chat.send("early bird")
    assert chat.busy and not fake_backend.requests
    fake_backend.up = True
    with qtbot.waitSignal(chat.reply_finished, timeout=5000):
        pass
    assert fake_backend.requests


def test_library_search_pin_delete_and_locations(qtbot, parts, fake_backend):
    store, _jobs, conn, chat, library, memory = parts
    connect(qtbot, conn)
    with qtbot.waitSignal(chat.reply_finished, timeout=5000):
        chat.send("about cats")
    cats = chat.current
    other = chat.new_conversation()
    library.set_pinned(cats, True)
    assert library.model.conversation(0).id == cats
    library.set_search("cats")
    assert library.model.rowCount() == 1
    library.set_search("")
    # the poll the connection started may still be out, and refresh() skips while it is
    qtbot.waitUntil(lambda: not memory.polling, timeout=5000)
    with qtbot.waitSignal(memory.sessions, timeout=5000) as got:
        memory.refresh()
    library.apply_sessions(got.args[0])
    row = library.model.row_of(cats)
    assert library.model.data(library.model.index(row), Roles.Location) == "ram"
    library.delete(other)
    qtbot.waitUntil(lambda: fake_backend.deleted == [other], timeout=5000)
    assert store.get(other) is None


def test_prewarm_recent_goes_one_by_one(qtbot, parts, fake_backend):
    _store, _jobs, conn, chat, library, _memory = parts
    connect(qtbot, conn)
    ids = [chat.new_conversation() for _ in range(3)]
    with qtbot.waitSignal(
        library.prewarm_progress, timeout=5000, check_params_cb=lambda d, t: d == t == 2
    ):
        library.prewarm_recent(2)
    assert fake_backend.prewarmed == [ids[2], ids[1]]


def test_memory_controller_history_and_plain_servers(qtbot, parts, fake_backend):
    _store, _jobs, conn, chat, _library, memory = parts
    chat.report_received.connect(memory.add_report)
    connect(qtbot, conn)
    with qtbot.waitSignal(memory.history_changed, timeout=5000):
        chat.send("q")
    assert len(memory.points) == 1
    fake_backend.warmstart = False
    qtbot.waitUntil(lambda: not memory.polling, timeout=5000)
    with qtbot.waitSignal(memory.snapshot, timeout=5000) as got:
        memory.refresh()
    assert got.args[0] is None


# -- against a warmstart server: its store is the list ----------------------------------


@pytest.fixture
def server_parts(qapp, fake_backend):
    from warmstart.app.core.history import ServerHistory

    history = ServerHistory(ConversationStore(":memory:"))
    jobs = Jobs()
    conn = ConnectionController(jobs, fake_backend, poll_ready_ms=50, poll_down_ms=50)
    chat = ChatController(history, conn, jobs, Preferences)
    library = LibraryController(history, ConversationListModel(), conn, jobs)
    chat.conversations_changed.connect(library.reload)
    library.synced.connect(chat.check_changed)
    memory = MemoryController(conn, jobs, interval_ms=50)
    memory.sessions.connect(library.apply_sessions)
    yield history, conn, chat, library, memory
    memory.stop()
    conn.shutdown()
    jobs.wait(5000)


def listed(library) -> list[str]:
    return [library.model.conversation(i).title for i in range(library.model.rowCount())]


def test_capabilities_are_known_before_ready(qtbot, server_parts):
    _history, conn, _chat, _library, _memory = server_parts
    seen: list[str] = []
    conn.capabilities.connect(lambda ok: seen.append(f"warmstart={ok}"))
    conn.became_ready.connect(lambda _h: seen.append("ready"))
    connect(qtbot, conn)
    assert seen == ["warmstart=True", "ready"]


def test_chats_made_elsewhere_are_listed_opened_and_continued(qtbot, server_parts, fake_backend):
    history, conn, chat, library, memory = server_parts
    connect(qtbot, conn)
    # "the command line" talks to the same server
    fake_backend.chat(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "from the CLI"}],
        session_id="cli-1",
        model=None,
        sampling=Sampling(),
    )
    memory.start()
    qtbot.waitUntil(lambda: listed(library) == ["from the CLI"], timeout=5000)
    with qtbot.waitSignal(
        chat.opened, timeout=5000, check_params_cb=lambda cid, msgs: len(msgs) == 2
    ) as got:
        chat.open("cli-1")
    assert [m.role for m in got.args[1]] == ["user", "assistant"]  # its system prompt is not shown
    with qtbot.waitSignal(chat.reply_finished, timeout=5000):
        assert chat.send("and more")
    sent = fake_backend.requests[-1]
    assert sent["session_id"] == "cli-1"
    assert [m["content"] for m in sent["messages"]] == ["from the CLI", "Hello there!", "and more"]
    # a rename goes to the server
    library.rename("cli-1", "Renamed here")
    qtbot.waitUntil(lambda: fake_backend.kept["cli-1"]["title"] == "Renamed here", timeout=5000)
    # another client goes on with it: the open conversation is read again
    fake_backend.chat(
        [*fake_backend.kept["cli-1"]["messages"], {"role": "user", "content": "from elsewhere"}],
        session_id="cli-1",
        model=None,
        sampling=Sampling(),
    )
    with qtbot.waitSignal(
        chat.opened, timeout=5000, check_params_cb=lambda cid, msgs: len(msgs) == 6
    ):
        pass
    assert history.messages("cli-1")[4].content == "from elsewhere"


def test_a_chat_made_in_the_app_is_the_servers(qtbot, server_parts, fake_backend):
    history, conn, chat, library, memory = server_parts
    connect(qtbot, conn)
    memory.start()
    with qtbot.waitSignal(chat.reply_finished, timeout=5000):
        chat.send("made in the app")
    cid = chat.current
    assert fake_backend.kept[cid]["messages"][-1]["content"] == "Hello there!"
    qtbot.waitUntil(lambda: history.get(cid) is not None and history.synced, timeout=5000)
    qtbot.waitUntil(lambda: listed(library) == ["made in the app"], timeout=5000)
    # our own reply, listed: compared, found the same, not redrawn (its report stays)
    qtbot.wait(200)
    assert history.messages(cid)[-1].report is not None
    # a draft named before its first reply: the server gets the name once it has it
    draft = chat.new_conversation()
    library.rename(draft, "Named early")
    with qtbot.waitSignal(chat.reply_finished, timeout=5000):
        chat.send("second one")
    qtbot.waitUntil(lambda: fake_backend.kept[draft]["title"] == "Named early", timeout=5000)
    library.delete(draft)
    library.delete(cid)
    qtbot.waitUntil(lambda: cid not in fake_backend.kept, timeout=5000)
    qtbot.wait(200)
    assert listed(library) == []


def test_sending_waits_until_the_conversation_is_read(qtbot, server_parts, fake_backend):
    history, conn, chat, _library, _memory = server_parts
    connect(qtbot, conn)
    fake_backend.chat(
        [{"role": "user", "content": "old"}], session_id="s", model=None, sampling=Sampling()
    )
    history.apply_list(fake_backend.sessions())
    fake_backend.up = False  # the read fails: nothing is sent on a partial history
    errors: list[str] = []
    chat.error.connect(errors.append)
    chat.open("s")
    qtbot.waitUntil(lambda: bool(errors), timeout=5000)
    assert not history.loaded("s")
    fake_backend.up = True
    assert not chat.send("new turn")  # reads it again first
    qtbot.waitUntil(lambda: history.loaded("s"), timeout=5000)
    with qtbot.waitSignal(chat.reply_finished, timeout=5000):
        assert chat.send("new turn")
    sent = [m["content"] for m in fake_backend.requests[-1]["messages"]]
    assert sent == ["old", "Hello there!", "new turn"]


def test_search_finds_text_the_app_has_not_read(qtbot, server_parts, fake_backend):
    _history, conn, _chat, library, memory = server_parts
    connect(qtbot, conn)
    for sid, text in (("z", "where do zebras live?"), ("c", "cats")):
        fake_backend.chat(
            [
                {"role": "user", "content": "hello"},
                {"role": "assistant", "content": "hi"},
                {"role": "user", "content": text},
            ],
            session_id=sid,
            model=None,
            sampling=Sampling(),
        )
    memory.start()
    qtbot.waitUntil(lambda: library.model.rowCount() == 2, timeout=5000)
    library.set_search("ZEBRAS")  # in no title, in no conversation opened here
    qtbot.waitUntil(lambda: library.model.rowCount() == 1, timeout=5000)
    assert library.model.conversation(0).id == "z"
    library.set_search("")
    assert library.model.rowCount() == 2
