"""Time bounds that hold on a busy machine.

A bound in seconds fails when other work shares the cores (CI, a second suite, a
compile): the same request that takes 0.1 s alone takes seconds then. So a test
that bounds a time measures a baseline of comparable work in the same test, on the
same machine, at the same load, and bounds the time as a multiple of it. The
slowest of a few baseline runs carries the machine's noise into the bound; the
fastest or the median of the measured runs keeps one preempted request from
failing the test.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

import psutil

T = TypeVar("T")


def timed(work: Callable[[], T]) -> tuple[float, T]:
    """Seconds ``work`` took, and what it returned."""
    t0 = time.monotonic()
    result = work()
    return time.monotonic() - t0, result


def slowest(work: Callable[[], object], runs: int = 3) -> float:
    """The slowest of ``runs`` runs of ``work``, in seconds: a baseline with the
    machine's present noise in it."""
    return max(timed(work)[0] for _ in range(runs))


def fastest(work: Callable[[], T], runs: int = 3) -> tuple[float, T]:
    """The fastest of ``runs`` runs of ``work`` and what its last run returned: the
    time measured with the least of the machine's noise in it."""
    times, result = zip(*(timed(work) for _ in range(runs)), strict=True)
    return min(times), result[-1]


def median(times: Sequence[float]) -> float:
    return float(statistics.median(times))


def cpu_seconds(process: psutil.Process) -> float:
    """The CPU seconds a process and its waited-for children used: a budget for fixed
    work (loading, calibrating) that holds however busy the machine is."""
    times = process.cpu_times()
    return float(times.user + times.system + times.children_user + times.children_system)
