"""A fresh `warmstart ask`, timed from before its process starts to the first byte of
its reply: what a user waits for a repeated question after a restart."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from typing import Any

from ..settings import Settings

# the runtime package (warmstart.runtime): its command line runs in the timed child processes
_RUNTIME = str(__package__).rpartition(".")[0]

START_QUESTION = "Why is the sky blue? Answer in two sentences."


def _cli_args(settings: Settings) -> tuple[list[str], dict[str, str]]:
    """The settings that differ from the defaults, as `warmstart` flags, and as
    environment variables for the booleans a flag cannot turn off."""
    flags, env = [], {}
    for name, value in settings.model_dump(exclude_defaults=True).items():
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            if value:
                flags.append(flag)
            else:
                env[f"WARMSTART_{name.upper()}"] = "false"
        elif isinstance(value, tuple | list):
            flags += [flag, ",".join(str(v) for v in value)]
        else:
            flags += [flag, str(value)]
    return flags, env


def ask_start_to_first_token(settings: Settings, question: str = START_QUESTION) -> dict[str, Any]:
    """Runs `warmstart ask QUESTION` as a new process and times it from before the
    process starts to the first byte of its reply (the CLI writes each token as it
    comes): interpreter start, imports, model load and the request, as a user waits."""
    cmd = [sys.executable, "-m", _RUNTIME + ".cli", "ask", question, "--max-tokens", "8"]
    flags, env = _cli_args(settings)
    cmd += flags
    # stderr to a file, not a pipe: nobody reads it until the first byte of stdout, and
    # a child that logs more than a pipe holds first would wait on it for ever
    with tempfile.TemporaryFile() as log:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, env={**os.environ, **env})
        assert proc.stdout is not None
        first = proc.stdout.read(1)
        first_s = time.perf_counter() - t0
        proc.communicate()
        log.seek(0)
        err = log.read().decode("utf-8", "replace")
    if proc.returncode != 0 or not first:
        raise RuntimeError(f"warmstart ask failed ({proc.returncode}):\n{err[-3000:]}")
    summary = [ln for ln in err.splitlines() if ln.startswith("[prompt")]
    return {
        "process_start_to_first_token_s": first_s,
        "process_wall_s": time.perf_counter() - t0,
        "summary": summary[-1] if summary else "",
    }


def repeated_ask(settings: Settings) -> dict[str, Any]:
    """A question asked once in a fresh process, then again in another: the second is
    the one timed (its prompt comes from the disk tier)."""
    first = ask_start_to_first_token(settings)
    return {"first": first, "repeat": ask_start_to_first_token(settings)}
