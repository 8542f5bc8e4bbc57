"""The rules every runtime's embeddings follow (runtime/_embed_queue.py), without a
model: limits, one request at a time in arrival order, admission shared with the
replies' queue, and cancellation between two texts."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
from warmstart.runtime._embed_queue import (
    MAX_EMBED_INPUTS,
    MAX_EMBED_TOKENS,
    EmbeddingQueue,
    check_texts,
    check_tokens,
)
from warmstart.runtime.errors import Busy, Cancelled, EngineError, RequestError


def _queue(max_queue: int = 4, replies_waiting: int = 0) -> EmbeddingQueue:
    return EmbeddingQueue(threading.RLock(), max_queue, lambda: replies_waiting)


def _in_thread(fn: Callable[[], object]) -> tuple[threading.Thread, list[object]]:
    out: list[object] = []

    def run() -> None:
        try:
            out.append(fn())
        except Exception as exc:
            out.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def _wait(cond: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def test_limits_name_the_input() -> None:
    with pytest.raises(RequestError, match="at least one"):
        check_texts([])
    with pytest.raises(RequestError, match=f"at most {MAX_EMBED_INPUTS}"):
        check_texts(["x"] * (MAX_EMBED_INPUTS + 1))
    with pytest.raises(RequestError) as empty:
        check_tokens([[1], []], n_ctx=8)
    assert empty.value.param == "input.1"
    with pytest.raises(RequestError) as long:
        check_tokens([[1] * 9], n_ctx=8)
    assert long.value.param == "input"
    per_text = 1000
    many = [[1] * per_text] * (MAX_EMBED_TOKENS // per_text + 1)
    with pytest.raises(RequestError, match=f"at most {MAX_EMBED_TOKENS}"):
        check_tokens(many, n_ctx=per_text)
    assert check_tokens([[1, 2], [3]], n_ctx=8) == 3


def test_one_request_at_a_time_counted_waiting_then_active() -> None:
    q = _queue()
    release = threading.Event()
    first, out1 = _in_thread(lambda: q.run([1], threading.Event(), lambda _: release.wait(10)))
    _wait(lambda: q.active == 1)
    second, out2 = _in_thread(lambda: q.run([2], threading.Event(), lambda x: x))
    _wait(lambda: q.waiting == 1)
    assert q.active == 1 and not out2  # the second waits its turn
    release.set()
    first.join(10)
    second.join(10)
    assert out1 == [[True]] and out2 == [[2]]
    assert q.waiting == 0 and q.active == 0 and q.wait_idle(0)


def test_busy_counts_the_replies_waiting_too() -> None:
    with pytest.raises(Busy):
        _queue(max_queue=2, replies_waiting=2).run([1], threading.Event(), lambda x: x)
    q = _queue(max_queue=2, replies_waiting=1)
    release = threading.Event()
    running, _ = _in_thread(lambda: q.run([1], threading.Event(), lambda _: release.wait(10)))
    _wait(lambda: q.active == 1)
    waiting, _ = _in_thread(lambda: q.run([1], threading.Event(), lambda x: x))
    _wait(lambda: q.waiting == 1)
    with pytest.raises(Busy):  # one reply and one embedding wait: the queue is full
        q.run([1], threading.Event(), lambda x: x)
    release.set()
    running.join(10)
    waiting.join(10)


def test_stop_ends_a_request_between_two_texts() -> None:
    q = _queue()
    stop = threading.Event()
    done: list[int] = []

    def slow(x: int) -> int:
        time.sleep(0.05)
        done.append(x)
        return x

    thread, out = _in_thread(lambda: q.run(list(range(1000)), stop, slow))
    _wait(lambda: len(done) >= 2)
    stop.set()
    thread.join(5)
    assert isinstance(out[0], Cancelled) and len(done) < 20
    assert q.wait_idle(0)


def test_a_waiting_request_leaves_when_stopped_or_cancelled() -> None:
    q = _queue()
    release = threading.Event()
    running, first = _in_thread(lambda: q.run([1], threading.Event(), lambda _: release.wait(10)))
    _wait(lambda: q.active == 1)
    stop = threading.Event()
    gone, out = _in_thread(lambda: q.run([1], stop, lambda x: x))
    _wait(lambda: q.waiting == 1)
    stop.set()  # the client left while waiting: nobody notifies the queue
    gone.join(5)
    assert isinstance(out[0], Cancelled) and q.waiting == 0
    q.cancel_all()  # the running one ends at its next text
    release.set()
    running.join(5)
    assert first == [[True]] or isinstance(first[0], Cancelled)


def test_close_stops_the_running_request_and_refuses_new_ones() -> None:
    """Counted, not timed: close() returns once the running request has left, and that
    request began no text after its stop but the one whose check came just before."""
    q = _queue()
    stop = threading.Event()
    late: list[bool] = []  # each text begun: was the stop set by then

    def nap(_: object) -> None:
        late.append(stop.is_set())
        time.sleep(0.01)

    thread, out = _in_thread(lambda: q.run(range(10**6), stop, nap))  # hours of naps
    _wait(lambda: q.active == 1)
    closing, _ = _in_thread(q.close)
    closing.join(60)  # a hang guard, not the bound
    assert not closing.is_alive() and q.active == 0
    assert sum(late) <= 1, sum(late)
    thread.join(5)
    assert isinstance(out[0], Cancelled)
    with pytest.raises(EngineError):
        q.run([1], threading.Event(), lambda x: x)
