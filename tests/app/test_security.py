"""The app on a shared desktop: it talks only to the server it started (or one the user
configured), keeps keys out of its database and off command lines, and writes files
only its user can read. See docs/security.md."""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import stat
import sys
import threading
import time
from http.server import ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from warmstart.app.core.api import ApiClient
from warmstart.app.core.errors import AppError, ServerUnavailable, UntrustedServer
from warmstart.app.core.launcher import LOG_BACKUPS, LOG_BYTES, LocalServer, serve_command
from warmstart.app.core.migrations import MIGRATIONS, migrate
from warmstart.app.core.preferences import Preferences
from warmstart.app.core.secret_store import ACCOUNT, FALLBACK_FILE, SERVICE, KeyringOrFile
from warmstart.app.core.store import ConversationStore
from warmstart.app.core.types import Finished, Sampling
from warmstart.app.qt.application import Options, WarmstartApp

from tests.app.impostor import Impostor
from tests.app.jsonhttp import JSONHandler
from tests.app.servers import ROOT, free_port
from tests.conftest import seed_calibration

WAIT = 30_000
KEY = "s3cret-remote-key-0123456789"


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def loose_umask():
    """A umask that would make files world-readable: the app must not depend on main's."""
    before = os.umask(0o022)
    yield
    os.umask(before)


@pytest.fixture
def fake_server_cmd(monkeypatch):
    """The app's local server is the runtime's fake, started by the app itself."""
    command = f"{sys.executable} -m warmstart.runtime.api --fake --port {{port}}"
    monkeypatch.setenv("WARMSTART_APP_SERVER_CMD", command)
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.delenv("WARMSTART_API_KEY", raising=False)


def managed_app(qtbot, data_dir: Path, port: int) -> WarmstartApp:
    """The app as a user starts it: it runs its own server on a loopback port."""
    options = Options(data_dir=data_dir, base_url=f"http://127.0.0.1:{port}/v1", autostart=True)
    app = WarmstartApp(options)
    qtbot.addWidget(app.window)
    return app


def type_and_send(qtbot, app: WarmstartApp, text: str) -> None:
    from PySide6.QtCore import Qt

    composer = app.window.chat.composer
    qtbot.keyClicks(composer, text)
    qtbot.keyClick(composer, Qt.Key.Key_Return)


# -- the app refuses an impostor on its port ---------------------------------------------


@pytest.mark.gui
@pytest.mark.parametrize("demand_key", [False, True], ids=["accepts-anything", "demands-a-key"])
def test_an_impostor_on_the_apps_port_gets_no_message_and_no_key(
    qtbot, app_data, fake_server_cmd, demand_key
):
    impostor = Impostor(demand_key=demand_key).start()
    try:
        app = managed_app(qtbot, app_data, impostor.port)
        app.start()
        view = app.window.chat
        qtbot.waitUntil(lambda: view.error_banner.isVisible(), timeout=WAIT)
        assert "Refused the server" in view.error_banner.label.text()
        assert app.connection.state == "down" and app.connection.local is None
        type_and_send(qtbot, app, "my bank password is hunter2")
        qtbot.wait(1500)  # a few polls: still refused, the message still waits
        assert app.connection.state == "down"
        assert "Refused the server" in view.error_banner.label.text()
        posted = [s for s in impostor.seen if s.method != "GET" or s.body]
        assert posted == []
        assert not impostor.received("hunter2")
        assert not impostor.received(app.server.key)
        assert all("authorization" not in s.headers for s in impostor.seen)
        assert impostor.seen  # it was asked, and found out
        app.window.close()
    finally:
        impostor.stop()


