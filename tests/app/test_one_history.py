"""One history: the app, the command line and the API see the same conversations, the
ones the server keeps; the app's old database is handed over to its server once.

Against the runtime's fake behind the real API (fast), and the acceptance test on the
real default model, where ``warmstart ask`` shares the server's data dir.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from tests.app.servers import REAL_SETTINGS, ROOT, ServerProcess
from tests.app.test_gui import REAL_WAIT, WAIT, close, make_app, send
from tests.app.test_history import old_app_database

pytestmark = pytest.mark.gui


def cli(*args: str, timeout: float = 60) -> str:
    """``warmstart ARGS``; returns stdout, fails the test on a non-zero exit."""
    cmd = [sys.executable, "-m", "warmstart.runtime.cli", *args]
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.stdout


def titles(app) -> list[str]:
    model = app.conversations
    return [model.conversation(i).title for i in range(model.rowCount())]


def open_titled(qtbot, app, title: str) -> None:
    row = titles(app).index(title)
    cid = app.conversations.conversation(row).id
    with qtbot.waitSignal(
        app.chat.opened, timeout=WAIT, check_params_cb=lambda c, msgs: c == cid and bool(msgs)
    ):
        app.chat.open(cid)


def test_the_api_the_cli_and_the_app_share_one_list(qtbot, fake_server, app_data, tmp_path):
    server = fake_server()
    body = {"messages": [{"role": "user", "content": "made through the API"}], "max_tokens": 8}
    headers = {"X-Warmstart-Session": "api-chat"}
    assert httpx.post(server.url + "/chat/completions", json=body, headers=headers).is_success

    app = make_app(qtbot, app_data, server.url)
    qtbot.waitUntil(lambda: "made through the API" in titles(app), timeout=WAIT)
    open_titled(qtbot, app, "made through the API")
    assert [b.role for b in app.window.chat.bubbles] == ["user", "assistant"]

    app.new_conversation()
    send(qtbot, app, "made in the app")
    mine = app.chat.current
    where = ["--port", str(server.port), "--data-dir", str(tmp_path / "cli")]
    listing = cli("sessions", "list", *where)
    assert mine in listing and "made in the app" in listing and "api-chat" in listing
    assert "made in the app" in cli("sessions", "show", mine, *where)

    # a rename in the app is the server's; a deletion on the command line is the app's
    app.library.rename(mine, "Renamed in the app")
    qtbot.waitUntil(lambda: "Renamed in the app" in cli("sessions", "list", *where), timeout=WAIT)
    cli("sessions", "delete", "api-chat", *where)
    qtbot.waitUntil(lambda: "made through the API" not in titles(app), timeout=WAIT)
    assert titles(app) == ["Renamed in the app"]
    close(app)


def test_the_old_app_database_is_handed_over_once(qtbot, fake_server, app_data, tmp_path):
    app_data.mkdir(parents=True, exist_ok=True)
    old_app_database(app_data / "conversations.db")
    server = fake_server()
    app = make_app(qtbot, app_data, server.url)
    # still pinned (the pin is set once the server has it: a listing later at most)
    qtbot.waitUntil(lambda: titles(app)[:1] == ["About cats"], timeout=WAIT)
    assert "Second chat" in titles(app)  # titled by the server from its first question
    assert app.store.conversations() == []  # one copy: the server's
    open_titled(qtbot, app, "About cats")
    assert [b.text for b in app.window.chat.bubbles] == ["Tell me about cats", "They purr."]
    close(app)

    where = ["--port", str(server.port), "--data-dir", str(tmp_path / "cli")]
    assert "About cats" in cli("sessions", "list", *where)
    again = make_app(qtbot, app_data, server.url)
    qtbot.waitUntil(lambda: "About cats" in titles(again), timeout=WAIT)
    sessions = httpx.get(server.url + "/warmstart/sessions").json()["data"]
    assert sorted(s["id"] for s in sessions) == ["c1", "c2"]  # nothing twice, nothing empty
    close(again)


def test_a_plain_server_keeps_the_history_in_the_app(qtbot, plain_server, app_data):
    app = make_app(qtbot, app_data, plain_server.url)
    send(qtbot, app, "kept by the app")
    assert app.history is app.store
    assert app.store.messages(app.chat.current)[0].content == "kept by the app"
    close(app)


# -- acceptance: the real server on the real default model ------------------------------


def data_dir_of(server: ServerProcess) -> str:
    return server.command[server.command.index("--data-dir") + 1]


@pytest.mark.slow
def test_cli_chats_appear_in_the_app_and_app_chats_in_the_cli(
    qtbot, real_server, app_data, model_path: Path
):
    data = ["--data-dir", data_dir_of(real_server), "--port", str(real_server.port)]
    session = f"cli-{uuid.uuid4().hex[:8]}"
    question = f"Name one colour. ({session})"
    model = ["--model", str(model_path), *REAL_SETTINGS]
    cli("ask", question, "--session", session, "--max-tokens", "8", *data, *model, timeout=300)

    app = make_app(qtbot, app_data, real_server.url, max_tokens=8)
    qtbot.waitUntil(lambda: any(session in t for t in titles(app)), timeout=WAIT)
    title = next(t for t in titles(app) if session in t)
    open_titled(qtbot, app, title)
    assert app.window.chat.bubbles[0].text == question

    app.new_conversation()
    send(qtbot, app, "Say hello from the app.", REAL_WAIT)
    mine = app.chat.current
    listing = cli("sessions", "list", *data)
    assert mine in listing and "Say hello from the app." in listing
    assert session in listing
    close(app)


def test_another_server_brings_its_own_list(qtbot, fake_server, plain_server, app_data):
    first, second = fake_server(), fake_server()
    app = make_app(qtbot, app_data, first.url)
    send(qtbot, app, "kept by the first server")
    qtbot.waitUntil(lambda: titles(app) == ["kept by the first server"], timeout=WAIT)
    app.apply_preferences(replace(app.prefs, base_url=second.url))
    qtbot.waitUntil(lambda: app.connection.ready and titles(app) == [], timeout=WAIT)
    send(qtbot, app, "kept by the second server")
    qtbot.waitUntil(lambda: titles(app) == ["kept by the second server"], timeout=WAIT)
    # a plain server keeps nothing: the app's own file does, and nothing else shows
    app.apply_preferences(replace(app.prefs, base_url=plain_server.url))
    qtbot.waitUntil(lambda: app.history is app.store, timeout=WAIT)
    assert titles(app) == []
    close(app)
