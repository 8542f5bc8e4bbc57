"""Running the app under uvicorn, and the bind rule: off loopback only with a key."""

from __future__ import annotations

import contextlib
import errno
import gc
import ipaddress
import logging
import signal
import socket
import threading
from collections.abc import Callable, Iterator
from types import FrameType

import uvicorn

from ..errors import ConfigError
from ..serving import Runtime
from ..settings import Settings
from ..users import KeyBook, read_users
from . import _logs
from ._app import create_app
from ._notify import notify_when_ready
from ._protocol import LISTEN_QUEUE, ConnectionLimits, fd_budget, per_client_bound, protocol_class
from ._state import Opener
from ._unix import UnixListener, bind_unix

log = logging.getLogger(__name__)


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and "localhost"; any other name counts as exposed."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name could resolve anywhere


def check_bind(settings: Settings) -> None:
    """Raises ConfigError when the server would be reachable from other machines
    without an API key (``api_key``, or a user's in the keys file)."""
    if is_loopback(settings.host) or settings.api_key:
        return
    if not read_users(settings.effective_keys_file):
        raise ConfigError(
            f"host: binding {settings.host!r} exposes the API beyond this machine; "
            "set api_key (WARMSTART_API_KEY or --api-key), add a user's key "
            "(warmstart keys add NAME) or bind 127.0.0.1"
        )


def bind_listener(settings: Settings) -> socket.socket:
    """Checks the bind rule and TLS files, then binds host:port: called before the
    model loads, so that a port in use or an address this machine lacks is reported
    at once, not after seconds of loading. The socket is bound, not listening:
    nobody can connect to a server that cannot answer yet."""
    check_bind(settings)
    check_tls(settings)
    host = settings.host.strip("[]")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    # as uvicorn does: a restart must not wait for the old connections' TIME_WAIT
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, settings.port))
    except OSError as exc:
        sock.close()
        raise ConfigError(_bind_problem(settings, exc)) from exc
    return sock


def _bind_problem(settings: Settings, exc: OSError) -> str:
    where = f"{settings.host}:{settings.port}"
    if exc.errno == errno.EADDRINUSE:
        return f"port: {where} is already in use (another warmstart?); choose another --port"
    if exc.errno == errno.EACCES:
        return f"port: binding {where} is not permitted (ports below 1024 need privileges)"
    if exc.errno in (errno.EADDRNOTAVAIL, socket.EAI_NONAME):
        return f"host: {settings.host!r} is not an address of this machine"
    return f"host/port: cannot bind {where}: {exc.strerror or exc}"


def serve(
    settings: Settings,
    runtime: Runtime,
    *,
    log_level: str = "info",
    sock: socket.socket | None = None,
    opener: Opener | None = None,
    unix: UnixListener | None = None,
    on_ready: Callable[[str], None] | None = None,
) -> None:
    """Serves ``runtime`` on settings.host:settings.port until interrupted (SIGINT or
    SIGTERM), then closes the runtime (close() is idempotent, so a caller may too).
    With ``opener``, requests may switch to another installed model (see _state.py);
    the runtime loaded at the end is the one closed.

    ``sock`` comes from bind_listener() and ``unix`` from bind_unix() (called before
    loading the model); without them the checks and the binds happen here. Raises
    ConfigError before serving anything when the bind rule is broken or an address
    cannot be bound. ``on_ready(model)`` is called once the sockets listen (``warmstart
    serve`` introduces itself then)."""
    if sock is None:
        sock = bind_listener(settings)
    if unix is None:
        unix = bind_unix(settings.unix_socket)
    try:
        # the socket first: once the port answers, so does the socket (a client that
        # finds the port served but not the socket takes it for another program)
        sockets = ([unix.sock] if unix else []) + [sock]
        _serve(settings, runtime, log_level, sockets, opener, on_ready)
    finally:
        if unix is not None:
            unix.close()  # its file goes with it: nobody is left listening there


