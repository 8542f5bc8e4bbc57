"""The installed PySide6 keeps Python's reference counts straight.

A regression guard on the pinned PySide6 (pyproject.toml). PySide6 6.12.0 broke this
twice: every ``emit()`` dropped a reference to ``True``, and every call of a method
returning ``None`` (``setText``, ``resize``, ``processEvents`` ...) dropped one to
``None``. A streamed reply makes several such calls per token, so a long session ended
in "Fatal Python error: none_dealloc" (or "bool_dealloc"). The app calls
``signal.emit()`` plainly and relies on the pin; these tests fail if a PySide6 with
either defect is installed. (On Python 3.12+ ``True`` and ``None`` are immortal, the
counts never move and the defects are harmless, so the tests pass there too.)
"""

from __future__ import annotations

import ctypes
import sys

from PySide6.QtCore import QObject, Signal
from PySide6.QtWidgets import QLabel


def _give_back(obj: object, before: int) -> int:
    """The references ``obj`` lost since ``before``, restored so later tests live on."""
    lost = max(0, before - sys.getrefcount(obj))
    for _ in range(lost):
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(obj))
    return lost


class _Probe(QObject):
    fired = Signal()


def test_calls_returning_none_keep_nones_reference(qapp):
    label = QLabel()
    before = sys.getrefcount(None)
    for i in range(50):
        label.setText(str(i))
    assert _give_back(None, before) == 0


def test_emit_keeps_trues_reference(qapp):
    probe = _Probe()
    before = sys.getrefcount(True)
    for _ in range(50):
        probe.fired.emit()
    assert _give_back(True, before) == 0
