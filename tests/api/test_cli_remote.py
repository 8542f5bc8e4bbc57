"""`warmstart cache` and `warmstart sessions` ask the running server when one answers
(its counters, its store) and use the files, loading no model, when none does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
from warmstart.runtime.serving._sessions import SessionBook
from warmstart.runtime.types import Message

from .conftest import free_port


def _cli(tmp_path: Path, port: int, *args: str, key: str | None = None) -> Any:
    config = tmp_path / "empty.toml"
    config.write_text("")
    env = {k: v for k, v in os.environ.items() if not k.startswith("WARMSTART_")}
    env["WARMSTART_CONFIG"] = str(config)
    if key:
        env["WARMSTART_API_KEY"] = key
    # a model that does not exist: none of these commands may load one
    cmd = [sys.executable, "-m", "warmstart.runtime.cli", *args, "--port", str(port)]
    cmd += ["--data-dir", str(tmp_path), "--model", str(tmp_path / "absent.gguf")]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60)


def _chat(srv: Any, key: str, session: str) -> None:
    body = {"messages": [{"role": "user", "content": "hello there"}], "max_tokens": 4}
    headers = {"Authorization": f"Bearer {key}", "X-Warmstart-Session": session}
    reply = httpx.post(srv.v1 + "/chat/completions", json=body, headers=headers, timeout=30)
    assert reply.status_code == 200, reply.text


def test_cache_stats_reports_the_running_servers_counters(start: Any, tmp_path: Path) -> None:
    key = "k" * 20
    with start("--api-key", key) as srv:
        port = int(srv.base_url.rsplit(":", 1)[1])
        for i in range(3):
            _chat(srv, key, f"s{i}")
        proc = _cli(tmp_path, port, "cache", "stats", "--json", key=key)
        assert proc.returncode == 0, proc.stderr
        stats = json.loads(proc.stdout)
        assert stats["requests"] == 3  # the server's counters, not a fresh process's
        listed = _cli(tmp_path, port, "sessions", "list", key=key)
        assert listed.returncode == 0 and "s1" in listed.stdout, listed.stderr
        deleted = _cli(tmp_path, port, "sessions", "delete", "s1", key=key)
        assert deleted.returncode == 0 and "deleted" in deleted.stdout
        assert _cli(tmp_path, port, "cache", "clear", key=key).returncode == 0
        refused = _cli(tmp_path, port, "cache", "stats")  # no key: one clear line
        assert refused.returncode == 2 and "api_key" in refused.stderr
        assert "Traceback" not in refused.stderr


def test_without_a_server_they_use_the_files_and_load_no_model(tmp_path: Path) -> None:
    port = free_port()
    stats = _cli(tmp_path, port, "cache", "stats", "--json")
    assert stats.returncode == 0, stats.stderr
    assert json.loads(stats.stdout)["tiers"]["disk"]["tokens"] == 0
    table = _cli(tmp_path, port, "cache", "stats")
    assert "KV cache (the files in" in table.stdout and "no server answered" in table.stdout
    assert _cli(tmp_path, port, "sessions", "list").returncode == 0
    book = SessionBook(tmp_path / "sessions.db")
    book.save("c0123456789ab", (Message("user", "Hi"),), 3, None, None, anonymous=True)
    book.save("my-chat", (Message("user", "Plan a trip"),), 4, None, None)
    book.close()
    listed = _cli(tmp_path, port, "sessions", "list").stdout
    assert "my-chat" in listed and "c0123456789ab" not in listed
    every = _cli(tmp_path, port, "sessions", "list", "--all").stdout
    assert "c0123456789ab" in every and "(no session id)" in every
    gone = _cli(tmp_path, port, "sessions", "delete", "nope")
    assert gone.returncode == 1 and "no session nope" in gone.stdout
