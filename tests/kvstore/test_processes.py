"""Real processes sharing one cache directory, in turn; and one killed mid-write."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.conftest import seed_calibration

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def warmstart(*args: str, data_dir: Path, model: Path) -> subprocess.CompletedProcess[str]:
    cmd = [
        sys.executable,
        "-m",
        "runtime.cli",
        *args,
        "--data-dir",
        str(data_dir),
        "--model",
        str(model),
        "--n-ctx",
        "1024",
        "--resident-sequences",
        "2",
        "--chunk-tokens",
        "32",
        "--swap-in-threshold-tokens",
        "0",
        "--ram-pool-bytes",
        str(64 << 20),
        "--prewarm-sessions",
        "0",
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, check=True)


def test_two_processes_in_turn_see_each_others_sessions(
    tmp_path: Path, model_path: Path, calibration: Path
) -> None:
    seed_calibration(calibration, tmp_path)  # what is tested is the chunks they share
    q = "Why do cats purr? One sentence."
    first = warmstart(
        "ask", q, "--session", "one", "--max-tokens", "12", data_dir=tmp_path, model=model_path
    )
    assert "from disk" not in first.stderr
    second = warmstart(
        "ask", q, "--session", "two", "--max-tokens", "12", data_dir=tmp_path, model=model_path
    )
    assert first.stdout == second.stdout  # same greedy reply
    assert "from disk" in second.stderr, second.stderr  # the first process's chunks
    listed = warmstart("sessions", "list", data_dir=tmp_path, model=model_path).stdout
    assert "one" in listed and "two" in listed


WRITER = textwrap.dedent("""
    import random, sys
    from pathlib import Path
    import numpy as np
    from warmstart.runtime.kvstore._disk import DiskTier
    from warmstart.runtime.kvstore._pool import RamPool
    from warmstart.runtime.kvstore._store import TieredStore
    disk = DiskTier(Path(sys.argv[1]), "fp", 1, 1 << 30)
    store = TieredStore("fp", RamPool(1 << 24, 1 << 20), disk)
    parent, rng = store.root, random.Random(0)
    for i in range(100000):
        data = rng.randbytes(600_000)
        plan = store.prepare_store([i], [i + 1], lambda _n: len(data), parent=parent, start=i)
        (save,) = plan.saves
        save.buffer[: len(data)] = np.frombuffer(data, dtype=np.uint8)
        save.nbytes = len(data)
        parent = store.complete_store(plan)
        if i == 5:
            store.flush()  # these six are on disk whatever the machine's load
            print("writing", flush=True)
""")


def test_process_killed_mid_write_leaves_a_usable_cache(tmp_path: Path) -> None:
    from warmstart.runtime.kvstore._disk import DiskTier
    from warmstart.runtime.kvstore._pool import RamPool
    from warmstart.runtime.kvstore._store import TieredStore

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(tmp_path)], env=env, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "writing"
    time.sleep(1.0)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    proc.stdout.close()

    store = TieredStore("fp", RamPool(1 << 24, 1 << 20), DiskTier(tmp_path, "fp", 1, 1 << 30))
    records = list(store.ledger.records.values())
    assert records  # what was flushed before the kill is there
    readable = [r for r in records if store.read(r) is not None]
    assert readable  # and what reads back verifies; anything half-written was dropped
    store.close()
