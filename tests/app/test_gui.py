"""The acceptance tests: the real window, offscreen, against a real HTTP server on
loopback (see servers.py for swapping in ``warmstart serve``)."""

from __future__ import annotations

import os
import sys

import pytest
from PySide6.QtCore import Qt

from app.qt.application import Options, WarmstartApp

pytestmark = pytest.mark.gui
WAIT = 15_000
# Some tests lean on the app's contract fake: its "/long" reply, "--plain" mode, and a
# state file that survives a restart. Another server runs the rest.
app_fake_only = pytest.mark.skipif(
    bool(
        os.environ.get("WARMSTART_APP_TEST_SERVER")
        or os.environ.get("WARMSTART_APP_TEST_SERVER_CMD")
    ),
    reason="needs the app's contract fake server",
)


def make_app(qtbot, data_dir, url, **kw) -> WarmstartApp:
    options = Options(data_dir=data_dir, base_url=url, autostart=kw.pop("autostart", False))
    app = WarmstartApp(options)
    qtbot.addWidget(app.window)
    app.start()
    qtbot.waitUntil(lambda: app.connection.ready, timeout=WAIT)
    return app


def close(app: WarmstartApp) -> None:
    app.window.close()


def send(qtbot, app: WarmstartApp, text: str) -> None:
    composer = app.window.chat.composer
    composer.setFocus()
    qtbot.keyClicks(composer, text)
    with qtbot.waitSignal(app.chat.reply_finished, timeout=WAIT):
        qtbot.keyClick(composer, Qt.Key.Key_Return)


def test_send_a_message_and_see_the_streamed_reply(qtbot, server_factory, app_data):
    server = server_factory()
    app = make_app(qtbot, app_data, server.url)
    deltas: list[str] = []
    app.chat.reply_delta.connect(deltas.append)
    send(qtbot, app, "What is a KV cache?")
    assert len(deltas) > 5  # token by token, not in one piece
    bubbles = app.window.chat.bubbles
    assert [b.role for b in bubbles] == ["user", "assistant"]
    assert bubbles[1].text == app.store.messages(app.chat.current)[1].content != ""
    if "```" in bubbles[1].text:  # the code block was rendered, fences gone
        assert "```" not in bubbles[1].body.toPlainText()
    assert app.window.chat.composer.toPlainText() == ""
    assert app.window.status_label.text().startswith("no cache hit")
    assert app.conversations.rowCount() == 1
    close(app)


@app_fake_only
def test_stop_mid_reply(qtbot, server_factory, app_data):
    server = server_factory("--token-delay", "0.05")
    app = make_app(qtbot, app_data, server.url)
    view = app.window.chat
    qtbot.keyClicks(view.composer, "/long please")
    qtbot.keyClick(view.composer, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: len(app.chat.partial_text().split()) >= 3, timeout=WAIT)
    assert view.stop_button.isVisible()
    with qtbot.waitSignal(app.chat.reply_finished, timeout=WAIT):
        qtbot.mouseClick(view.stop_button, Qt.MouseButton.LeftButton)
    reply = app.store.messages(app.chat.current)[-1]
    assert reply.role == "assistant" and 3 <= len(reply.content.split()) < 400
    assert not view.stop_button.isVisible() and view.send_button.isEnabled()
    assert "stopped" in app.window.status_label.text()
    close(app)


def test_switch_conversations_and_come_back_is_a_cache_hit(qtbot, server_factory, app_data):
    server = server_factory()
    app = make_app(qtbot, app_data, server.url)
    send(qtbot, app, "first conversation")
    first = app.chat.current
    qtbot.keyClick(app.window, Qt.Key.Key_N, Qt.KeyboardModifier.ControlModifier)
    assert app.chat.current != first and app.window.chat.bubbles == []
    send(qtbot, app, "second conversation")
    row = app.conversations.row_of(first)
    app.window.conversations.clicked.emit(app.conversations.index(row))
    assert app.chat.current == first and len(app.window.chat.bubbles) == 2
    send(qtbot, app, "and again")
    status = app.window.status_label.text()
    assert status.startswith("restored "), status  # a cache hit, from whichever tier
    qtbot.waitUntil(lambda: app.conversations.location(first) != "none", timeout=WAIT)
    close(app)


@app_fake_only
def test_restart_and_resume_from_disk(qtbot, server_factory, app_data):
    server = server_factory()
    app = make_app(qtbot, app_data, server.url)
    send(qtbot, app, "remember this")
    cid = app.chat.current
    close(app)
    server.stop()
    server.start()  # same state file: the server restarts with its disk tier
    again = make_app(qtbot, app_data, server.url)
    assert again.chat.current == cid
    assert [b.role for b in again.window.chat.bubbles] == ["user", "assistant"]
    qtbot.waitUntil(lambda: again.conversations.location(cid) == "disk", timeout=WAIT)
    send(qtbot, again, "what did I say?")
    assert "from disk" in again.window.status_label.text()
    close(again)


