"""The real-model server the API tests start: ``warmstart serve`` on the default
model (SmolLM2-135M) on a free loopback port, with settings small enough for a
module to stay within minutes on two busy cores."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from tests.api.conftest import Server, run_server
from tests.conftest import seed_calibration

N_CTX = 2048
# Loading the model and calibrating the machine on a fresh data dir: seconds of the
# server's own CPU (run_server). Not quite independent of the load: llama.cpp's threads
# spin at their barriers while a sibling waits for a core, so on a machine with one
# core busy elsewhere the same calibration used over 180 CPU seconds (a clean-clone
# run beside stress-ng --cpu 1: the first real server of the suite gave up at 180).
START_TIMEOUT_S = 600.0


def serve_command(model: Path, data_dir: Path, resident: int = 8) -> list[str]:
    """The command line of a real server on ``data_dir`` with ``resident`` sequences."""
    settings = (
        "--n-ctx", str(N_CTX),
        "--resident-sequences", str(resident),
        "--chunk-tokens", "64",
        "--ram-pool-bytes", str(256 << 20),
        "--prewarm-sessions", "0",
    )  # fmt: skip
    cmd = [sys.executable, "-m", "warmstart.runtime.cli", "serve"]
    return [*cmd, "--data-dir", str(data_dir), "--model", str(model), *settings]


@contextlib.contextmanager
def real_server(
    model: Path,
    data_dir: Path,
    *args: str,
    calibration: Path | None,
    env: dict[str, str] | None = None,
    resident: int = 8,
    preexec_fn: Callable[[], None] | None = None,
    expected: Sequence[str] = (),
) -> Iterator[Server]:
    """``warmstart serve`` on the real model and a free loopback port, stopped after
    (``env``: variables to add, such as a hub imitation's HF_ENDPOINT).
    ``calibration``: the run's calibration record (tests/conftest.py), copied into a
    data dir that has none so the server starts without calibrating; None where the
    test needs the server to calibrate (or to reuse its data dir's own record).

    Any traceback or error in its log fails the test that owns it: the API hides
    a failure that happens after the reply (capturing chunks, saving the session).
    ``expected``: log lines that a test causes on purpose, not failures."""
    data_dir.mkdir(parents=True, exist_ok=True)
    seed_calibration(calibration, data_dir)
    cmd = serve_command(model, data_dir, resident)
    with run_server(
        cmd,
        *args,
        start_timeout_s=START_TIMEOUT_S,
        log_dir=data_dir,
        env=env,
        preexec_fn=preexec_fn,
    ) as server:
        yield server
    log = server.log()
    for line in expected:
        log = log.replace(line, "")
    assert "Traceback" not in log and "ERROR" not in log, log[-4000:]
