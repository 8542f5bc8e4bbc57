"""A good citizen on a desktop, on the real model: a memory hog takes the system's
available memory below the floor, the runtime's RAM pool gives its pages back (the
process's resident memory falls), replies stay equal to --no-cache, the demoted chats
answer from disk, and the pool grows again once the hog is gone.

The floor is a setting, put 1.5 GiB under what is available when the squeeze starts,
so the hog takes a little over that, not the whole machine."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from warmstart.runtime.kvstore._pressure import read_available
from warmstart.runtime.types import Message, Request

from tests.conftest import chat, vm_rss, wait_for

MiB = 1 << 20
MARGIN = 1536 * MiB  # room under the available memory for the two runtimes of the test
HOG = """
import select, sys
from warmstart.runtime.kvstore._pressure import read_available
target, cap = int(sys.argv[1]), int(sys.argv[2])
held, step, said = [], 16 << 20, False
while True:  # holds the system at the target, whatever other programs do meanwhile
    available = read_available()
    if available > target and len(held) * step < cap:
        held.append(b"\\x01" * step)  # written, so committed
        continue
    if available < target - 32 * step and held:  # others took memory: give some back
        held.pop()
        continue
    if not said:
        print(len(held) * step, flush=True)
        said = True
    if select.select([sys.stdin], [], [], 0.05)[0]:  # the test closed our stdin
        break
"""

pytestmark = pytest.mark.skipif(
    not Path("/proc/self/status").exists(), reason="reads MemAvailable and VmRSS (Linux)"
)


def inventory(k: int) -> Message:
    items = " ".join(
        f"Item {i}: the {['red', 'green', 'blue', 'amber'][(i + k) % 4]} crate on shelf "
        f"{(i * k) % 7} holds {3 * i + k} bolts."
        for i in range(22)
    )
    return Message("system", f"Inventory {k}. Answer from it only. {items}")


def requests() -> list[Request]:
    questions = ("Which shelf holds item 3?", "How many bolts are in item 5?")
    return [chat(questions[k % 2], system=inventory(k), max_tokens=12) for k in range(5)]


def answer(rt, request: Request):  # type: ignore[no-untyped-def]
    text, report = rt.generate(request).text()
    rt.wait_idle(120)
    return str(text), report


def ram(rt) -> dict:  # type: ignore[no-untyped-def,type-arg]
    return rt.stats()["tiers"]["ram"]


def test_a_memory_hog_makes_the_pool_give_memory_back(make_runtime, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    available = read_available()
    assert available is not None
    if available < 4 * MARGIN:
        pytest.skip(f"only {available // MiB} MiB available: no room for a hog")
    oracle = make_runtime(tmp_path / "oracle", no_cache=True)
    expected = [answer(oracle, r)[0] for r in requests()]
    # a floor of 1 MiB while the pool fills: other programs on a busy machine may take
    # gigabytes meanwhile, and must not squeeze the pool before the test measures it
    rt = make_runtime(tmp_path / "cached", memory_floor_bytes=MiB, memory_check_s=0.2)
    assert rt.watcher is not None
    for request, text in zip(requests(), expected, strict=True):
        assert answer(rt, request)[0] == text
    rt.store.flush()  # every chunk on disk before the squeeze
    pool_before, rss_before = ram(rt)["resident_bytes"], vm_rss()
    assert pool_before >= 20 * MiB, ram(rt)
    assert rt.stats()["memory"]["pressure_events"] == 0, "squeezed before the hog started"
    available = read_available()
    assert available is not None
    floor = available - MARGIN  # now the floor the hog pushes the system under
    rt.watcher.floor = floor

    # the hog takes the system to the floor, less what the pool holds and some more
    target = floor - pool_before - 128 * MiB
    hog = subprocess.Popen(
        [sys.executable, "-c", HOG, str(target), str(4 * MARGIN)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert hog.stdout is not None
        took = int(hog.stdout.readline())
        assert wait_for(lambda: ram(rt)["resident_bytes"] == 0), (took, ram(rt))
        stats = rt.stats()
        memory = stats["memory"]
        assert memory["under_pressure"] and memory["pressure_events"] >= 1
        assert memory["returned_bytes"] >= pool_before and stats["tiers"]["ram"]["tokens"] == 0
        assert stats["tiers"]["ram"]["limit_bytes"] == 0
        rss_after = vm_rss()
        print(
            f"pool {pool_before / MiB:.1f} MiB given back; VmRSS {rss_before / MiB:.0f} -> "
            f"{rss_after / MiB:.0f} MiB; the hog took {took / MiB:.0f} MiB"
        )
        assert rss_before - rss_after >= pool_before * 3 // 4, (rss_before, rss_after)
        # the demoted chats answer from disk, exactly as without a cache
        rt.evict_live()
        for request, text in zip(requests(), expected, strict=True):
            got, report = answer(rt, request)
            assert got == text
            assert report.restored["disk"] > 0 and report.restored["ram"] == 0, report
        assert ram(rt)["resident_bytes"] == 0  # read into staging, not back into the pool
    finally:
        assert hog.stdin is not None and hog.stdout is not None
        hog.stdin.close()
        hog.wait(60)
        hog.stdout.close()
    # memory is back: the pool may grow to its capacity and holds chunks again. Another
    # process may take the memory meanwhile (a second suite beside this one did): the
    # pool then gives it back again, which its pressure count shows, and the test waits
    # for the memory once more; without such a squeeze, a pool that keeps nothing fails
    for k in (9, 10, 11):
        assert wait_for(lambda: ram(rt)["limit_bytes"] == ram(rt)["capacity_bytes"])
        assert not rt.stats()["memory"]["under_pressure"]
        squeezed = rt.stats()["memory"]["pressure_events"]
        extra = chat(f"Which shelf holds item {k}?", system=inventory(k), max_tokens=12)
        assert answer(rt, extra)[0] == answer(oracle, extra)[0]
        if ram(rt)["tokens"] > 0 and ram(rt)["resident_bytes"] > 0:
            break
        assert rt.stats()["memory"]["pressure_events"] > squeezed, ram(rt)
    else:
        pytest.fail(f"squeezed by other processes through three requests: {ram(rt)}")
