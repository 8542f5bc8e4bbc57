"""Working around defects of the installed PySide6.

PySide6 6.12.0: ``SignalInstance.emit()`` returns ``True`` without taking a reference
to it, so every call drops ``True``'s reference count by one; after a few hundred
emits CPython aborts with "bool_dealloc: deallocating True or False". A streamed reply
emits once per token, so the app would die within its first long answer. ``emit()``
below gives the reference back, but only when a probe at import shows the defect, so
a fixed PySide6 runs untouched.
"""

from __future__ import annotations

import ctypes
import sys
from typing import Any

from PySide6.QtCore import QObject, Signal, SignalInstance


class _Probe(QObject):
    fired = Signal()


def _emit_drops_a_reference() -> bool:
    probe = _Probe()
    before = sys.getrefcount(True)
    for _ in range(4):
        probe.fired.emit()
    lost = before - sys.getrefcount(True)
    for _ in range(max(0, lost)):
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(True))
    return lost > 0


EMIT_DROPS_A_REFERENCE = _emit_drops_a_reference()


def emit(signal: SignalInstance, *args: Any) -> None:
    """``signal.emit(*args)``, safe on every PySide6 version (see the module docstring)."""
    result: Any = signal.emit(*args)  # type: ignore[func-returns-value]
    if EMIT_DROPS_A_REFERENCE and isinstance(result, bool):
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(result))
