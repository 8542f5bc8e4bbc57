"""`warmstart serve` on the real model introduces itself (its URLs, whether a key is
needed), leaves a note in the data dir through which `cache stats` and `sessions`
find it on any port without --port, and removes the note when it stops."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.api.conftest import Server, run_server
from tests.conftest import seed_extra_buffer_verdicts

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SMALL = ("--n-ctx", "1024", "--resident-sequences", "2", "--prewarm-sessions", "0")
START_TIMEOUT_S = 600.0  # CPU seconds of a first load and calibration (see tests/api/real.py)


def _cli(data_dir: Path, *args: str, env: dict[str, str] | None = None) -> Any:
    """A CLI command sharing the server's data dir, with no --port."""
    config = data_dir / "empty.toml"
    config.write_text("")
    full = {k: v for k, v in os.environ.items() if not k.startswith("WARMSTART_")}
    full.update(WARMSTART_CONFIG=str(config), PYTHONPATH=str(ROOT), **(env or {}))
    cmd = [sys.executable, "-m", "warmstart.runtime.cli", *args, "--data-dir", str(data_dir)]
    return subprocess.run(cmd, capture_output=True, text=True, env=full, timeout=120)


def _serve(model: Path, data_dir: Path, *flags: str) -> Any:
    seed_extra_buffer_verdicts(data_dir)
    cmd = [sys.executable, "-m", "warmstart.runtime.cli", "serve", "--data-dir", str(data_dir)]
    cmd += ["--model", str(model), *SMALL, *flags]
    config = data_dir / "empty.toml"
    config.write_text("")
    return run_server(
        cmd,
        start_timeout_s=START_TIMEOUT_S,
        log_dir=data_dir,
        env={"WARMSTART_CONFIG": str(config)},
    )


def _wait_for_line(server: Server, text: str) -> str:
    """The introduction is printed right after the socket listens: /health may answer
    a moment before it is in the log."""
    from tests.conftest import wait_for

    assert wait_for(lambda: text in server.log(), timeout=30), server.log()
    return server.log()


def test_serve_introduces_itself_and_the_cli_finds_it_without_a_port(
    model_path: Path, tmp_path: Path
) -> None:
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    with _serve(model_path, data_dir) as server:
        port = int(server.base_url.rsplit(":", 1)[1])
        log = _wait_for_line(server, "OpenAI base URL")
        assert f"OpenAI base URL  http://127.0.0.1:{port}/v1" in log
        assert f"Ollama URL       http://127.0.0.1:{port}" in log
        assert "API key          not needed" in log
        note = data_dir / "server.json"
        assert stat.S_IMODE(note.stat().st_mode) == 0o600
        written = json.loads(note.read_text())
        assert written["pid"] == server.process.pid and written["port"] == port

        # one request that names no session (curl, a plain client) and one that does
        body = {"model": "default", "messages": [{"role": "user", "content": "Hi"}]}
        plain = httpx.post(server.base_url + "/api/chat", content=json.dumps(body), timeout=120)
        assert plain.status_code == 200, plain.text
        named = httpx.post(
            server.v1 + "/chat/completions",
            json={**body, "max_tokens": 4},
            headers={"X-Warmstart-Session": "my-chat"},
            timeout=120,
        )
        assert named.status_code == 200, named.text

        table = _cli(data_dir, "cache", "stats")
        assert table.returncode == 0, table.stderr
        assert f"the server at http://127.0.0.1:{port}" in table.stdout
        assert "requests 2" in table.stdout and "live" in table.stdout
        stats = json.loads(_cli(data_dir, "cache", "stats", "--json").stdout)
        assert stats["requests"] == 2  # the server's own counters
        listed = _cli(data_dir, "sessions", "list").stdout
        assert "my-chat" in listed and len(listed.strip().splitlines()) == 1, listed
        every = _cli(data_dir, "sessions", "list", "--all").stdout
        assert len(every.strip().splitlines()) == 2 and "(no session id)" in every
    assert not note.exists()  # a clean stop removes it
    log = server.log()
    assert "Traceback" not in log and "ERROR" not in log, log
    # no server now: the files answer, and say so
    offline = _cli(data_dir, "cache", "stats")
    assert offline.returncode == 0 and "no server answered" in offline.stdout


def test_serve_with_a_key_says_where_the_key_is(model_path: Path, tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    key_file = tmp_path / "api-key"
    key_file.write_text("a-key-of-twenty-chars\n")
    with _serve(model_path, data_dir, "--api-key-file", str(key_file)) as server:
        log = _wait_for_line(server, "API key")
        assert (
            f"API key          required: send 'Authorization: Bearer KEY', the key in {key_file}"
            in log
        )
        assert "a-key-of-twenty-chars" not in log
        assert json.loads((data_dir / "server.json").read_text())["key_required"] is True
        refused = _cli(data_dir, "cache", "stats")  # found through the note, but no key
        assert refused.returncode == 2 and "api_key" in refused.stderr
        keyed = _cli(data_dir, "cache", "stats", env={"WARMSTART_API_KEY_FILE": str(key_file)})
        assert keyed.returncode == 0 and "the server at" in keyed.stdout, keyed.stderr
