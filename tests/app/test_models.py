"""The model picker: switching the server's model, its failures, and downloads.

The switching tests drive the real window offscreen against ``model_server.py`` (a
server with two models and the load route); the download tests pull from the hub
imitation (``tests/hubfake.py``, through ``HF_ENDPOINT``) into a models directory of
the test's own, as the picker does for the local server the app starts.
"""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path

import httpx
import pytest
from PySide6.QtCore import Qt
from warmstart.app.core.api import ApiClient
from warmstart.app.core.errors import ApiError, ModelMissing
from warmstart.app.core.models import LocalListing, LocalModels, ModelInfo, merge
from warmstart.app.qt.application import Options, WarmstartApp

from tests.app.model_server import LOAD_ROUTE, ModelServer, serve_models
from tests.hubfake import Hub, serve_hub

WAIT = 15_000
REPO = "someone/tiny-GGUF"
TINY = b"GGUF" + bytes(range(256)) * (4 << 12)  # 4 MiB


# -- the client and the listing, without Qt ---------------------------------------------


def _client(status: int, body: dict) -> ApiClient:
    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.path == LOAD_ROUTE
        return httpx.Response(status, json=body)

    return ApiClient("http://127.0.0.1:9/v1", transport=httpx.MockTransport(handler))


def _err(code: str | None, kind: str = "invalid_request_error") -> dict:
    return {"error": {"message": "m", "type": kind, "code": code}}


def test_load_model_follows_the_contract() -> None:
    assert _client(200, {"model": "x", "loaded": True, "load_ms": 812}).load_model("x") == 812
    with pytest.raises(ModelMissing):
        _client(404, _err("model_not_found")).load_model("x")
    # no such route (an older warmstart, a plain server): requests name the model instead
    assert _client(404, _err("not_found")).load_model("x") is None
    assert _client(404, {"detail": "Not Found"}).load_model("x") is None
    with pytest.raises(ApiError) as failed:
        _client(500, _err(None, "server_error")).load_model("x")
    assert failed.value.status == 500 and not isinstance(failed.value, ModelMissing)


def test_merge_lists_what_can_be_used_then_what_can_be_got() -> None:
    catalogue = [
        ModelInfo("qwen", "Qwen", 400, fit="ram", fit_reason="needs 1 GiB"),
        ModelInfo("llama", "Llama", 5000, fit="no"),
    ]
    rows = merge(["default", "qwen"], LocalListing({"qwen": 399, "mine.gguf": 7}, catalogue))
    assert [(m.name, m.served, m.installed) for m in rows] == [
        ("default", True, True),
        ("qwen", True, True),
        ("mine.gguf", False, True),
        ("llama", False, False),
    ]
    assert rows[1].size_bytes == 399 and rows[1].fit_label == "fits (CPU)"
    assert rows[3].fit_label == "too big" and rows[3].size_label == "5.0 KB"
    assert [m.name for m in merge(["a"], None)] == ["a"]


# -- the window ---------------------------------------------------------------------------


@pytest.fixture
def server():
    with serve_models(ModelServer()) as s:
        yield s


def make_app(qtbot, data_dir: Path, url: str, local: LocalModels | None = None) -> WarmstartApp:
    class App(WarmstartApp):
        def _local_models(self) -> LocalModels | None:
            return local

    app = App(Options(data_dir=data_dir, base_url=url, autostart=False))
    qtbot.addWidget(app.window)
    app.start()
    qtbot.waitUntil(lambda: app.connection.ready, timeout=WAIT)
    qtbot.waitUntil(lambda: app.window.models.models != [], timeout=WAIT)
    app.window.models_dock.raise_()
    return app


def pick(qtbot, app: WarmstartApp, name: str, button: str = "use") -> None:
    picker = app.window.models
    picker.select(name)
    assert picker.selected() == name
    widget = {"use": picker.use_button, "download": picker.download_button}[button]
    assert widget.isEnabled()
    qtbot.mouseClick(widget, Qt.MouseButton.LeftButton)


