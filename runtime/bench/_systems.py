"""The systems `make bench-peers` compares, as `Server`s: warmstart (calibrated first,
or a fresh data dir), upstream llama-server and hearth-llm, with the same model,
threads and total context, for the session scenario and for the trace."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from ._servers import Server, free_port, run_checked

TOTAL_CTX = 8192  # every server's whole context, in the scenario and in the trace


@dataclass(frozen=True)
class Setup:
    model: Path
    threads: int
    warmstart_args: list[str]
    llama_server: Path | None
    hearth: Path | None
    llama_fa: str = "on"  # llama-server's -fa


def _warmstart(setup: Setup, name: str, calibrate: bool, extra: list[str]) -> Server:
    def argv(port: int, home: Path) -> list[str]:
        return [
            sys.executable,
            "-m",
            "warmstart.runtime.cli",
            "serve",
            "--data-dir",
            str(home / "data"),
            "--model",
            str(setup.model),
            "--port",
            str(port),
            *setup.warmstart_args,
            *extra,
        ]

    def doctor(home: Path, env: dict[str, str]) -> None:
        run_checked(
            [
                sys.executable,
                "-m",
                "warmstart.runtime.cli",
                "doctor",
                "--data-dir",
                str(home / "data"),
                "--model",
                str(setup.model),
                *setup.warmstart_args,
            ],
            "warmstart doctor",
        )

    return Server(name, argv, prepare=doctor if calibrate else None)


def _llama_server(setup: Setup, slots: int) -> Server:
    assert setup.llama_server is not None
    binary = setup.llama_server

    # --no-repack: on AMX machines llama.cpp's repacked weights take another code path;
    # -fa as asked (on by default); the default --cache-ram (8 GiB) keeps prompts in RAM
    def argv(port: int, home: Path) -> list[str]:
        return [
            str(binary),
            "-m",
            str(setup.model),
            "-c",
            str(TOTAL_CTX),
            "-t",
            str(setup.threads),
            "-np",
            str(slots),
            "--no-repack",
            "-fa",
            setup.llama_fa,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ]

    return Server("llama-server", argv)


def _hearth(setup: Setup) -> Server:
    assert setup.llama_server is not None and setup.hearth is not None

    def argv(port: int, home: Path) -> list[str]:
        return [
            sys.executable,
            "-m",
            "hearth",
            "serve",
            "--model",
            str(setup.model),
            "--port",
            str(port),
            "--upstream-port",
            str(free_port()),
            "--cache-dir",
            str(home / "cache"),
            "--ctx",
            str(TOTAL_CTX),
            "--",
            "-t",
            str(setup.threads),
            "--no-repack",
            "-fa",
            setup.llama_fa,
        ]

    # hearth starts `llama-server` from PATH
    path = f"{setup.llama_server.parent}{os.pathsep}{os.environ.get('PATH', '')}"
    return Server("hearth", argv, env={"PYTHONPATH": str(setup.hearth), "PATH": path})


def scenario_server(setup: Setup, name: str) -> Server:
    if name == "llama-server":
        return _llama_server(setup, slots=1)
    if name == "hearth":
        return _hearth(setup)
    return _warmstart(setup, name, calibrate=name == "warmstart", extra=[])


def trace_server(setup: Setup, name: str, clients: int) -> Server:
    """The same total context, one conversation live per client: llama-server with
    ``-np clients`` slots, warmstart with as many resident sequences, each
    ``TOTAL_CTX // clients`` tokens."""
    if name == "llama-server":
        return _llama_server(setup, slots=clients)
    per = str(TOTAL_CTX // clients)
    extra = ["--n-ctx", per, "--resident-sequences", str(clients)]
    return _warmstart(setup, name, calibrate=True, extra=extra)
