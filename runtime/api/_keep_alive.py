"""``keep_alive``: how long the model stays loaded after a request (Ollama's field).

Ollama takes a number of seconds or a Go duration ("5m", "1h30m", "250ms"); 0
unloads the model once the reply is done, a negative value keeps it loaded for
good. warmstart's default, when a request gives none, is its own: loaded for good
(a local server with one model; Ollama's default is five minutes).

The timer (``Expiry``) only keeps time; unloading is the app state's (_state.py),
which waits for the replies in progress and the cache's disk writes first, so the
next request restores the conversation from disk instead of recomputing it.
"""

from __future__ import annotations

import logging
import math
import re
import threading
import time
from collections.abc import Callable
from typing import Annotated

from pydantic import AfterValidator
from pydantic_core import PydanticCustomError

from ..errors import RequestError

log = logging.getLogger(__name__)

_UNIT_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_DURATION = re.compile(rf"(?:{_PART.pattern})+")
# longer than this is "for good": no timer is set that far out
FOREVER_S = 10 * 365 * 24 * 3600.0
_WHY = 'give seconds or a duration such as "5m", "1h30m"; 0 unloads, a negative value never'


def keep_alive_seconds(value: str | float | None) -> float | None:
    """Seconds the model stays loaded after the request: None when not given,
    ``math.inf`` for good, 0 to unload after the reply. Raises RequestError
    (param ``keep_alive``) for a value that is not a duration."""
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        raise RequestError(f"keep_alive: {value!r} is not a duration; {_WHY}", "keep_alive")
    seconds = _number(value) if isinstance(value, float | int) else _text(value.strip())
    if math.isnan(seconds):
        raise RequestError(f"keep_alive: {value!r} is not a duration; {_WHY}", "keep_alive")
    if seconds < 0 or seconds >= FOREVER_S:
        return math.inf
    return seconds


def _number(value: float) -> float:
    return float(value)


def _text(text: str) -> float:
    sign = -1.0 if text.startswith("-") else 1.0
    body = text.lstrip("+-")
    try:
        return sign * float(body)  # seconds, as a number in a string
    except ValueError:
        pass
    if body == "0":
        return 0.0
    if not _DURATION.fullmatch(body):
        raise RequestError(f"keep_alive: {text!r} is not a duration; {_WHY}", "keep_alive")
    return sign * sum(float(n) * _UNIT_S[unit] for n, unit in _PART.findall(body))


def _checked(value: str | float | None) -> str | float | None:
    try:
        keep_alive_seconds(value)
    except RequestError as exc:
        message = str(exc).removeprefix("keep_alive: ")
        raise PydanticCustomError("value_error", "{message}", {"message": message}) from None
    return value


# the field as request bodies declare it (checked when the body is read: a 400 naming it)
KeepAliveValue = Annotated[str | float | None, AfterValidator(_checked)]


class Expiry:
    """When the loaded model is due to be unloaded, and a thread that calls
    ``unload`` then. ``set(seconds)`` after each reply (inf: never). ``unload`` waits
    for the replies in progress, so a reply that outlasts the time is not cut."""

    def __init__(
        self, unload: Callable[[], object], clock: Callable[[], float] = time.time
    ) -> None:
        self._unload = unload
        self._clock = clock
        self._cv = threading.Condition()
        self._due: float | None = None  # a wall-clock time; None: not due
        self._closed = False
        self._thread: threading.Thread | None = None

    @property
    def due(self) -> float | None:
        with self._cv:
            return self._due

    def set(self, seconds: float) -> None:
        with self._cv:
            self._due = None if math.isinf(seconds) else self._clock() + seconds
            if self._due is not None and self._thread is None and not self._closed:
                self._thread = threading.Thread(target=self._run, name="keep-alive", daemon=True)
                self._thread.start()
            self._cv.notify_all()

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._closed and (self._due is None or self._due > self._clock()):
                    wait = None if self._due is None else max(0.05, self._due - self._clock())
                    self._cv.wait(wait)
                if self._closed:
                    return
                self._due = None
            try:
                self._unload()
            except Exception:  # the next request reloads; nobody waits on this thread
                log.exception("unloading the model after keep_alive failed")

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join(5)