@pytest.mark.gui
@pytest.mark.skipif(not hasattr(socket, "AF_UNIX"), reason="no Unix sockets")
def test_an_impostor_that_takes_the_port_when_the_apps_server_dies_gets_nothing(
    qtbot, app_data, fake_server_cmd
):
    """The app's server dies and another program binds its port at once: the app's
    next message, and every call after it, goes to the socket in the app's data
    folder, where nobody listens now, and not to the impostor."""
    port = free_port()
    app = managed_app(qtbot, app_data, port)
    app.start()
    qtbot.waitUntil(lambda: app.connection.ready, timeout=WAIT)
    with qtbot.waitSignal(app.chat.reply_finished, timeout=WAIT):
        type_and_send(qtbot, app, "hi")
    assert (app_data / "server.sock").exists()
    local = app.connection.local
    os.kill(local.pid, signal.SIGKILL)
    local._proc.wait(10)
    impostor = Impostor(at_port=port).start()  # the moment the port is free
    try:
        type_and_send(qtbot, app, "my bank password is hunter2")
        qtbot.wait(4000)  # health, stats and session polls come and go meanwhile
        assert not impostor.received("hunter2")
        assert not impostor.received(app.server.key)
        # at most the plain /health that finds it out: no key, no text, no other call
        assert all((q.method, q.path, q.body) == ("GET", "/health", b"") for q in impostor.seen)
        assert all("authorization" not in q.headers for q in impostor.seen)
        qtbot.waitUntil(lambda: app.window.chat.error_banner.isVisible(), timeout=WAIT)
        assert app.connection.state == "down"
        app.window.close()
    finally:
        impostor.stop()
    assert not (app_data / "server.sock").exists()


@pytest.mark.skipif(not hasattr(socket, "AF_UNIX"), reason="no Unix sockets")
def test_a_server_that_starts_between_the_socket_and_the_port_probe_is_trusted(tmp_path):
    """The app's server listens on its socket, then on its port. A health poll that
    finds the socket refused and, a moment later, the port answering has seen the
    server start: the socket answers when asked again (CI once saw this as refused)."""
    import socketserver

    class Ours(JSONHandler):
        def do_GET(self) -> None:
            self._send(200, {"status": "ok", "model": "ours"})

    class UnixHTTP(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
        daemon_threads = True

    path = str(tmp_path / "server.sock")
    ours = UnixHTTP(path, Ours, bind_and_activate=False)
    ours.server_bind()  # bound, not listening yet: a connect is refused

    class StartsTheSocket(JSONHandler):
        def do_GET(self) -> None:  # the port comes up after the socket
            ours.server_activate()
            threading.Thread(target=ours.serve_forever, daemon=True).start()
            self._send(200, {"status": "ok", "model": "ours"})

    port_side = ThreadingHTTPServer(("127.0.0.1", 0), StartsTheSocket)
    threading.Thread(target=port_side.serve_forever, daemon=True).start()
    port = port_side.server_address[1]
    api = ApiClient(f"http://127.0.0.1:{port}/v1", verify=True, uds=path)
    try:
        assert api.health().model == "ours"
    finally:
        api.close()
        port_side.shutdown()
        port_side.server_close()
        ours.shutdown()
        ours.server_close()


def test_without_a_socket_the_app_checks_its_server_before_every_keyed_request(
    tmp_path, monkeypatch
):
    """The fallback where there are no Unix sockets (Windows): the port, and before
    each request with the key, a look at who listens there."""
    monkeypatch.delenv("WARMSTART_API_KEY", raising=False)
    monkeypatch.delenv("WARMSTART_UNIX_SOCKET", raising=False)
    port, key = free_port(), "fallback-key-0123456789"
    command = [sys.executable, "-m", "warmstart.runtime.api", "--fake", "--port", str(port)]
    server = LocalServer(command, tmp_path / "server.log", {"PYTHONPATH": str(ROOT)}, api_key=key)
    api = ApiClient(
        f"http://127.0.0.1:{port}/v1",
        api_key=key,
        verify=True,
        before_key=lambda: server.check_listening(port),
    )
    server.start()
    try:
        server.wait_ready(api.health, timeout=60)
        assert api.sessions() == []
        os.kill(server.pid, signal.SIGKILL)
        server._proc.wait(10)
        impostor = Impostor(at_port=port).start()
        try:
            with pytest.raises(UntrustedServer):
                api.sessions()
            stream = api.chat(
                [{"role": "user", "content": "hunter2"}],
                session_id="c",
                model=None,
                sampling=Sampling(),
            )
            with pytest.raises(UntrustedServer):
                list(stream)
            assert impostor.seen == []
        finally:
            impostor.stop()
    finally:
        api.close()
        server.stop()


def test_verify_sends_the_key_only_to_a_server_that_refuses_requests_without_it():
    seen: list[httpx.Request] = []

    def accepts_anything(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"data": []})

    api = ApiClient(
        "http://127.0.0.1:9/v1",
        api_key="k" * 20,
        transport=httpx.MockTransport(accepts_anything),
        verify=True,
    )
    with pytest.raises(UntrustedServer, match="without the app's key"):
        api.models()
    with pytest.raises(UntrustedServer):
        list(
            api.chat(
                [{"role": "user", "content": "x"}], session_id="c", model=None, sampling=Sampling()
            )
        )
    assert seen and all("authorization" not in r.headers for r in seen)
    assert all(r.method == "GET" for r in seen)


