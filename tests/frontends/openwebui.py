"""Open WebUI as a user runs it, offline, with warmstart as its one connection.

Every setting here is an environment variable Open WebUI reads at its first start
(afterwards it keeps them in its own database); docs/api.md gives the same values as
the fields of its connection settings. Offline means: no model hub (OFFLINE_MODE sets
HF_HUB_OFFLINE), no update check, no telemetry, no local embedding model (an empty
RAG_EMBEDDING_MODEL loads none, so torch never runs), no web search.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from tests.api.conftest import free_port

START_TIMEOUT_S = 600.0  # its import of torch, transformers and chromadb on a busy machine

OFFLINE = {
    "OFFLINE_MODE": "true",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "ENABLE_VERSION_UPDATE_CHECK": "false",
    "ANONYMIZED_TELEMETRY": "false",  # chromadb
    "DO_NOT_TRACK": "true",
    "SCARF_NO_ANALYTICS": "true",
    "RAG_EMBEDDING_MODEL": "",
    "RAG_RERANKING_MODEL": "",
    "ENABLE_WEB_SEARCH": "false",
    "ENABLE_IMAGE_GENERATION": "false",
    "ENABLE_CODE_INTERPRETER": "false",
    "WEBUI_SECRET_KEY": "warmstart-frontends-test",
    "USER_AGENT": "warmstart-frontends-test",
}

# Open WebUI 0.12 sends its 36 built-in tools (memory, notes, calendar, ...) with every
# chat message of a model whose "Builtin Tools" capability is on, the default: about
# 6,600 tokens in SmolLM2's template, more than the default model's context, which
# warmstart refuses with a 400 that names the tools' definitions (Open WebUI shows it).
# A user of a small model turns that capability off for every model, as here
# (Admin Panel > Settings > Models > model defaults; docs/api.md).
# The replies are held to 200 tokens (the same place, "Max Tokens"): on a shared 2-core
# machine a 512-token reply and the background tasks after it took ten minutes.
SMALL_MODEL = {
    "DEFAULT_MODEL_METADATA": '{"capabilities": {"builtin_tools": false}}',
    "DEFAULT_MODEL_PARAMS": '{"max_tokens": 200}',
}


def connection_env(kind: str, warmstart_url: str) -> dict[str, str]:
    """The one connection, as a user would type it into Open WebUI's settings."""
    if kind == "ollama":
        return {
            "ENABLE_OLLAMA_API": "true",
            "OLLAMA_BASE_URL": warmstart_url,
            "ENABLE_OPENAI_API": "false",
        }
    if kind == "openai":
        return {
            "ENABLE_OLLAMA_API": "false",
            "ENABLE_OPENAI_API": "true",
            "OPENAI_API_BASE_URL": warmstart_url + "/v1",
            "OPENAI_API_KEY": "local",
        }
    raise ValueError(f"unknown connection kind {kind!r}")


def _wait_up(url: str, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"Open WebUI exited early:\n{log.read_text(errors='replace')}")
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(url + "/health", timeout=2.0).status_code == 200:
                return
        time.sleep(1.0)
    raise RuntimeError(f"Open WebUI not up after {START_TIMEOUT_S} s")


@contextlib.contextmanager
def open_webui(venv: Path, workdir: Path, kind: str, warmstart_url: str) -> Iterator[str]:
    """Runs ``open-webui serve`` on a free loopback port with a fresh data dir in
    ``workdir``; yields its URL. Its log is ``workdir/open-webui.log``."""
    port = free_port()
    data = workdir / "data"
    data.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "OLLAMA_"))}
    env.update(OFFLINE, **SMALL_MODEL, DATA_DIR=str(data), **connection_env(kind, warmstart_url))
    argv = [str(venv / "bin" / "open-webui"), "serve", "--host", "127.0.0.1", "--port", str(port)]
    log = workdir / "open-webui.log"
    with log.open("wb") as out:
        process = subprocess.Popen(argv, cwd=workdir, env=env, stdout=out, stderr=out)
        try:
            url = f"http://127.0.0.1:{port}"
            _wait_up(url, process, log)
            yield url
        finally:
            process.terminate()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
