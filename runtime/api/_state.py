"""What every route needs, held on ``app.state`` (one per app, never per module),
and the one place that switches the loaded model.

One model is loaded at a time (as in Ollama). A request naming another installed
model switches: new requests wait, the replies in progress get ``switch_wait_s`` to
finish (then are cancelled), the runtime is closed (its disk tier flushed) and the
named model opened. Each model's KV chunks are keyed by its fingerprint, so a model
switched back to finds its cache on disk. Requests for different models queue on
the switch; none fails because another model is loading.

Ollama's ``keep_alive`` unloads the model the same way (_keep_alive.py): once the
replies in progress and their cache writes are done the runtime is closed, and the
next request that needs it opens it again and restores its conversations from disk.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
from fastapi import Request

from ..errors import ModelError, ModelNotFound
from ..models import MetadataCache, ModelManager, installed_paths, load_catalogue, model_name
from ..serving import Runtime
from ..settings import Settings
from ..users import KeyBook
from ._errors import APIError, error_body
from ._keep_alive import Expiry
from ._metrics import Metrics
from ._schemas import ErrorResponse

log = logging.getLogger(__name__)

# Names a client may use for the loaded model besides its own: never a switch.
MODEL_ALIASES = frozenset({"default"})

# The OpenAPI "responses" of the routes that reach the runtime.
ERRORS: dict[int | str, dict] = {
    400: {"model": ErrorResponse, "description": "invalid request"},
    401: {"model": ErrorResponse, "description": "missing or wrong API key"},
    403: {"model": ErrorResponse, "description": "Host or Origin not allowed"},
    404: {"model": ErrorResponse, "description": "unknown model or session"},
    413: {"model": ErrorResponse, "description": "request body too large"},
    429: {"model": ErrorResponse, "description": "busy; see Retry-After"},
}

# Opens an installed model file as a ready runtime (the factory's open_runtime).
Opener = Callable[[Path], Runtime]


def loaded_model(settings: Settings, runtime: Runtime) -> tuple[Path | None, str]:
    """The file and the name of the model ``runtime`` was opened on (the settings'
    model); the runtime's own id when the file is unknown (a fake runtime)."""
    try:
        path = ModelManager(settings.models_dir).resolve(settings.model, auto_pull=False)
    except ModelError:
        return None, runtime.model_id
    return path.resolve(), model_name(path, load_catalogue())