def keyed_server(key: str):
    """A MockTransport server that holds ``key``, as ``warmstart serve --api-key-file``."""

    def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/health":
            return httpx.Response(200, json={"status": "ok"})
        if request.headers.get("authorization") != f"Bearer {key}":
            return httpx.Response(401, json={"error": {"message": "incorrect API key"}})
        return httpx.Response(200, json={"data": [{"id": "m"}]})

    return httpx.MockTransport(handle)


def test_verify_refuses_a_server_with_another_key_and_trusts_the_one_with_ours():
    ours = "k" * 20
    other = ApiClient(
        "http://127.0.0.1:9/v1", api_key=ours, transport=keyed_server("x" * 20), verify=True
    )
    with pytest.raises(UntrustedServer, match="does not accept the app's key"):
        other.models()
    other.close()
    mine = ApiClient(
        "http://127.0.0.1:9/v1", api_key=ours, transport=keyed_server(ours), verify=True
    )
    assert mine.health().ready
    assert mine.models() == ["m"]
    mine.close()


def test_verify_runs_the_owner_check_before_any_request():
    seen: list[httpx.Request] = []

    def refuse() -> None:
        raise UntrustedServer("http://127.0.0.1:9/v1", "the app did not start it")

    api = ApiClient(
        "http://127.0.0.1:9/v1",
        api_key="k" * 20,
        transport=httpx.MockTransport(lambda r: seen.append(r) or httpx.Response(401)),
        verify=True,
        before_key=refuse,
    )
    with pytest.raises(UntrustedServer):
        api.sessions()
    assert seen == []


def test_a_local_server_that_is_not_listening_is_not_trusted(tmp_path):
    impostor = Impostor().start()
    idle = LocalServer(
        [sys.executable, "-c", "import time; time.sleep(30)"], tmp_path / "server.log"
    )
    idle.start()
    try:
        with pytest.raises(UntrustedServer, match="another process"):
            idle.check_listening(impostor.port)
    finally:
        idle.stop()
        impostor.stop()
    with pytest.raises(UntrustedServer, match="not running"):
        idle.check_listening(impostor.port)


# -- the key the app gives its server ----------------------------------------------------


@pytest.mark.gui
def test_the_apps_server_gets_a_fresh_key_off_its_command_line(
    qtbot, app_data, fake_server_cmd, loose_umask
):
    port = free_port()
    app = managed_app(qtbot, app_data, port)
    app.start()
    qtbot.waitUntil(lambda: app.connection.ready, timeout=WAIT)
    key = app.server.key
    assert len(key) >= 32 and key not in (app.prefs.api_key, "")
    pid = app.connection.local.pid
    if Path(f"/proc/{pid}/cmdline").exists():
        assert key.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes()
        assert key.encode() not in Path(f"/proc/{pid}/environ").read_bytes()
    # the server holds the key: without it, 401; with it, served
    root = f"http://127.0.0.1:{port}/v1/models"
    assert httpx.get(root, timeout=5).status_code == 401
    assert httpx.get(root, headers={"Authorization": f"Bearer {key}"}, timeout=5).status_code == 200
    assert not (app_data / "server-key").exists()  # read at its start, then removed
    with qtbot.waitSignal(app.chat.reply_finished, timeout=WAIT):
        type_and_send(qtbot, app, "hi")
    log = app_data / "server.log"
    assert log.exists() and mode(log) == 0o600
    assert mode(app_data) == 0o700
    app.window.close()
    assert not app.connection.local.running


def test_no_command_line_the_app_builds_holds_a_key():
    from warmstart.app.tools.screenshots import server_command

    lines = [serve_command(8765), server_command(8765, Path("/d"), "m", None)]
    for line in lines:
        assert not any("key" in part.lower() for part in line), line


