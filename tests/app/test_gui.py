"""The app's window, offscreen, against real HTTP servers on loopback.

The acceptance tests (``gui`` and ``slow``) run ``warmstart serve`` on the real default
model (see servers.py); the rest run against the runtime's fake
(``python -m warmstart.runtime.api --fake``) or, for a server without warmstart's extensions,
``tests/app/plain_server.py``.
"""

from __future__ import annotations

import os
import sys
from dataclasses import replace

import pytest
from PySide6.QtCore import Qt
from warmstart.app.core.types import Sampling
from warmstart.app.qt.application import Options, WarmstartApp

pytestmark = pytest.mark.gui
WAIT = 15_000
# Two shared CPU cores: the real model's replies take seconds, a restart ~5 s.
REAL_WAIT = 90_000


def make_app(qtbot, data_dir, url, *, max_tokens: int | None = None, **kw) -> WarmstartApp:
    options = Options(data_dir=data_dir, base_url=url, autostart=kw.pop("autostart", False))
    app = WarmstartApp(options)
    qtbot.addWidget(app.window)
    if max_tokens is not None:
        # greedy and short: the real model answers in a second or two
        sampling = Sampling(temperature=0.0, max_tokens=max_tokens, seed=0)
        app.apply_preferences(replace(app.prefs, sampling=sampling, **kw))
    app.start()
    qtbot.waitUntil(lambda: app.connection.ready, timeout=WAIT)
    return app


def close(app: WarmstartApp) -> None:
    app.window.close()


def send(qtbot, app: WarmstartApp, text: str, timeout: int = WAIT) -> None:
    composer = app.window.chat.composer
    composer.setFocus()
    qtbot.keyClicks(composer, text)
    with qtbot.waitSignal(app.chat.reply_finished, timeout=timeout):
        qtbot.keyClick(composer, Qt.Key.Key_Return)


# -- acceptance: the real server on the real default model ------------------------------


@pytest.mark.slow
def test_send_a_message_and_see_the_streamed_reply(qtbot, real_server, app_data):
    app = make_app(qtbot, app_data, real_server.url, max_tokens=32)
    deltas: list[str] = []
    app.chat.reply_delta.connect(deltas.append)
    send(qtbot, app, "What is a KV cache?", REAL_WAIT)
    assert len(deltas) > 5  # token by token, not in one piece
    bubbles = app.window.chat.bubbles
    assert [b.role for b in bubbles] == ["user", "assistant"]
    assert bubbles[1].text == app.history.messages(app.chat.current)[1].content != ""
    assert "".join(deltas).strip() == bubbles[1].text.strip()
    if "```" in bubbles[1].text:  # the code block was rendered, fences gone
        assert "```" not in bubbles[1].body.toPlainText()
    assert app.window.chat.composer.toPlainText() == ""
    assert "prefilled" in app.window.status_label.text()
    # the list is the server's (other tests' conversations too): this one is in it
    assert app.conversations.row_of(app.chat.current) >= 0
    close(app)


@pytest.mark.slow
def test_stop_mid_reply(qtbot, real_server, app_data):
    app = make_app(qtbot, app_data, real_server.url, max_tokens=200)
    view = app.window.chat
    qtbot.keyClicks(view.composer, "Write a long story about a dragon who guards a library.")
    qtbot.keyClick(view.composer, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: len(app.chat.partial_text().split()) >= 3, timeout=REAL_WAIT)
    assert view.stop_button.isVisible()
    with qtbot.waitSignal(app.chat.reply_finished, timeout=WAIT):
        qtbot.mouseClick(view.stop_button, Qt.MouseButton.LeftButton)
    reply = app.history.messages(app.chat.current)[-1]
    # stopped well before the 200 tokens asked for
    assert reply.role == "assistant" and 3 <= len(reply.content.split()) < 60, reply.content
    assert not view.stop_button.isVisible() and view.send_button.isEnabled()
    assert "stopped" in app.window.status_label.text()
    # the server is free again: the next message gets a whole reply
    app.apply_preferences(replace(app.prefs, sampling=replace(app.prefs.sampling, max_tokens=8)))
    send(qtbot, app, "Thanks.", REAL_WAIT)
    assert app.history.messages(app.chat.current)[-1].content
    close(app)


