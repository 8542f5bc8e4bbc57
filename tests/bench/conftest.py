"""What the benchmark tests share."""

from __future__ import annotations

import sys

from warmstart.runtime.bench import _servers


def fake_system(name: str) -> _servers.Server:
    """A system of the benchmark that is the runtime's fake behind the real HTTP API:
    the benchmark's logic runs without a model (warmstart serve's own calibration
    takes minutes on a loaded 2-core machine)."""
    argv = [sys.executable, "-m", "warmstart.runtime.api", "--fake", "--port"]
    return _servers.Server(name, lambda port, home: [*argv, str(port)])