def send(qtbot, app: WarmstartApp, text: str) -> None:
    view = app.window.chat
    qtbot.keyClicks(view.composer, text)
    with qtbot.waitSignal(app.chat.reply_finished, timeout=WAIT):
        qtbot.keyClick(view.composer, Qt.Key.Key_Return)


def health_polls(qtbot, app: WarmstartApp, n: int = 2) -> None:
    """The health checks that used to wipe the error banner, without waiting 3 s each."""
    for _ in range(n):
        with qtbot.waitSignal(app.connection.message, timeout=WAIT):
            app.connection.check()


def state_of(app: WarmstartApp, name: str) -> str:
    picker = app.window.models
    row = next(i for i, m in enumerate(picker.models) if m.name == name)
    return picker.table.item(row, 3).text()


def test_picking_the_other_model_switches_it(qtbot, server, app_data):
    server.hold = threading.Event()
    app = make_app(qtbot, app_data, server.url)
    view, picker = app.window.chat, app.window.models
    assert [m.name for m in picker.models] == ["default", "other"]
    send(qtbot, app, "hi")
    assert server.chats == ["default"]  # nothing picked yet: the server's default
    pick(qtbot, app, "other")
    qtbot.waitUntil(lambda: server.loads == ["other"], timeout=WAIT)
    # while it loads: busy, and nothing can be sent
    assert not view.send_button.isEnabled() and view.progress_banner.isVisible()
    assert "Loading other" in picker.current_label.text()
    assert state_of(app, "other") == "loading…" and not picker.use_button.isEnabled()
    qtbot.keyClicks(view.composer, "too early")
    qtbot.keyClick(view.composer, Qt.Key.Key_Return)
    assert len(server.chats) == 1 and view.composer.toPlainText() == "too early"
    server.hold.set()
    qtbot.waitUntil(lambda: app.models.current == "other", timeout=WAIT)
    assert view.send_button.isEnabled() and not view.progress_banner.isVisible()
    assert state_of(app, "other") == "in use" and "In use: other" in picker.current_label.text()
    assert "Switched to other" in app.window.status_label.text()
    view.composer.clear()
    send(qtbot, app, "and now?")
    assert server.chats[-1] == "other"
    assert app.store.messages(app.chat.current)[-1].content.strip() == "Hello from other."
    assert not view.error_banner.isVisible()
    app.window.close()
    # the choice is remembered: the next run names it from the start
    again = make_app(qtbot, app_data, server.url)
    assert again.prefs.model == "other" and again.models.current == "other"
    send(qtbot, again, "still you?")
    assert server.chats[-1] == "other"
    again.window.close()


@pytest.mark.parametrize(
    ("status", "reason"),
    [(404, "the server does not have it"), (500, "not enough memory to load 'other'")],
)
def test_a_failed_switch_keeps_its_reason_until_dismissed(qtbot, server, app_data, status, reason):
    server.load_error = status
    app = make_app(qtbot, app_data, server.url)
    view = app.window.chat
    pick(qtbot, app, "other")
    qtbot.waitUntil(view.error_banner.isVisible, timeout=WAIT)
    text = view.error_banner.label.text()
    assert "Could not switch to other" in text and reason in text, text
    assert "Still using the server's default model" in text
    assert app.models.current == "" and app.prefs.model == ""
    assert view.send_button.isEnabled() and not view.progress_banner.isVisible()
    health_polls(qtbot, app)
    assert view.error_banner.isVisible() and view.error_banner.label.text() == text
    send(qtbot, app, "hi")  # replies go on with the model that was there
    assert server.chats == ["default"] and view.error_banner.isVisible()
    qtbot.mouseClick(view.error_banner.dismiss_button, Qt.MouseButton.LeftButton)
    assert not view.error_banner.isVisible()
    app.window.close()