def _serve(
    settings: Settings,
    runtime: Runtime,
    log_level: str,
    sockets: list[socket.socket],
    opener: Opener | None,
    on_ready: Callable[[str], None] | None,
) -> None:
    app = create_app(settings, runtime, opener)
    st = app.state.warmstart
    fds = fd_budget(settings.max_connections)
    per_client = per_client_bound(settings.max_connections_per_client, fds.connections)
    limits = ConnectionLimits(fds.connections, settings.header_timeout, per_client)
    app.state.peer_sockets = limits.sockets
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=log_level,
        http=protocol_class(limits),
        # Idle keep-alive connections are closed soon; a new request's headers get
        # header_timeout, its body body_timeout and min_body_rate (BodyLimitMiddleware).
        timeout_keep_alive=max(1, round(settings.keep_alive_timeout)),
        # Requests in progress at most: beyond it uvicorn answers 503 at once. It also
        # counts connections, which the protocol keeps at max_connections: one more.
        limit_concurrency=limits.max_connections + 1,
        backlog=fds.accept_burst,  # and the listen queue, deepened once started
        h11_max_incomplete_event_size=64 << 10,  # request line and headers
        ssl_certfile=str(settings.tls_cert) if settings.tls_cert else None,
        ssl_keyfile=str(settings.tls_key) if settings.tls_key else None,
        # Streams in flight get a few seconds to finish, then are cut (and cancelled).
        timeout_graceful_shutdown=5,
    )
    _logs.install()
    # under systemd (Type=notify): READY=1 once /health answers, i.e. the model is loaded
    notify_when_ready(settings.host, settings.port, tls=config.ssl_certfile is not None)
    scheme = "https" if settings.tls_cert else "http"
    log.info("serving %s on %s://%s:%d/v1", runtime.model_id, scheme, settings.host, settings.port)
    if settings.unix_socket is not None:
        log.info("and on the Unix socket %s", settings.unix_socket)
    ready = (lambda: on_ready(st.model_name)) if on_ready is not None else None
    server = _Server(config, on_exit=lambda: st.runtime.cancel_all(), on_ready=ready)
    try:
        with _sigterm_returns(), _sighup_reloads(st.keys):
            server.run(sockets=sockets)
    except _Terminated:
        log.info("stopped by SIGTERM")
    finally:
        st.close()  # flushes the caches and checkpoints the databases


class _Server(uvicorn.Server):
    """uvicorn's server, which ends the replies in flight at the first signal: each
    stream gets its last event and [DONE] at once, instead of being cut (with a
    CancelledError traceback) when the graceful-shutdown timeout runs out."""

    def __init__(
        self,
        config: uvicorn.Config,
        on_exit: Callable[[], None],
        on_ready: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(config)
        self._on_exit, self._on_ready = on_exit, on_ready

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.started:
            _freeze_startup_objects()
            for sock in sockets or ():
                sock.listen(LISTEN_QUEUE)  # asyncio's burst stays config.backlog
        # started: the lifespan ran and the sockets listen (not set when startup failed)
        if self.started and self._on_ready is not None:
            self._on_ready()

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if not self.should_exit:
            log.info("shutting down: ending the replies in progress")
            self._on_exit()
        super().handle_exit(sig, frame)


def _freeze_startup_objects() -> None:
    """What the server made to start (the app, its routes, the model's vocabulary and
    templates, the modules: about 100,000 objects) lives as long as the process, yet
    every full collection of the garbage collector walked it again: 41-50 ms each, about
    once a minute, on the event loop's thread, while a reply streamed (measured on a
    2-core EPYC, 2026-12-05). Those objects leave the collector's scans."""
    gc.collect()
    gc.freeze()


class _Terminated(Exception):
    """SIGTERM arrived: leave serve() through its cleanup, not by dying."""


@contextlib.contextmanager
def _sigterm_returns() -> Iterator[None]:
    """uvicorn re-raises the signal that stopped it once it has shut down; for
    SIGTERM the default action kills the process before the runtime is closed (lost
    chunks, a WAL left behind). This handler turns it into an exception instead."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminated(_sig: int, _frame: FrameType | None) -> None:
        raise _Terminated

    previous = signal.signal(signal.SIGTERM, terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def _sighup_reloads(keys: KeyBook) -> Iterator[None]:
    """SIGHUP reads the keys file again (it is also read whenever it changes), where
    its default action would end the server."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def reload(_sig: int, _frame: FrameType | None) -> None:
        try:
            keys.reload()
            log.info("SIGHUP: read %d keys from %s", len(keys.users), keys.path)
        except ConfigError as exc:
            log.error("SIGHUP: %s; the keys read before stay in use", exc)

    previous = signal.signal(signal.SIGHUP, reload)
    try:
        yield
    finally:
        signal.signal(signal.SIGHUP, previous)


def check_tls(settings: Settings) -> None:
    """Both or neither of tls_cert and tls_key, and both readable."""
    given = [p for p in (settings.tls_cert, settings.tls_key) if p is not None]
    if len(given) == 1:
        raise ConfigError("tls_cert and tls_key: give both (a PEM certificate and its key)")
    for name, path in (("tls_cert", settings.tls_cert), ("tls_key", settings.tls_key)):
        if path is not None and not path.is_file():
            raise ConfigError(f"{name}: {path} is not a readable file")