@dataclass
class AppState:
    settings: Settings
    runtime: Runtime  # the loaded model's; a switch replaces it: read it, never keep it
    metrics: Metrics
    started: int = field(default_factory=lambda: int(time.time()))
    opener: Opener | None = None  # None: this server serves its one model only
    model_path: Path | None = None  # the loaded model's file, when known
    model_name: str = ""  # the loaded model's name (default: the runtime's model_id)
    metadata: MetadataCache = field(default_factory=MetadataCache)
    served_ctx: dict[Path, int] = field(default_factory=dict)  # n_ctx each model got here
    loading: str | None = None  # the model being switched to (or unloaded)
    unloaded: bool = False  # keep_alive ran out: ``runtime`` is closed until a request reopens it
    pulls: set[str] = field(default_factory=set)  # models /api/pull is downloading now
    pulls_lock: threading.Lock = field(default_factory=threading.Lock)
    _limiter: anyio.CapacityLimiter | None = None
    _cv: threading.Condition = field(default_factory=threading.Condition)
    _users: int = 0  # requests between choosing the runtime and submitting to it

    def __post_init__(self) -> None:
        self.model_name = self.model_name or self.runtime.model_id
        if self.model_path is not None:
            self.served_ctx[self.model_path] = self.runtime.n_ctx
        self.expiry = Expiry(self.unload)
        # the household's keys (an absent file: none, and nothing changes)
        self.keys = KeyBook(self.settings.effective_keys_file)

    @property
    def limiter(self) -> anyio.CapacityLimiter:
        """Threads that wait on the runtime's streams; created in the running loop.

        Its own limiter so that many waiting replies cannot starve the threads that
        FastAPI uses for plain sync routes (sessions, stats)."""
        if self._limiter is None:
            self._limiter = anyio.CapacityLimiter(self.settings.max_queue + 64)
        return self._limiter

    def installed(self) -> dict[str, Path]:
        """Name -> file of the models this server can switch to (none without an opener)."""
        return installed_paths(self.settings.models_dir) if self.opener is not None else {}

    def wanted(self, name: str | None) -> str | None:
        """The model ``name`` asks for (None: whichever is loaded, for an alias or no
        name). Raises 404 model_not_found for a name no installed model has."""
        if name is None or name in MODEL_ALIASES:
            return None
        if name != self.model_name and name not in self.installed():
            known = ", ".join(sorted({self.model_name, *self.installed()}))
            raise APIError(
                404,
                f"the model '{name}' does not exist; installed: {known}",
                param="model",
                code="model_not_found",
            )
        return name

    def check_model(self, name: str | None) -> None:
        """Raises 404 model_not_found unless ``name`` is known (switches nothing)."""
        self.wanted(name)

    def acquire(self, name: str | None) -> tuple[Runtime, str]:
        """The runtime for ``name`` and the name it answers by, switching to it first
        when needed (blocking: call it from a worker thread). Every acquire is
        followed by one release(), once the request has been submitted."""
        want = self.wanted(name)
        while True:
            with self._cv:
                while self.loading is not None:
                    self._cv.wait()
                same = want is None or want == self.model_name
                if same and not self.unloaded:
                    self._users += 1
                    return self.runtime, self.model_name
                target = self.model_name if same or want is None else want
                self.loading = target
            try:
                if same:
                    self._reopen()
                else:
                    self._switch(target)
            finally:
                with self._cv:
                    self.loading = None
                    self._cv.notify_all()

    def release(self) -> None:
        with self._cv:
            self._users -= 1
            self._cv.notify_all()

    @contextlib.contextmanager
    def using(self, name: str | None = None) -> Iterator[Runtime]:
        """acquire() and release() around a call to the runtime (blocking)."""
        runtime, _ = self.acquire(name)
        try:
            yield runtime
        finally:
            self.release()

    def settled(self) -> Runtime | None:
        """The loaded runtime, or None while a switch is closing or opening one (for
        readers that must not wait, such as a metrics scrape)."""
        with self._cv:
            return None if self.loading is not None or self.unloaded else self.runtime

    def load(self, name: str) -> float:
        """Makes ``name`` the loaded model; the milliseconds it took (0 when it was)."""
        t0 = time.perf_counter()
        before = self.model_path
        with self.using(name):
            pass
        return 0.0 if self.model_path == before else (time.perf_counter() - t0) * 1000

    def _switch(self, name: str) -> None:
        """Closes the loaded runtime, once its replies are done or have had
        switch_wait_s, and opens ``name``; on failure the previous model comes back."""
        assert self.opener is not None  # wanted() names none to switch to without one
        path = self.installed().get(name)
        if path is None:  # removed since wanted() saw it
            raise ModelNotFound(f"the model '{name}' is no longer installed")
        path = path.resolve()
        wait_s = self.settings.switch_wait_s
        with self._cv:  # requests that chose this runtime submit within milliseconds
            self._cv.wait_for(lambda: self._users == 0, timeout=wait_s)
        old, old_path = self.runtime, self.model_path
        log.info("switching model: %s -> %s", self.model_name, name)
        if not self.unloaded and not old.wait_idle(wait_s):
            log.warning("replies still running after %.1f s: cancelled for the switch", wait_s)
            old.cancel_all()
        old.close()
        try:
            new = self.opener(path)
        except Exception:
            if old_path is not None and not self.unloaded:  # keep serving what was served
                self.runtime = self.opener(old_path)
            raise
        self.runtime, self.model_path, self.model_name = new, path, name
        self.served_ctx[path] = new.n_ctx
        self.unloaded = False

    # keep_alive: unloading and reopening the loaded model ---------------------------------
    @property
    def can_unload(self) -> bool:
        """Whether this server can open its model again once unloaded (it knows the
        file and has an opener; a fake runtime has neither)."""
        return self.opener is not None and self.model_path is not None

    def begin_unload(self) -> bool:
        """Marks the loaded model as being unloaded, at once: requests from now on
        wait for the unload, then reopen it. False when there is nothing to unload
        (or a switch is under way); finish_unload() follows a True."""
        with self._cv:
            if not self.can_unload or self.unloaded or self.loading is not None:
                return False
            self.loading = self.model_name
            return True

    def finish_unload(self) -> None:
        """Closes the runtime once the replies in progress are done and their cache
        written to disk (the next request restores it from there). Replies still
        running after switch_wait_s keep the model loaded: keep_alive never cuts one."""
        wait_s = self.settings.switch_wait_s
        try:
            with self._cv:  # requests that chose this runtime submit within milliseconds
                self._cv.wait_for(lambda: self._users == 0, timeout=wait_s)
            if not self.runtime.wait_idle(wait_s):
                log.info("keep_alive: replies still running; %s stays loaded", self.model_name)
                return
            self.runtime.close()  # flushes the disk tier
            self.unloaded = True
            log.info("keep_alive: %s unloaded", self.model_name)
        finally:
            with self._cv:
                self.loading = None
                self._cv.notify_all()

    def unload(self) -> bool:
        """Unloads the loaded model now (keep_alive ran out); whether it was."""
        if not self.begin_unload():
            return False
        self.finish_unload()
        return self.unloaded

    def _reopen(self) -> None:
        """Opens the model keep_alive unloaded."""
        assert self.opener is not None and self.model_path is not None
        log.info("opening %s again (unloaded by keep_alive)", self.model_name)
        self.runtime = self.opener(self.model_path)
        self.unloaded = False

    def close(self) -> None:
        """Closes the loaded runtime (the server is stopping)."""
        self.expiry.close()
        self.runtime.close()


class LoadedStats:
    """``stats()`` of whichever runtime is loaded at the time (for the metrics scrape,
    which must not wait): empty while a switch closes one runtime and opens another."""

    def __init__(self, settled: Callable[[], Runtime | None]) -> None:
        self._settled = settled  # AppState.settled

    def stats(self) -> dict[str, Any]:
        runtime = self._settled()
        return {} if runtime is None else runtime.stats()


def state(request: Request) -> AppState:
    app_state = request.app.state.warmstart
    assert isinstance(app_state, AppState)
    return app_state


__all__ = ["ERRORS", "MODEL_ALIASES", "AppState", "Opener", "error_body", "state"]
