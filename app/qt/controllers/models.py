"""The model picker's behaviour: listing, switching the server's model, downloading.

Switching asks the server to load the model (``Backend.load_model``) and only then
makes it the model that requests name; while it loads, sending waits. A server that
cannot be asked (an older warmstart, a plain OpenAI server) gets the name in requests,
which is all it understands. Downloads go to the local server's models directory
only, on a worker thread, with progress and a cancel that keeps the partial file.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from PySide6.QtCore import QObject, Signal

from ...core.errors import DownloadCancelled, ModelMissing, describe
from ...core.models import LocalListing, LocalModels, ModelInfo, merge
from ..workers import Jobs
from .connection import ConnectionController

log = logging.getLogger(__name__)
PROGRESS_EVERY_S = 0.1


class ModelController(QObject):
    listed = Signal(list)  # list[ModelInfo]
    current_changed = Signal(str)  # the model requests name; "" = the server's default
    loading_changed = Signal(str)  # the model being loaded; "" when none
    download_progress = Signal(str, object)  # name, fraction 0..1 or None; "" when done
    error = Signal(str)  # a reason that stays until dismissed; "" clears it
    status = Signal(str)
    _bytes = Signal(str, object, object)  # from the download thread: name, done, total

    def __init__(
        self,
        connection: ConnectionController,
        jobs: Jobs,
        *,
        current: str = "",
        local: Callable[[], LocalModels | None] = lambda: None,
        on_switched: Callable[[str], None] = lambda _name: None,
        parent: QObject | None = None,
    ) -> None:
        """``current``: the model the user picked last time; ``local``: the local
        server's models directory, or None when the app talks to another server;
        ``on_switched(name)``: remember the choice (the preferences)."""
        super().__init__(parent)
        self._connection = connection
        self._jobs = jobs
        self._local = local
        self._on_switched = on_switched
        self.current = current
        self._confirmed = False  # the server has said it has ``current``
        self.models: list[ModelInfo] = []
        self.loading = ""
        self.downloading = ""
        self._cancel = threading.Event()
        # A download runs for minutes: its own thread, so that replies and polls never
        # wait behind it for one of the shared pool's few.
        self._downloads = Jobs(self, max_threads=1)
        self._bytes.connect(self._on_bytes)
        connection.became_ready.connect(lambda _h: self._on_connected())

    @property
    def can_download(self) -> bool:
        return self._local() is not None

    def request_model(self) -> str | None:
        """The model a chat request names: the one picked, once the server has said it
        has it (a name it does not know would make every reply a 404); until then None,
        the server's default (for the local server, the one it started with)."""
        return (self.current or None) if self._confirmed else None

    # -- listing -----------------------------------------------------------------------

    def _on_connected(self) -> None:
        # maybe another server, or one restarted without our model: ask it again
        self._confirmed = False
        self.refresh()

    def refresh(self) -> None:
        backend, local = self._connection.backend, self._local()

        def list_all() -> list[ModelInfo]:
            try:
                served = backend.models()
            except Exception as exc:  # the local listing is still worth showing
                log.info("cannot list the server's models: %s", exc)
                served = []
            listing: LocalListing | None = local.listing() if local is not None else None
            return merge(served, listing)

        self._jobs.submit(list_all, self._on_listed, self._on_list_failed)

    def _on_listed(self, models: list[ModelInfo]) -> None:
        self.models = models
        served = [m.name for m in models if m.served]
        if served and not self.loading:
            if self.current and self.current not in served:
                # picked on another server, or a GGUF path from an older app
                self.status.emit(f"{self.current} is not on this server; using its default.")
                self.current = ""
                self.current_changed.emit("")
            self._confirmed = True
        self.listed.emit(models)

    def _on_list_failed(self, exc: BaseException) -> None:
        log.warning("listing models failed: %s", exc)
        self.status.emit(f"Could not list the models: {describe(exc)}")

    # -- switching ---------------------------------------------------------------------

    def use(self, name: str) -> bool:
        """Switch to an installed model; False when that cannot start now."""
        if self.loading or not name or name == self.current:
            return False
        self.error.emit("")  # the user acts again: an older reason no longer holds
        self.loading = name
        self.loading_changed.emit(name)
        self.status.emit(f"Loading {name}…")
        backend = self._connection.backend
        self._jobs.submit(
            lambda: backend.load_model(name),
            lambda ms: self._on_loaded(name, ms),
            lambda exc: self._on_load_failed(name, exc),
        )
        return True

    def _end_loading(self) -> None:
        self.loading = ""
        self.loading_changed.emit("")

    def _on_loaded(self, name: str, load_ms: object) -> None:
        self._end_loading()
        self.current, self._confirmed = name, True
        self._on_switched(name)
        self.current_changed.emit(name)
        if isinstance(load_ms, int | float):
            self.status.emit(f"Switched to {name} (loaded in {load_ms / 1000:.1f} s).")
        else:
            self.status.emit(f"Using {name}: this server loads the model a request names.")

    def _on_load_failed(self, name: str, exc: BaseException) -> None:
        self._end_loading()
        log.info("loading %s failed: %s", name, exc)
        reason = describe(exc)
        if isinstance(exc, ModelMissing):
            reason = f"the server does not have it ({exc.message})"
        still = self.current or "the server's default model"
        self.error.emit(f"Could not switch to {name}: {reason} Still using {still}.")
        self.status.emit(f"Switching to {name} failed.")
        self._connection.report_error(exc)

    # -- downloads ---------------------------------------------------------------------

    def download(self, name: str) -> bool:
        """Pull a catalogue model into the local server's directory; False when one is
        already running or this server is not the app's own."""
        local = self._local()
        if local is None or self.downloading or not name:
            return False
        self.error.emit("")
        self.downloading = name
        self._cancel = cancel = threading.Event()
        self.download_progress.emit(name, None)
        self.status.emit(f"Downloading {name}…")

        last = [0.0]

        def progress(done: int, total: int | None) -> None:  # on the download thread
            # a block may be 64 KiB: a few GB would flood the GUI thread with signals
            now = time.monotonic()
            if now - last[0] >= PROGRESS_EVERY_S or done == total:
                last[0] = now
                self._bytes.emit(name, done, total)

        self._downloads.submit(
            lambda: local.download(name, progress, cancel),
            lambda _path: self._on_downloaded(name),
            lambda exc: self._on_download_failed(name, exc),
        )
        return True

    def cancel_download(self) -> None:
        self._cancel.set()

    def shutdown(self, wait_ms: int = 5000) -> None:
        """Stops a download (its partial file stays for the next run to resume)."""
        self._cancel.set()
        self._downloads.wait(wait_ms)

    def _on_bytes(self, name: str, done: object, total: object) -> None:
        if name != self.downloading:
            return  # a late block of a download that already ended
        fraction = done / total if isinstance(done, int) and isinstance(total, int) else None
        self.download_progress.emit(name, fraction)

    def _end_download(self) -> None:
        self.downloading = ""
        self.download_progress.emit("", None)

    def _on_downloaded(self, name: str) -> None:
        self._end_download()
        self.status.emit(f"Downloaded {name}. Pick it to use it.")
        self.refresh()

    def _on_download_failed(self, name: str, exc: BaseException) -> None:
        self._end_download()
        if isinstance(exc, DownloadCancelled):
            self.status.emit(f"Stopped downloading {name}; the next download resumes it.")
        else:
            log.info("downloading %s failed: %s", name, exc)
            self.error.emit(f"Could not download {name}: {describe(exc)}")
            self.status.emit(f"Downloading {name} failed.")
        self.refresh()
