"""bench-peers waits for every server to be idle before the next system's step: a
system still computing after its reply (warmstart settling a reply at the 1B shape)
took both cores from llama-server's next step and made its decode read 1-4 tok/s
instead of 17."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest
from warmstart.runtime.bench._servers import Served, wait_quiet

BUSY_THEN_IDLE = (
    "import time\nt = time.process_time()\n"
    "while time.process_time() - t < 1.5: pass\ntime.sleep(60)"
)


def _served(code: str) -> Iterator[Served]:
    proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    url = Served("http://127.0.0.1:1")
    url.pid = proc.pid
    try:
        yield url
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture
def busy() -> Iterator[Served]:
    yield from _served(BUSY_THEN_IDLE)


@pytest.fixture
def idle() -> Iterator[Served]:
    yield from _served("import time\ntime.sleep(60)")


def test_it_waits_while_a_server_computes(busy: Served, idle: Served) -> None:
    # 1.5 s of CPU takes at least 1.5 s of wall time, however loaded the machine
    assert wait_quiet([idle, busy], limit_s=50, window_s=0.5) >= 1.0


def test_an_idle_server_is_not_waited_for(idle: Served) -> None:
    assert wait_quiet([idle], limit_s=50, window_s=0.5) < 50
