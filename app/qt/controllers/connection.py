"""Which server the app talks to, whether it answers, and starting a local one."""

from __future__ import annotations

import logging
from collections.abc import Callable

from PySide6.QtCore import QObject, QTimer, Signal

from ...core.errors import AppError, ServerUnavailable, UntrustedServer, describe
from ...core.launcher import LocalServer, is_loopback
from ...core.types import Backend, Health
from ..workers import Jobs

log = logging.getLogger(__name__)

CONNECTING, STARTING, READY, DOWN = "connecting", "starting", "ready", "down"


class ConnectionController(QObject):
    """States: connecting -> (starting ->) ready <-> down. Polls /health all along, so a
    server that goes away is noticed, and one that comes back is picked up.

    A server is ready only once ``backend.verify()`` passes: for the app's own local
    server, that it is the one the app started (see ``ApiClient.verify``). One that
    fails it is shown as down, with the reason, and gets nothing."""

    state_changed = Signal(str)
    message = Signal(str)  # a sentence for the banner; "" clears it
    progress = Signal(str, object)  # startup step, fraction 0..1 or None
    became_ready = Signal(object)  # Health; on the first connection and every recovery
    capabilities = Signal(bool)  # True when the server has warmstart's own endpoints

    def __init__(
        self,
        jobs: Jobs,
        backend: Backend,
        *,
        launcher: Callable[[], LocalServer] | None = None,
        poll_ready_ms: int = 3000,
        poll_down_ms: int = 1000,
        parent: QObject | None = None,
    ) -> None:
        super().__init__(parent)
        self._jobs = jobs
        self.backend = backend
        self._launcher = launcher
        self._local: LocalServer | None = None
        self.state = CONNECTING
        self.health: Health | None = None
        self.is_warmstart: bool | None = None
        self._in_flight = False
        self._poll_ready_ms, self._poll_down_ms = poll_ready_ms, poll_down_ms
        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.timeout.connect(self.check)

    @property
    def ready(self) -> bool:
        return self.state == READY

    def start(self) -> None:
        self._set_state(CONNECTING, f"Connecting to {self.backend.base_url}…")
        self.check()

    @property
    def local(self) -> LocalServer | None:
        """The server this app started, if any."""
        return self._local

    def set_backend(
        self, backend: Backend, launcher: Callable[[], LocalServer] | None = None
    ) -> None:
        self.backend = backend
        self._launcher = launcher
        self.is_warmstart = None
        self.start()

    def check(self) -> None:
        if self._in_flight or self.state == STARTING:
            return
        self._in_flight = True
        self._jobs.submit(self._probe, self._on_health, self._on_health_error)

    def _probe(self) -> tuple[Health, bool | None]:
        backend = self.backend
        health = backend.health()
        if health.ready:
            backend.verify()
        return health, self._ask_capabilities(backend, health)

    def _ask_capabilities(self, backend: Backend, health: Health) -> bool | None:
        """Whether the server has warmstart's own endpoints, asked (on a worker thread)
        before "ready" is announced: where conversations live depends on it, and a
        message may go out at once. ``None``: not asked now, or no answer."""
        if not health.ready or self.state == READY:
            return None
        try:
            return backend.sessions() is not None
        except AppError as exc:
            log.info("could not tell the server's kind yet: %s", exc)
            return None

    def report_error(self, exc: BaseException) -> None:
        """Another controller's request failed; a lost server switches us to 'down'."""
        if isinstance(exc, ServerUnavailable) and self.state == READY:
            self._set_state(DOWN, describe(exc))
            self._schedule()

    def shutdown(self) -> None:
        self._timer.stop()
        if self._local is not None:
            self._local.stop()

    # -- internals -------------------------------------------------------------------

    def _set_state(self, state: str, message: str = "") -> None:
        changed = state != self.state
        self.state = state
        self.message.emit(message)
        if changed:
            self.state_changed.emit(state)

    def _schedule(self) -> None:
        self._timer.start(self._poll_ready_ms if self.state == READY else self._poll_down_ms)

    def _on_health(self, result: tuple[Health, bool | None]) -> None:
        self._in_flight = False
        health, capable = result
        if health.ready:
            self._on_ready(health, capable)
        else:
            self._set_state(CONNECTING, f"Loading {health.model or 'the model'}…")
            self.progress.emit(f"Loading {health.model or 'the model'}…", health.progress)
        self._schedule()

    def _on_health_error(self, exc: BaseException) -> None:
        self._in_flight = False
        # Also after a refused impostor has gone away: the port is free for ours.
        if (
            self._local is None
            and isinstance(exc, ServerUnavailable)
            and self._launcher is not None
            and is_loopback(self.backend.base_url)
        ):
            self._launch()
            return
        if isinstance(exc, AppError) and not isinstance(exc, ServerUnavailable):
            # It answered, just not with "ok" (e.g. 503 while loading): keep waiting.
            self.progress.emit(describe(exc), None)
        if self.state != DOWN:
            self._set_state(DOWN, describe(exc))
        self._schedule()

    def _on_ready(self, health: Health, capable: bool | None = None) -> None:
        was_ready = self.state == READY
        self.health = health
        if not was_ready and capable is not None:
            self._set_capable(capable)  # before anyone hears "ready"
        self._set_state(READY, "")
        if not was_ready:
            self.progress.emit("", 1.0)
            self.became_ready.emit(health)
            if capable is None:
                self._jobs.submit(self.backend.sessions, self._on_sessions, lambda _e: None)

    def _on_sessions(self, sessions: object) -> None:
        self._set_capable(sessions is not None)

    def _set_capable(self, capable: bool) -> None:
        self.is_warmstart = capable
        self.capabilities.emit(capable)

    def _launch(self) -> None:
        assert self._launcher is not None
        self._local = self._launcher()
        self._set_state(STARTING, "Starting the local warmstart server…")
        server, backend = self._local, self.backend

        def run() -> tuple[Health, bool | None]:
            server.start()
            try:
                health = server.wait_ready(
                    backend.health, progress=lambda m, p: self.progress.emit(m, p)
                )
            finally:
                server.forget_key_file()  # read at its start; nobody needs it again
            backend.verify()
            return health, self._ask_capabilities(backend, health)

        self._jobs.submit(run, self._on_launched, self._on_launch_failed)

    def _on_launched(self, result: tuple[Health, bool | None]) -> None:
        self.state = CONNECTING  # leave STARTING so _on_ready announces the change
        self._on_ready(*result)
        self._schedule()

    def _on_launch_failed(self, exc: BaseException) -> None:
        log.warning("local server failed to start: %s", exc)
        if isinstance(exc, UntrustedServer):
            self._set_state(DOWN, describe(exc))
        else:
            self._set_state(DOWN, f"Could not start a local server: {describe(exc)}")
        self.progress.emit("", None)
        self._schedule()
