"""The models the app can pick, without Qt: what the server serves, what is installed
in the models directory of the server the app starts, and warmstart's catalogue with
what fits this machine.

The catalogue, the fit and the pulls are the runtime's own (what ``warmstart models
list --available`` and ``warmstart models pull`` use), imported when first needed:
only the local server's models directory is the app's to fill, so a server elsewhere
gets no catalogue and no downloads (its machine is not this one).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import AppError, DownloadCancelled, DownloadFailed
from .report import format_bytes

if TYPE_CHECKING:
    from ...runtime.models import ModelManager

log = logging.getLogger(__name__)
FIT_LABELS = {"gpu": "fits (GPU)", "ram": "fits (CPU)", "no": "too big"}
Progress = Callable[[int, int | None], None]  # bytes done, bytes in all (None: unknown)


@dataclass(frozen=True)
class ModelInfo:
    """One row of the picker."""

    name: str
    title: str = ""
    size_bytes: int | None = None
    served: bool = False  # the server lists it in /v1/models: it can be switched to
    installed: bool = False  # on this machine's models directory (or served)
    fit: str = ""  # "gpu", "ram", "no"; "" when unknown (not this machine's server)
    fit_reason: str = ""

    @property
    def size_label(self) -> str:
        return format_bytes(self.size_bytes) if self.size_bytes else ""

    @property
    def fit_label(self) -> str:
        return FIT_LABELS.get(self.fit, "")


@dataclass(frozen=True)
class LocalListing:
    """The local server's models directory and the catalogue, sized and fitted."""

    installed: dict[str, int]  # name -> bytes
    catalogue: list[ModelInfo]  # what is known of each: the catalogue's, the user's files


def merge(served: Iterable[str], local: LocalListing | None) -> list[ModelInfo]:
    """Served models first (in the server's order), then installed ones the server does
    not list yet, then the catalogue's others: what can be used, then what can be got."""
    local = local or LocalListing({}, [])
    known = {m.name: m for m in local.catalogue}
    rows: dict[str, ModelInfo] = {}
    for name in served:
        base = known.get(name, ModelInfo(name))
        size = local.installed.get(name, base.size_bytes)
        rows[name] = _with(base, size, served=True, installed=True)
    for name, size in local.installed.items():
        if name not in rows:
            rows[name] = _with(known.get(name, ModelInfo(name)), size, served=False, installed=True)
    for entry in local.catalogue:
        rows.setdefault(entry.name, entry)
    return list(rows.values())


def _with(base: ModelInfo, size: int | None, *, served: bool, installed: bool) -> ModelInfo:
    return ModelInfo(
        base.name, base.title, size, served, installed, base.fit, base.fit_reason
    )  # fmt: skip


class LocalModels:
    """The models directory of the server the app starts (the runtime's ``ModelManager``)."""

    def __init__(self, models_dir: Path, cache_dir: Path) -> None:
        from ...runtime.models import ModelManager

        self.models_dir = models_dir
        self.cache_dir = cache_dir
        self.manager: ModelManager = ModelManager(models_dir)

    @classmethod
    def for_local_server(cls, overrides: Mapping[str, str]) -> LocalModels:
        """Where the server the app starts keeps its models: its settings (environment,
        config file) with the app's overrides for it, as it will read them."""
        from ...runtime.errors import WarmstartError
        from ...runtime.settings import load_settings

        given = {k: overrides[k] for k in ("data_dir", "cache_dir") if overrides.get(k)}
        try:
            settings = load_settings(**given)
        except WarmstartError as exc:
            raise AppError(f"cannot tell where the local server keeps models: {exc}") from exc
        return cls(settings.models_dir, settings.effective_cache_dir)

    def installed(self) -> dict[str, int]:
        return {str(m["name"]): int(str(m["bytes"])) for m in self.manager.list()}

    def listing(self) -> LocalListing:
        """Slow (probes the machine, reads headers): call it on a worker thread."""
        from ...runtime.hardware import probe
        from ...runtime.models import fit, fit_bytes, installed_paths, needs_bytes, with_default

        profile = probe(self.cache_dir)
        rows = []
        catalogue = with_default(self.manager.catalogue)
        for entry in catalogue.values():
            where, why = fit(entry, profile)
            rows.append(
                ModelInfo(entry.name, entry.title, entry.size_bytes, fit=where, fit_reason=why)
            )
        # a file of the user's own: its fit from its size and header, as the catalogue's
        for name, path in installed_paths(self.models_dir).items():
            if name not in catalogue:
                where, why = fit_bytes(needs_bytes(path), profile)
                rows.append(ModelInfo(name, path.name, fit=where, fit_reason=why))
        return LocalListing(self.installed(), rows)

    def download(self, name: str, progress: Progress, cancel: threading.Event) -> Path:
        """Pulls ``name`` (resuming a partial file); blocks: call it on a worker thread.
        Setting ``cancel`` stops it at the next block with :class:`DownloadCancelled`."""
        from ...runtime.errors import Cancelled, WarmstartError
        from ...runtime.models import Watch

        try:
            return self.manager.pull(name, progress=False, watch=Watch(progress, cancel))
        except Cancelled as exc:
            raise DownloadCancelled(str(exc)) from exc
        except (WarmstartError, OSError) as exc:
            raise DownloadFailed(str(exc)) from exc