def test_the_key_file_is_private_and_is_removed_on_stop(tmp_path, loose_umask):
    script = "import os, sys, time; print(open(os.environ['WARMSTART_API_KEY_FILE']).read())"
    server = LocalServer(
        [sys.executable, "-c", script + "; sys.stdout.flush(); time.sleep(30)"],
        tmp_path / "server.log",
        {"WARMSTART_API_KEY": "from-the-environment"},
        api_key="fresh-key-1234567890",
    )
    server.start()
    try:
        key_file = tmp_path / "server-key"
        assert mode(key_file) == 0o600
        log = tmp_path / "server.log"
        deadline = time.monotonic() + 20
        while "fresh-key" not in (log.read_text() if log.exists() else ""):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert "from-the-environment" not in log.read_text()
    finally:
        server.stop()
    assert not key_file.exists()


def test_the_server_log_is_rotated_and_private(tmp_path, loose_umask):
    line = "x" * 99
    script = f"import sys\nfor _ in range(40_000): print({line!r})"
    server = LocalServer([sys.executable, "-c", script], tmp_path / "server.log")
    server.start()
    server._proc.wait(60)
    server._reader.join(60)
    logs = sorted(tmp_path.glob("server.log*"))
    assert [p.name for p in logs] == ["server.log", "server.log.1", "server.log.2"][
        : 1 + LOG_BACKUPS
    ]
    assert all(p.stat().st_size <= LOG_BYTES + 200 for p in logs)
    assert all(mode(p) == 0o600 for p in logs)


# -- the configured server's key: keyring or a 0600 file, never the database -------------


class MemoryKeyring:
    """A keyring backend that works (like the Secret Service would)."""

    priority = 5

    def __init__(self) -> None:
        self.items: dict[tuple[str, str], str] = {}

    def get_password(self, service: str, user: str) -> str | None:
        return self.items.get((service, user))

    def set_password(self, service: str, user: str, value: str) -> None:
        self.items[(service, user)] = value

    def delete_password(self, service: str, user: str) -> None:
        self.items.pop((service, user))


class BrokenKeyring(MemoryKeyring):
    def set_password(self, service: str, user: str, value: str) -> None:
        raise RuntimeError("org.freedesktop.secrets was not provided by any .service files")


def test_keyring_backends_and_the_fallback_file(tmp_path, loose_umask):
    import keyring
    from keyring.backends import fail, null

    for backend in (fail.Keyring(), null.Keyring()):
        keyring.set_keyring(backend)
        store = KeyringOrFile(tmp_path)
        assert not store.in_keyring
        store.set(KEY)
        assert store.get() == KEY and mode(tmp_path / FALLBACK_FILE) == 0o600
        store.set("")
        assert store.get() == "" and not (tmp_path / FALLBACK_FILE).exists()

    memory = MemoryKeyring()
    store = KeyringOrFile(tmp_path, memory)
    store.set(KEY)
    assert memory.items == {(SERVICE, ACCOUNT): KEY} and not (tmp_path / FALLBACK_FILE).exists()
    assert store.get() == KEY
    store.set("")
    assert memory.items == {}

    broken = KeyringOrFile(tmp_path, BrokenKeyring())
    broken.set(KEY)  # falls back, with a warning
    assert not broken.in_keyring and (tmp_path / FALLBACK_FILE).read_text() == KEY