def test_a_reply_error_is_not_wiped_by_the_next_health_check(qtbot, server, app_data):
    """The bug: a model the server does not have made every send fail with a 404, and
    the reason vanished at the next health poll."""
    app = make_app(qtbot, app_data, server.url)
    pick(qtbot, app, "other")
    qtbot.waitUntil(lambda: app.models.current == "other", timeout=WAIT)
    server.models.remove("other")  # removed on the server behind the app's back
    view = app.window.chat
    send(qtbot, app, "hi")
    assert view.error_banner.isVisible()
    text = view.error_banner.label.text()
    assert "not available on the server" in text and "other" in text, text
    health_polls(qtbot, app)
    assert view.error_banner.isVisible() and view.error_banner.label.text() == text
    qtbot.mouseClick(view.error_banner.dismiss_button, Qt.MouseButton.LeftButton)
    assert not view.error_banner.isVisible()
    app.window.close()


def test_a_server_without_the_load_route_gets_the_name_in_requests(qtbot, server, app_data):
    server.load_route = False
    app = make_app(qtbot, app_data, server.url)
    pick(qtbot, app, "other")
    qtbot.waitUntil(lambda: app.models.current == "other", timeout=WAIT)
    assert "this server loads the model a request names" in app.window.status_label.text()
    assert not app.window.chat.error_banner.isVisible()
    send(qtbot, app, "hi")
    assert server.chats == ["other"]
    assert app.store.messages(app.chat.current)[-1].content.strip() == "Hello from other."
    app.window.close()


def test_a_model_the_server_lacks_is_not_named_in_requests(qtbot, server, app_data):
    """A model picked on another server (or an older app's GGUF path) would make every
    reply a 404: requests use the server's default until a model of its own is picked."""
    app = make_app(qtbot, app_data, server.url)
    app.apply_preferences(replace(app.prefs, model="/home/me/model.gguf"))
    app.window.close()
    again = make_app(qtbot, app_data, server.url)
    qtbot.waitUntil(lambda: again.models.current == "", timeout=WAIT)
    send(qtbot, again, "hi")
    assert server.chats == ["default"] and not again.window.chat.error_banner.isVisible()
    again.window.close()


# -- downloads ----------------------------------------------------------------------------


@pytest.fixture
def hub(monkeypatch):
    with serve_hub(Hub()) as h:
        monkeypatch.setenv("HF_ENDPOINT", h.url)
        monkeypatch.setenv("HF_HUB_OFFLINE", "0")
        yield h


def local_models(tmp_path: Path, sha256: str | None) -> LocalModels:
    local = LocalModels(tmp_path / "models", tmp_path / "cache")
    base = local.manager.catalogue["qwen2.5-0.5b"]
    tiny = replace(
        base, name="tiny", title="Tiny", repo=REPO, revision="main", file="tiny.gguf",
        size_bytes=len(TINY), sha256=sha256,
    )  # fmt: skip
    local.manager.catalogue = {"tiny": tiny, "qwen2.5-0.5b": base}
    return local


def test_a_download_shows_progress_can_be_cancelled_and_resumes(
    qtbot, server, hub, app_data, tmp_path
):
    sha = hub.add_hub_file(REPO, "tiny.gguf", TINY)
    hub.throttle = 0.05  # 64 pieces of 64 KiB: about three seconds
    local = local_models(tmp_path, sha)
    app = make_app(qtbot, app_data, server.url, local)
    picker = app.window.models
    assert picker.download_button.isVisible() and not picker.cancel_button.isVisible()
    assert (
        state_of(app, "tiny") == ""
        and "fits" in picker.table.item([m.name for m in picker.models].index("tiny"), 2).text()
    )
    fractions: list[object] = []
    app.models.download_progress.connect(lambda _n, f: fractions.append(f))
    pick(qtbot, app, "tiny", "download")
    qtbot.waitUntil(lambda: 0 < picker.progress.value() < 1000, timeout=WAIT)
    assert picker.progress.isVisible() and picker.cancel_button.isVisible()
    assert state_of(app, "tiny") == "downloading…" and not picker.download_button.isEnabled()
    qtbot.mouseClick(picker.cancel_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not app.models.downloading, timeout=WAIT)
    assert "Stopped downloading tiny" in app.window.status_label.text()
    assert not picker.progress.isVisible() and not app.window.chat.error_banner.isVisible()
    part = local.models_dir / "tiny.gguf.part"
    kept = part.stat().st_size
    assert 0 < kept < len(TINY) and not (local.models_dir / "tiny.gguf").exists()
    # again: it resumes where it stopped, and the model is installed
    hub.throttle = 0.0
    pick(qtbot, app, "tiny", "download")
    qtbot.waitUntil(lambda: (local.models_dir / "tiny.gguf").exists(), timeout=WAIT)
    qtbot.waitUntil(lambda: state_of(app, "tiny") == "installed", timeout=WAIT)
    assert hub.ranges[-1] == f"bytes={kept}-"
    assert (local.models_dir / "tiny.gguf").read_bytes() == TINY
    assert sorted(f for f in fractions if isinstance(f, float))[-1] == 1.0
    picker.select("tiny")
    assert picker.use_button.isEnabled() and not picker.download_button.isEnabled()
    app.window.close()