@pytest.mark.slow
def test_switch_conversations_and_come_back_is_a_cache_hit(qtbot, real_server, app_data):
    app = make_app(qtbot, app_data, real_server.url, max_tokens=24)
    send(qtbot, app, "Name three colours of the rainbow.", REAL_WAIT)
    first = app.chat.current
    qtbot.keyClick(app.window, Qt.Key.Key_N, Qt.KeyboardModifier.ControlModifier)
    assert app.chat.current != first and app.window.chat.bubbles == []
    send(qtbot, app, "Name two planets.", REAL_WAIT)
    row = app.conversations.row_of(first)
    app.window.conversations.clicked.emit(app.conversations.index(row))
    assert app.chat.current == first and len(app.window.chat.bubbles) == 2
    send(qtbot, app, "And one more colour?", REAL_WAIT)
    status = app.window.status_label.text()
    # a cache hit, from the live context or the RAM pool (never recomputed from scratch)
    assert status.startswith("restored ") and ("live context" in status or "RAM" in status), status
    qtbot.waitUntil(lambda: app.conversations.location(first) != "none", timeout=WAIT)
    close(app)


@pytest.mark.slow
def test_restart_and_resume_from_disk(qtbot, real_server, app_data):
    # The app warms recent conversations up to RAM when it connects, and sends an opened
    # conversation as a draft (which restores it into a live sequence); without both
    # the restored conversation comes straight from disk, which is what this test is
    # about (tests/app/test_drafts_gui.py covers the draft on opening).
    no_prewarm = {"overrides": {"prewarm_sessions": "0"}, "drafts": "off"}
    app = make_app(qtbot, app_data, real_server.url, max_tokens=32, **no_prewarm)
    send(
        qtbot,
        app,
        "Please remember this: my cat is called Miso, she is nine years old, "
        "she likes cardboard boxes and sleeps on the piano every afternoon.",
        REAL_WAIT,
    )
    cid = app.chat.current
    close(app)
    real_server.restart()  # same data dir: the RAM pool is gone, the disk tier is not
    again = make_app(qtbot, app_data, real_server.url)
    # reopened once the server's list is here, its messages read from the server
    qtbot.waitUntil(lambda: again.chat.current == cid, timeout=WAIT)
    qtbot.waitUntil(lambda: len(again.window.chat.bubbles) == 2, timeout=WAIT)
    assert [b.role for b in again.window.chat.bubbles] == ["user", "assistant"]
    # the real server restarted: on a loaded machine its first stats can take a while
    qtbot.waitUntil(lambda: again.conversations.location(cid) == "disk", timeout=REAL_WAIT)
    send(qtbot, again, "What is my cat called?", REAL_WAIT)
    status = again.window.status_label.text()
    assert status.startswith("restored ") and "from disk" in status, status
    close(again)


@pytest.mark.slow
def test_server_down_shows_an_error_and_recovers(qtbot, real_server, app_data):
    app = make_app(qtbot, app_data, real_server.url, max_tokens=16)
    send(qtbot, app, "Hello!", REAL_WAIT)
    real_server.stop()
    view = app.window.chat
    qtbot.keyClicks(view.composer, "are you there?")
    qtbot.keyClick(view.composer, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: view.error_banner.isVisible(), timeout=WAIT)
    assert "not answering" in view.error_banner.label.text()
    assert "server down" in app.window.connection_label.text()
    real_server.start()
    qtbot.waitUntil(lambda: app.connection.ready, timeout=REAL_WAIT)
    qtbot.waitUntil(lambda: not view.error_banner.isVisible(), timeout=WAIT)
    if app.chat.busy:  # the message waited for the server and went out on its return
        with qtbot.waitSignal(app.chat.reply_finished, timeout=REAL_WAIT):
            pass
    else:
        with qtbot.waitSignal(app.chat.reply_finished, timeout=REAL_WAIT):
            app.chat.regenerate()
    assert app.history.messages(app.chat.current)[-1].role == "assistant"
    close(app)


