"""Builds a ready runtime from settings: model, thresholds, store, prewarm."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from runtime.core import LocalRuntime
from runtime.settings import Settings

log = logging.getLogger(__name__)
Progress = Callable[[str], None]


def open_runtime(
    settings: Settings, progress: Progress | None = None, prewarm: bool = True
) -> LocalRuntime:
    say = progress or (lambda msg: log.info("%s", msg))
    say(f"loading model {settings.model} ...")
    rt = LocalRuntime(settings)
    if prewarm and rt.store is not None and rt.tuning.prewarm_sessions > 0:
        start_prewarm(rt, rt.tuning.prewarm_sessions)
    return rt


def start_prewarm(rt: LocalRuntime, n: int) -> threading.Thread:
    """Promotes the most recent conversations from disk to RAM in the background:
    the first request never waits for it (the store's locks keep both consistent)."""

    def run() -> None:
        try:
            tokens = rt.prewarm_recent(n)
            log.info("prewarmed %d tokens of the %d most recent conversations", tokens, n)
        except Exception:  # prewarm is an optimisation: never take the runtime down
            log.exception("prewarm failed")

    thread = threading.Thread(target=run, name="prewarm", daemon=True)
    thread.start()
    return thread


def doctor(settings: Settings, as_json: bool = False) -> int:
    raise NotImplementedError
