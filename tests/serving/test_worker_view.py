"""Stats and session info come from the worker's published view: read from other
threads while the worker serves, they never touch the engine's sequences nor list
or walk the disk cache."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from typing import Any

import pytest
from warmstart.runtime.serving._core import LocalRuntime
from warmstart.runtime.serving._stats import Stats

from tests.conftest import chat


class _Guarded(list):  # type: ignore[type-arg]
    """engine.residents, noting every thread but the worker that reads it."""

    def __init__(self, items: list[Any], worker: threading.Thread, touched: list[str]) -> None:
        super().__init__(items)
        self._worker, self._touched = worker, touched

    def _check(self) -> None:
        if threading.current_thread() is not self._worker:
            self._touched.append(threading.current_thread().name)

    def __iter__(self):  # type: ignore[no-untyped-def]
        self._check()
        return super().__iter__()

    def __len__(self) -> int:
        self._check()
        return super().__len__()

    def __getitem__(self, i):  # type: ignore[no-untyped-def]
        self._check()
        return super().__getitem__(i)


def _noting(touched: list[str], what: str) -> Callable[..., Any]:
    def listing(*_args: object, **_kw: object) -> set[bytes]:
        touched.append(f"{what} on {threading.current_thread().name}")
        return set()

    return listing


def test_readers_take_the_view_while_the_worker_serves(
    make_runtime: Callable[..., LocalRuntime], monkeypatch: pytest.MonkeyPatch
) -> None:
    rt = make_runtime()
    touched: list[str] = []
    rt.engine.residents = _Guarded(rt.engine.residents, rt.worker.thread, touched)
    assert rt.store is not None and rt.store.disk is not None
    disk = rt.store.disk  # a 1 GiB budget: no cull, so no listing is ever due
    monkeypatch.setattr(disk, "present", _noting(touched, "present"))
    monkeypatch.setattr(disk, "bytes_on_disk", _noting(touched, "bytes_on_disk"))
    monkeypatch.setattr(disk._blobs, "iterkeys", _noting(touched, "iterkeys"))

    done, seen, failures = threading.Event(), [], []

    def read() -> None:
        while not done.is_set():
            try:
                seen.append(rt.stats())
                rt.sessions()
                rt.session("view-a")
            except Exception as exc:
                failures.append(exc)

    reader = threading.Thread(target=read, name="reader")
    reader.start()
    try:
        for session in ("view-a", "view-b", "view-a"):
            rt.generate(chat("Name a colour.", max_tokens=4, session_id=session)).text()
        assert rt.wait_idle(120)
    finally:
        done.set()
        reader.join()
    assert not failures and seen
    assert touched == []  # neither the engine's list nor the cache's keys were read

    view = rt.view
    with pytest.raises(dataclasses.FrozenInstanceError):
        view.evictions = 1  # type: ignore[misc]
    assert [e.kind for e in view.events].count("finished") == 3
    assert {r.session for r in view.residents} >= {"view-a", "view-b"}
    raw = rt.stats()
    stats = Stats.from_json(raw)
    assert stats.to_json() == raw and stats.requests == 3
    assert stats.live.tokens == view.live_tokens > 0 and stats.live.resident == 2
    assert stats.disk.chunks and stats.disk.bytes > 0
    info = rt.session("view-a")
    assert info is not None and info.tiers["live"] > 0


def test_evicting_on_request_is_not_counted_and_resets_nothing(
    make_runtime: Callable[..., LocalRuntime],
) -> None:
    rt = make_runtime()
    for session, text in (("ev-a", "Hi."), ("ev-b", "Bye.")):
        rt.generate(chat(text, max_tokens=2, session_id=session)).text()
    assert rt.wait_idle(120) and rt.view.resident == 2
    rt.worker.call(lambda: setattr(rt.engine, "evictions", 5))  # as if five were pushed out
    rt.evict_live()  # asked for: not a conversation pushed out, and the count stays
    assert rt.view.evictions == 5 and rt.view.resident == 0
    assert rt.stats()["tiers"]["live"]["tokens"] == 0
    assert rt.stats()["evictions"] == 5 + rt.store.stats().evictions  # type: ignore[union-attr]