# -- the app's own behaviour: the runtime's fake, or a plain OpenAI server --------------


def test_plain_openai_server_still_chats(qtbot, plain_server, app_data):
    app = make_app(qtbot, app_data, plain_server.url)
    send(qtbot, app, "hi")
    assert "prompt tokens" in app.window.status_label.text()
    qtbot.waitUntil(
        lambda: app.window.memory.unsupported.isVisible() or not app.window.memory.isVisible(),
        timeout=WAIT,
    )
    assert app.connection.is_warmstart is False
    close(app)


@pytest.mark.slow
def test_warmstart_without_its_own_routes_is_a_plain_server(
    qtbot, model_path, calibration, tmp_path, app_data
):
    """``warmstart serve --no-warmstart-routes`` answers as vLLM would (no /v1/warmstart):
    the app chats, and its memory panel says the server does not report its cache."""
    from tests.app.servers import REAL_SETTINGS, ServerProcess
    from tests.conftest import seed_calibration

    seed_calibration(calibration, tmp_path / "data")

    def command(port: int) -> list[str]:
        serve = [sys.executable, "-m", "warmstart.runtime.cli", "serve", "--port", str(port)]
        where = ["--data-dir", str(tmp_path / "data"), "--model", str(model_path)]
        return [*serve, *where, *REAL_SETTINGS, "--no-warmstart-routes"]

    server = ServerProcess(command, tmp_path / "plain-warmstart.log")
    try:
        server.start(timeout=300)
        app = make_app(qtbot, app_data, server.url, max_tokens=8)
        send(qtbot, app, "hi", REAL_WAIT)
        assert app.store.messages(app.chat.current)[-1].content
        assert app.connection.is_warmstart is False
        panel = app.window.memory
        qtbot.waitUntil(
            lambda: panel.unsupported.isVisible() or not panel.isVisible(), timeout=WAIT
        )
        assert "does not report its cache" in panel.unsupported.text()
        close(app)
    finally:
        server.stop()


def test_memory_panel_fills_in(qtbot, fake_server, app_data):
    server = fake_server()
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


def test_keyboard_edit_and_regenerate(qtbot, fake_server, app_data):
    server = fake_server()
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
    assert app.history.messages(app.chat.current)[0].content == "edited"
    with qtbot.waitSignal(app.chat.reply_finished, timeout=WAIT):
        app.window.regenerate_action.trigger()
    assert len(app.history.messages(app.chat.current)) == 2
    app.window.search_action.trigger()
    assert app.window.search.hasFocus() or app.window.search.isVisible()
    app.library.set_search("nothing matches this")
    assert app.conversations.rowCount() == 0
    close(app)


def test_window_geometry_is_remembered(qtbot, fake_server, app_data):
    server = fake_server()
    app = make_app(qtbot, app_data, server.url)
    app.window.resize(720, 560)  # inside the offscreen screen (800x600): no clamping
    app.window.memory_dock.hide()
    close(app)
    again = make_app(qtbot, app_data, server.url)
    assert again.window.size().height() == 560  # width may grow to the minimum hint
    assert not again.window.memory_dock.isVisible()
    close(again)


def test_starts_a_local_server_when_none_answers(qtbot, app_data, monkeypatch, tmp_path):
    from tests.app.servers import ROOT, free_port

    port = free_port()
    command = f"{sys.executable} -m warmstart.runtime.api --fake --port {{port}}"
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
