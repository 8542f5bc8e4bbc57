"""A port in use or an address this machine lacks is reported before the model loads:
at once, in one line, exit status 2 (a real process)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.timing import slowest

# What ``warmstart serve`` imports before it binds (cli/_commands.py)
SERVE_IMPORTS = (
    "warmstart.runtime.cli._main",
    "warmstart.runtime.api",
    "warmstart.runtime.serving._factory",
)


@pytest.fixture
def held_port() -> Iterator[int]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    yield sock.getsockname()[1]
    sock.close()


def _serve(tmp_path: Path, *flags: str) -> tuple[subprocess.CompletedProcess[str], float]:
    config = tmp_path / "empty.toml"
    config.write_text("")
    env = {k: v for k, v in os.environ.items() if not k.startswith("WARMSTART_")}
    env["WARMSTART_CONFIG"] = str(config)
    # a model that does not exist: the bind must fail first, or this says "no model"
    cmd = [sys.executable, "-m", "warmstart.runtime.cli", "serve", "--data-dir", str(tmp_path)]
    cmd += ["--model", str(tmp_path / "absent.gguf"), *flags]
    started = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    return proc, time.monotonic() - started


def test_a_port_in_use_is_reported_before_the_model_loads(tmp_path: Path, held_port: int) -> None:
    proc, took = _serve(tmp_path, "--port", str(held_port))
    # the bound: the interpreter's start and the imports serve binds with, timed
    # alongside (the slowest of two)
    imports = [sys.executable, "-c", f"import {', '.join(SERVE_IMPORTS)}"]
    started = slowest(lambda: subprocess.run(imports, check=True, timeout=120), runs=2)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "already in use" in lines[0] and str(held_port) in lines[0]
    assert "Traceback" not in proc.stderr
    print(f"\nbound by a port in use after {took:.2f} s; the imports: {started:.2f} s")
    assert took < 2 * started, (took, started)  # no model load, no probe of the machine


def test_an_address_this_machine_lacks_is_reported_before_the_model_loads(
    tmp_path: Path,
) -> None:
    proc, _ = _serve(tmp_path, "--host", "192.0.2.1", "--api-key", "k" * 16, "--port", "0")
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "not an address of this machine" in lines[0], proc.stderr
