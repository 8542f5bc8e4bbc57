"""The systems `make bench-peers` compares, as `Server`s: warmstart (calibrated first,
or a fresh data dir), upstream llama-server and hearth-llm, with the same model,
threads and total context, for the session scenario and for the trace."""

from __future__ import annotations

import math
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import psutil

from ._servers import Server, free_port, run_checked

TOTAL_CTX = 8192  # every server's whole context, in the scenario and in the trace
# warmstart reads its own copy of a model file up to this share of the host's RAM
OWN_COPY_RAM_SHARE = 0.1


@dataclass(frozen=True)
class Setup:
    model: Path
    threads: int
    warmstart_args: list[str]
    llama_server: Path | None
    hearth: Path | None
    llama_fa: str = "on"  # llama-server's -fa


def copies_model(model: Path) -> bool:
    """Whether warmstart gets its own copy of ``model`` (``own_copy``; a missing file is
    left for the server to report)."""
    size = model.stat().st_size if model.is_file() else math.inf
    return size <= OWN_COPY_RAM_SHARE * psutil.virtual_memory().total


def own_copy(model: Path, home: Path) -> Path:
    """The model file warmstart serves in ``home``: a copy of its own, as a server alone
    on the machine has, unless the file is big for this host's RAM (an 8B model's two
    page-cached copies would crowd out the KV pools: then both read the one file).

    Two servers that map the same file share its page cache, and on the development
    machine that cost warmstart 1-10% of its decode speed beside llama-server (served
    decode in alternating rounds, the same servers: 0.90-0.99 of llama-server's with the
    one file, 1.05-1.08 with a file each, 2026-12-05), a cost neither pays alone."""
    if not copies_model(model):
        return model
    copy = home / "model" / model.name
    if not copy.exists() or copy.stat().st_size != model.stat().st_size:
        copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(model, copy)
    return copy


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
            str(own_copy(setup.model, home)),
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
                str(own_copy(setup.model, home)),
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