def test_server_down_shows_an_error_and_recovers(qtbot, server_factory, app_data):
    server = server_factory()
    app = make_app(qtbot, app_data, server.url)
    send(qtbot, app, "hello")
    server.stop()
    view = app.window.chat
    qtbot.keyClicks(view.composer, "are you there?")
    qtbot.keyClick(view.composer, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: view.error_banner.isVisible(), timeout=WAIT)
    assert "not answering" in view.error_banner.label.text()
    assert "server down" in app.window.connection_label.text()
    server.start()
    qtbot.waitUntil(lambda: app.connection.ready, timeout=WAIT)
    qtbot.waitUntil(lambda: not view.error_banner.isVisible(), timeout=WAIT)
    if app.chat.busy:  # the message waited for the server and went out on its return
        with qtbot.waitSignal(app.chat.reply_finished, timeout=WAIT):
            pass
    else:
        with qtbot.waitSignal(app.chat.reply_finished, timeout=WAIT):
            app.chat.regenerate()
    assert app.store.messages(app.chat.current)[-1].role == "assistant"
    close(app)


@app_fake_only
def test_plain_openai_server_still_chats(qtbot, server_factory, app_data):
    server = server_factory("--plain")
    app = make_app(qtbot, app_data, server.url)
    send(qtbot, app, "hi")
    assert "prompt tokens" in app.window.status_label.text()
    qtbot.waitUntil(
        lambda: app.window.memory.unsupported.isVisible() or not app.window.memory.isVisible(),
        timeout=WAIT,
    )
    assert app.connection.is_warmstart is False
    close(app)


def test_memory_panel_fills_in(qtbot, server_factory, app_data):
    server = server_factory()
    app = make_app(qtbot, app_data, server.url)
    send(qtbot, app, "one")
    send(qtbot, app, "two")
    panel = app.window.memory
    qtbot.waitUntil(lambda: panel.bars["live"].format() != "–", timeout=WAIT)
    assert "hit rate" in panel.hit_labels["live"].text()
    assert panel.last.text().startswith("restored")
    assert len(panel.plot.points) == 2
    qtbot.waitUntil(lambda: "cache: live context" in panel.location.text(), timeout=WAIT)
    close(app)


def test_keyboard_edit_and_regenerate(qtbot, server_factory, app_data):
    server = server_factory()
    app = make_app(qtbot, app_data, server.url)
    composer = app.window.chat.composer
    qtbot.keyClicks(composer, "line one")
    qtbot.keyClick(composer, Qt.Key.Key_Return, Qt.KeyboardModifier.ShiftModifier)
    qtbot.keyClicks(composer, "line two")
    assert composer.toPlainText() == "line one\nline two"
    with qtbot.waitSignal(app.chat.reply_finished, timeout=WAIT):
        qtbot.keyClick(composer, Qt.Key.Key_Return)
    qtbot.keyClick(composer, Qt.Key.Key_Up)  # empty composer: edit the last message
    assert composer.toPlainText() == "line one\nline two"
    composer.clear()
    qtbot.keyClicks(composer, "edited")
    with qtbot.waitSignal(app.chat.reply_finished, timeout=WAIT):
        qtbot.keyClick(composer, Qt.Key.Key_Return)
    assert app.store.messages(app.chat.current)[0].content == "edited"
    with qtbot.waitSignal(app.chat.reply_finished, timeout=WAIT):
        app.window.regenerate_action.trigger()
    assert len(app.store.messages(app.chat.current)) == 2
    app.window.search_action.trigger()
    assert app.window.search.hasFocus() or app.window.search.isVisible()
    app.library.set_search("nothing matches this")
    assert app.conversations.rowCount() == 0
    close(app)


def test_window_geometry_is_remembered(qtbot, server_factory, app_data):
    server = server_factory()
    app = make_app(qtbot, app_data, server.url)
    app.window.resize(720, 560)  # inside the offscreen screen (800x600): no clamping
    app.window.memory_dock.hide()
    close(app)
    again = make_app(qtbot, app_data, server.url)
    assert again.window.size().height() == 560  # width may grow to the minimum hint
    assert not again.window.memory_dock.isVisible()
    close(again)


@app_fake_only
def test_starts_a_local_server_when_none_answers(qtbot, app_data, monkeypatch, tmp_path):
    from tests.app.servers import ROOT, free_port

    port = free_port()
    command = f"{sys.executable} -m app.tools.fake_server --port {{port}} --load-seconds 1"
    monkeypatch.setenv("WARMSTART_APP_SERVER_CMD", command)
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    app = WarmstartApp(
        Options(data_dir=app_data, base_url=f"http://127.0.0.1:{port}/v1", autostart=True)
    )
    qtbot.addWidget(app.window)
    progress: list[str] = []
    app.connection.progress.connect(lambda text, _f: progress.append(text))
    app.start()
    assert app.window.isVisible()  # at once, before the server is up
    qtbot.waitUntil(lambda: app.connection.ready, timeout=30_000)
    assert any("loading" in p.lower() or "starting" in p.lower() for p in progress)
    send(qtbot, app, "hi")
    close(app)  # stops the server it started
    assert os.environ["WARMSTART_APP_SERVER_CMD"]