def test_a_failed_download_keeps_its_reason_until_dismissed(qtbot, server, hub, app_data, tmp_path):
    hub.add_hub_file(REPO, "tiny.gguf", TINY)
    app = make_app(qtbot, app_data, server.url, local_models(tmp_path, "0" * 64))
    view = app.window.chat
    pick(qtbot, app, "tiny", "download")
    qtbot.waitUntil(view.error_banner.isVisible, timeout=WAIT)
    text = view.error_banner.label.text()
    assert "Could not download tiny" in text and "SHA-256" in text, text
    health_polls(qtbot, app)
    assert view.error_banner.label.text() == text and view.error_banner.isVisible()
    assert state_of(app, "tiny") == "" and not list((tmp_path / "models").glob("tiny*"))
    qtbot.mouseClick(view.error_banner.dismiss_button, Qt.MouseButton.LeftButton)
    assert not view.error_banner.isVisible()
    app.window.close()


def test_no_downloads_for_a_server_elsewhere(qtbot, server, app_data):
    app = make_app(qtbot, app_data, server.url)
    picker = app.window.models
    assert [m.name for m in picker.models] == ["default", "other"]  # no catalogue
    assert not picker.download_button.isEnabled() and "local server" in picker.note.text()
    assert app.models.download("qwen2.5-0.5b") is False
    app.window.close()


def test_closing_the_window_stops_a_download(qtbot, server, hub, app_data, tmp_path):
    hub.add_hub_file(REPO, "tiny.gguf", TINY)
    hub.throttle = 0.05
    local = local_models(tmp_path, None)
    app = make_app(qtbot, app_data, server.url, local)
    pick(qtbot, app, "tiny", "download")
    qtbot.waitUntil(lambda: app.window.models.progress.value() > 0, timeout=WAIT)
    app.window.close()
    part = local.models_dir / "tiny.gguf.part"
    assert 0 < part.stat().st_size < len(TINY)  # stopped, kept for the next run
    assert not (local.models_dir / "tiny.gguf").exists()


def test_server_down_shows_until_it_is_back_and_other_reasons_stay(qtbot, fake_server, app_data):
    """Errors stay until dismissed, except "the server is not answering", which the
    connection clears itself when the server is back (the slow real-server test checks
    the same on the real model)."""
    ws = fake_server()
    app = make_app(qtbot, app_data, ws.url)
    view = app.window.chat
    ws.stop()
    qtbot.keyClicks(view.composer, "are you there?")
    qtbot.keyClick(view.composer, Qt.Key.Key_Return)
    qtbot.waitUntil(view.error_banner.isVisible, timeout=WAIT)
    assert "not answering" in view.error_banner.label.text()
    view.show_error("a model's reason", "models")  # newer: shown over the connection's
    assert view.error_banner.label.text() == "a model's reason"
    qtbot.mouseClick(view.error_banner.dismiss_button, Qt.MouseButton.LeftButton)
    assert "not answering" in view.error_banner.label.text()  # the older one again
    ws.start()
    qtbot.waitUntil(lambda: app.connection.ready, timeout=WAIT)
    qtbot.waitUntil(lambda: not view.error_banner.isVisible(), timeout=WAIT)
    app.window.close()
