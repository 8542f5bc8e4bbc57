"""Embeddings are requests like any other, in both runtimes (the real one on the
default model, and the fake): counted among the active and waiting requests, Busy
when the queue is full, cancelled between two texts, and never in the way of a chat
reply."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from warmstart.runtime._embed_queue import MAX_EMBED_TOKENS
from warmstart.runtime.errors import Busy, Cancelled, RequestError, WarmstartError
from warmstart.runtime.serving._service import Runtime
from warmstart.runtime.types import Message, Request, Sampling

# Minutes of work on the real model on two cores, tens of seconds on the fake.
LONG = ["word " * 100] * 400


@pytest.fixture(params=["fake", "local"])
def runtime(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Runtime]:
    if request.param == "fake":
        from warmstart.runtime.engine._fake import FakeOptions

        from tests.conftest import fake_runtime

        options = FakeOptions(prefill_delay=1e-3)
        rt: Runtime = fake_runtime(tmp_path, options, n_ctx=512, max_queue=1)
    else:
        from warmstart.runtime.serving._factory import build_runtime

        from tests.conftest import small_settings

        model = request.getfixturevalue("model_path")
        rt = build_runtime(small_settings(tmp_path, model, n_ctx=512, max_queue=1))
    yield rt
    rt.close()


def _embedding(
    runtime: Runtime, stop: threading.Event, texts: list[str] = LONG
) -> tuple[threading.Thread, list[object]]:
    """A long embedding on a thread of its own; its outcome lands in the list."""
    out: list[object] = []

    def run() -> None:
        try:
            out.append(runtime.embed(texts, stop))
        except WarmstartError as exc:
            out.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def _queue(runtime: Runtime) -> dict[str, int]:
    return dict(runtime.stats()["queue"])


def _until(cond: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)


class Texts:
    """The texts a runtime begins to compute, counted at its embedder's ``vector``: for
    each, whether its request's stop was set by then, and whether it ended with a
    vector or Cancelled halfway. A count, where a time bound would fail on a machine
    whose cores other work shares."""

    def __init__(self, runtime: Runtime, monkeypatch: pytest.MonkeyPatch) -> None:
        self.late: list[bool] = []
        self.ends: list[str] = []
        vector = runtime.embeddings.vector

        def counted(tokens: list[int], stop: threading.Event | None = None) -> tuple[float, ...]:
            self.late.append(stop is not None and stop.is_set())
            try:
                out = vector(tokens, stop)
            except Cancelled:
                self.ends.append("cancelled")
                raise
            self.ends.append("vector")
            return out

        monkeypatch.setattr(runtime.embeddings, "vector", counted)

    def begun_after_stop(self) -> int:
        """At most 1 where stop is honoured: the text whose check came just before."""
        return sum(self.late)


def _chat(max_tokens: int = 4) -> Request:
    return Request(messages=(Message("user", "Say hi."),), sampling=Sampling(max_tokens=max_tokens))


def test_embeddings_count_and_a_full_queue_is_busy(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    texts = Texts(runtime, monkeypatch)
    first_stop, second_stop = threading.Event(), threading.Event()
    first, first_out = _embedding(runtime, first_stop)
    _until(lambda: _queue(runtime)["active"] == 1)
    second, second_out = _embedding(runtime, second_stop)
    _until(lambda: _queue(runtime)["waiting"] == 1)
    with pytest.raises(Busy):  # max_queue 1: one embedding waits already
        runtime.embed(["one more"])
    with pytest.raises(Busy):  # and a chat is refused alike
        runtime.generate(_chat())
    second_stop.set()
    first_stop.set()
    first.join(30)  # hang guards, not the bound
    second.join(30)
    assert texts.begun_after_stop() <= 1, texts.late  # the waiting one began none
    assert isinstance(first_out[0], Cancelled) and isinstance(second_out[0], Cancelled)
    after = _queue(runtime)
    assert after["active"] == 0 and after["waiting"] == 0
    assert runtime.embed(["afterwards"]).vectors  # the queue works again


def test_a_chat_is_answered_while_an_embedding_runs(runtime: Runtime) -> None:
    stop = threading.Event()
    thread, out = _embedding(runtime, stop)
    _until(lambda: _queue(runtime)["active"] == 1)
    text, report = runtime.generate(_chat()).text()  # type: ignore[attr-defined]
    assert text and report.completion_tokens > 0
    assert thread.is_alive() and not out  # the embedding was still being computed
    stop.set()
    thread.join(30)
    assert isinstance(out[0], Cancelled)


def test_cancel_all_and_close_end_a_long_embedding(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    texts = Texts(runtime, monkeypatch)
    thread, out = _embedding(runtime, threading.Event())
    _until(lambda: _queue(runtime)["active"] == 1)
    runtime.cancel_all()  # the server stopping
    thread.join(30)
    assert isinstance(out[0], Cancelled)
    thread, out = _embedding(runtime, threading.Event())
    _until(lambda: _queue(runtime)["active"] == 1)
    runtime.close()
    thread.join(30)  # a hang guard, not the bound
    assert texts.begun_after_stop() <= 2, texts.late  # one for each of the two
    assert isinstance(out[0], Cancelled)
    with pytest.raises(WarmstartError):
        runtime.embed(["after close"])


def test_a_request_over_the_token_limit_is_refused_before_any_work(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    texts = Texts(runtime, monkeypatch)
    with pytest.raises(RequestError) as refused:
        runtime.embed(["word " * 400] * (MAX_EMBED_TOKENS // 400 + 2))
    assert refused.value.param == "input" and f"at most {MAX_EMBED_TOKENS}" in str(refused.value)
    assert texts.late == []  # tokenized, never computed (minutes on two cores)


def test_a_long_text_is_stopped_halfway(runtime: Runtime, monkeypatch: pytest.MonkeyPatch) -> None:
    """One text is one batch (seconds of one core on the real model, half a second of
    the fake's): a stop set while it is computed ends it there, not after it. Shown by
    the text, not a clock: the one being computed ends Cancelled, not with a vector."""
    texts = Texts(runtime, monkeypatch)
    stop = threading.Event()
    thread, out = _embedding(runtime, stop, ["word " * 500] * 20)
    _until(lambda: len(texts.late) > len(texts.ends))  # a text is being computed
    time.sleep(0.3)
    stop.set()
    thread.join(30)  # a hang guard, not the bound
    assert isinstance(out[0], Cancelled)
    assert texts.ends[-1] == "cancelled" and not texts.late[-1], (texts.ends, texts.late)