def _old_database(path: Path, key: str) -> None:
    """A database as versions before 0006 left it: the key as plain JSON."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("CREATE TABLE migrations (name TEXT PRIMARY KEY, applied REAL NOT NULL)")
    for name, step in MIGRATIONS:
        if name.startswith("0006"):
            break
        assert isinstance(step, str)
        conn.executescript(step)
        conn.execute("INSERT INTO migrations VALUES (?, 0)", (name,))
    conn.execute("INSERT INTO preferences VALUES ('api_key', ?)", (json.dumps(key),))
    conn.execute("INSERT INTO preferences VALUES ('base_url', ?)", (json.dumps("http://nas:1/v1"),))
    conn.close()


def _on_disk(path: Path) -> bytes:
    parts = [path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")]
    return b"".join(p.read_bytes() for p in parts if p.exists())


def test_migration_moves_a_plain_key_out_of_the_database(tmp_path):
    path = tmp_path / "conversations.db"
    _old_database(path, KEY)
    assert KEY.encode() in path.read_bytes()
    secrets = KeyringOrFile(tmp_path, MemoryKeyring())
    store = ConversationStore(path, secrets)
    assert secrets.get() == KEY
    assert store.preference("api_key") is None
    prefs = Preferences.load(store, secrets)
    assert prefs.api_key == KEY and prefs.base_url == "http://nas:1/v1"
    assert KEY.encode() not in _on_disk(path)
    store.close()
    assert KEY.encode() not in _on_disk(path)
    assert migrate(sqlite3.connect(path, isolation_level=None)) == []


@pytest.mark.gui
def test_the_app_keeps_a_configured_key_out_of_its_database(qtbot, app_data, loose_umask):
    from dataclasses import replace

    app = WarmstartApp(Options(data_dir=app_data, base_url="http://127.0.0.1:9/v1"))
    qtbot.addWidget(app.window)
    app.apply_preferences(replace(app.prefs, api_key=KEY, autostart=False))
    app.shutdown()
    assert KEY.encode() not in _on_disk(app_data / "conversations.db")
    assert (app_data / FALLBACK_FILE).read_text() == KEY  # keyring's fail backend here
    assert mode(app_data / FALLBACK_FILE) == 0o600
    again = WarmstartApp(Options(data_dir=app_data))
    qtbot.addWidget(again.window)
    assert again.prefs.api_key == KEY
    assert not again.manages_local_server  # a configured key: the user's own server
    again.shutdown()


# -- data at rest --------------------------------------------------------------------------


@pytest.mark.gui
def test_every_file_the_app_writes_is_private(qtbot, app_data, fake_server, loose_umask):
    # an older version's leftovers, world-readable
    app_data.mkdir(mode=0o755)
    app_data.chmod(0o755)
    for name in ("conversations.db", "window.ini", "server.log"):
        (app_data / name).touch()
        (app_data / name).chmod(0o644)
    server = fake_server()
    app = WarmstartApp(Options(data_dir=app_data, base_url=server.url, autostart=False))
    qtbot.addWidget(app.window)
    app.start()
    qtbot.waitUntil(lambda: app.connection.ready, timeout=WAIT)
    with qtbot.waitSignal(app.chat.reply_finished, timeout=WAIT):
        type_and_send(qtbot, app, "a private thought")
    db = app_data / "conversations.db"
    running = {p.name: mode(p) for p in app_data.iterdir()}
    assert {"conversations.db-wal", "conversations.db-shm"} <= set(running)
    assert mode(app_data) == 0o700
    app.window.close()
    after = {p.name: mode(p) for p in app_data.iterdir()}
    assert set(running.values()) == {0o600}, running
    assert set(after.values()) == {0o600}, after
    assert "window.ini" in after and db.exists()


@pytest.mark.slow
def test_warmstart_serve_started_like_the_app_does_takes_the_key_from_the_file(
    tmp_path, model_path, monkeypatch
):
    """The real server, with the command line and environment the app builds."""
    from warmstart.app.core.launcher import new_key

    monkeypatch.delenv("WARMSTART_API_KEY", raising=False)
    port, key = free_port(), new_key()
    env = {
        "PYTHONPATH": str(ROOT),
        "WARMSTART_DATA_DIR": str(tmp_path / "data"),
        "WARMSTART_MODEL": str(model_path),
        "WARMSTART_N_CTX": "1024",
        "WARMSTART_PREWARM_SESSIONS": "0",
    }
    server = LocalServer(serve_command(port), tmp_path / "app" / "server.log", env, api_key=key)
    (tmp_path / "app").mkdir(mode=0o700)
    api = ApiClient(
        f"http://127.0.0.1:{port}/v1",
        api_key=key,
        verify=True,
        before_key=lambda: server.check_listening(port),
    )
    server.start()
    try:
        server.wait_ready(api.health, timeout=300)
        api.verify()
        assert api.models()
        cmdline = Path(f"/proc/{server.pid}/cmdline")
        if cmdline.exists():
            assert key.encode() not in cmdline.read_bytes()
        assert httpx.get(f"{api.base_url}/models", timeout=5).status_code == 401
    finally:
        api.close()
        server.stop()


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(socket, "AF_UNIX"), reason="no Unix sockets")
def test_the_real_server_started_like_the_app_does_leaves_an_impostor_nothing(
    tmp_path, model_path, calibration, monkeypatch
):
    """``warmstart serve`` on the real model, with the socket, key and environment the
    app gives it: killed, and its port taken at once, the app's next message and
    calls go nowhere, and the impostor gets none of them."""
    from warmstart.app.core.launcher import new_key, socket_path_for

    monkeypatch.delenv("WARMSTART_API_KEY", raising=False)
    port, key = free_port(), new_key()
    app_dir = tmp_path / "app"
    app_dir.mkdir(mode=0o700)
    sock = socket_path_for(app_dir)
    seed_calibration(calibration, tmp_path / "data")
    env = {
        "PYTHONPATH": str(ROOT),
        "WARMSTART_DATA_DIR": str(tmp_path / "data"),
        "WARMSTART_MODEL": str(model_path),
        "WARMSTART_N_CTX": "1024",
        "WARMSTART_PREWARM_SESSIONS": "0",
    }
    server = LocalServer(
        serve_command(port), app_dir / "server.log", env, api_key=key, socket_path=sock
    )
    # no owner check (before_key): the socket alone must keep the impostor out
    api = ApiClient(f"http://127.0.0.1:{port}/v1", api_key=key, verify=True, uds=str(sock))
    chat = {"session_id": "c1", "model": None, "sampling": Sampling(max_tokens=4)}
    server.start()
    try:
        server.wait_ready(api.health, timeout=300)
        assert sock is not None and mode(sock) == 0o600
        assert isinstance(
            list(api.chat([{"role": "user", "content": "Say hi."}], **chat))[-1], Finished
        )
        os.kill(server.pid, signal.SIGKILL)
        server._proc.wait(30)
        impostor = Impostor(at_port=port).start()
        try:
            with pytest.raises(ServerUnavailable):
                list(api.chat([{"role": "user", "content": "hunter2"}], **chat))
            for call in (api.stats, api.sessions, lambda: api.prewarm("c1")):
                with pytest.raises(AppError):  # unavailable, then (checked again) refused
                    call()
            with pytest.raises(UntrustedServer, match="another program"):
                api.health()  # without the key: this finds the impostor out
            assert not impostor.received("hunter2") and not impostor.received(key)
            assert [(s.method, s.path) for s in impostor.seen] == [("GET", "/health")]
        finally:
            impostor.stop()
    finally:
        api.close()
        server.stop()
    assert not sock.exists()


@pytest.mark.skipif(not hasattr(socket, "AF_UNIX"), reason="no Unix sockets")
def test_a_data_dir_too_long_for_a_socket_gets_a_private_temporary_folder(tmp_path):
    from warmstart.app.core.launcher import MAX_SOCKET_PATH, socket_path_for

    short = socket_path_for(tmp_path)
    assert short == tmp_path / "server.sock"
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    path = socket_path_for(deep)
    assert path is not None and len(os.fsencode(str(path))) <= MAX_SOCKET_PATH
    assert path.parent != deep and mode(path.parent) == 0o700
    assert path.parent.stat().st_uid == os.getuid()
    server = LocalServer([sys.executable, "-c", "pass"], tmp_path / "server.log", socket_path=path)
    server.start()
    server._proc.wait(30)
    server.stop()
    assert not path.parent.exists()  # the folder made for it goes with it


def test_a_refused_connect_to_the_socket_leaves_no_socket_open(tmp_path):
    """The app's server is gone but its socket file is there (a crash, a server being
    stopped while the app polls): the request fails as the server unavailable, and the
    socket of the failed connect is closed at once. httpcore leaves it to the garbage
    collector, whose ResourceWarning then lands in whatever runs next (a GUI test's
    teardown, under load)."""
    import gc

    path = tmp_path / "gone.sock"
    bound = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    bound.bind(str(path))  # bound, never listening: every connect is refused
    api = ApiClient("http://127.0.0.1:9/v1", uds=str(path))
    try:
        gc.collect()
        before = len(os.listdir("/proc/self/fd"))
        for _ in range(3):
            with pytest.raises(ServerUnavailable):
                api.health()
        assert len(os.listdir("/proc/self/fd")) == before
    finally:
        api.close()
        bound.close()
