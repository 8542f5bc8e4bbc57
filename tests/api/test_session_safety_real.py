"""Issue 23's items 6 and 7 on a real ``warmstart serve`` (the default model): a damaged
sessions.db is set aside and the server starts; files left readable by others are
made private at start; sessions stored under unsafe ids before ids were checked are
listed, read and deleted through the API and the CLI, and new unsafe ids are refused."""

from __future__ import annotations

import json
import os
import sqlite3
import stat
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from warmstart.app.core.api import session_path

from tests.api.conftest import run_server
from tests.conftest import seed_extra_buffer_verdicts

pytestmark = pytest.mark.slow

START_TIMEOUT_S = 600.0  # CPU seconds: a fresh data dir calibrates first (see tests/api/real.py)
SETTINGS = (
    "--n-ctx", "1024",
    "--resident-sequences", "2",
    "--chunk-tokens", "32",
    "--ram-pool-bytes", str(64 << 20),
    "--prewarm-sessions", "0",
)  # fmt: skip
SECRET = "legacy-secret-5521"
# ids sessions were stored under before the rule (through import, the header, user)
LEGACY = ("../x/y", "../../etc/passwd", "/etc/passwd", "..", "a\x1bb")


def _serve(model: Path, data: Path, logs: Path):  # type: ignore[no-untyped-def]
    cmd = [sys.executable, "-m", "warmstart.runtime.cli", "serve", "--data-dir", str(data)]
    cmd += ["--model", str(model), *SETTINGS]
    logs.mkdir(exist_ok=True)
    return run_server(cmd, start_timeout_s=START_TIMEOUT_S, log_dir=logs, env=_env(data))


def _env(data: Path) -> dict[str, str]:
    config = data.parent / "empty.toml"
    config.write_text("")
    return {"WARMSTART_CONFIG": str(config)}


def _cli(data: Path, port: int, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WARMSTART_")}
    env |= _env(data)
    cmd = [sys.executable, "-m", "warmstart.runtime.cli", "sessions", *args, "--port", str(port)]
    cmd += ["--data-dir", str(data), "--model", str(data / "absent.gguf")]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)


def _store_legacy(db: Path) -> None:
    """Rows as an older server stored them: the ids as given."""
    conn = sqlite3.connect(db)
    messages = json.dumps([{"role": "user", "content": f"my code is {SECRET}"}])
    with conn:
        for i, sid in enumerate(LEGACY):
            conn.execute(
                "INSERT INTO sessions (id, title, created, updated, n_tokens, messages) "
                "VALUES (?, ?, ?, ?, 0, ?)",
                (sid, f"legacy {i}", 1.0 + i, 1.0 + i, messages),
            )
    conn.close()


def _loosen(data: Path) -> list[Path]:
    loose = [p for p in data.rglob("*") if p.is_file() and not p.name.startswith("sessions.db")]
    loose += [data / "sessions.db"]
    for path in loose:
        path.chmod(0o644)
    return loose


def test_damaged_db_loose_files_and_legacy_ids_on_a_real_server(
    model_path: Path, tmp_path: Path
) -> None:
    data, logs = tmp_path / "data", tmp_path / "logs"
    data.mkdir(mode=0o700)
    seed_extra_buffer_verdicts(data)
    damage = b"not a database, a damaged file " * 200
    (data / "sessions.db").write_bytes(damage)

    # 1. the damaged sessions.db is set aside; the server starts and keeps new chats
    with _serve(model_path, data, logs) as srv:
        body = {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4}
        reply = httpx.post(srv.v1 + "/chat/completions", json={**body, "user": "u1"}, timeout=120)
        assert reply.status_code == 200, reply.text
        listed = httpx.get(srv.v1 + "/warmstart/sessions", timeout=30).json()["data"]
        assert [s["id"] for s in listed] == ["u1"]
    log = srv.log()
    aside = [p for p in data.iterdir() if p.name.startswith("sessions.damaged-")]
    assert len(aside) == 1 and aside[0].read_bytes() == damage
    assert "is damaged" in log and aside[0].name in log

    # 2. meanwhile: sessions under unsafe ids, and files others can read
    _store_legacy(data / "sessions.db")
    loose = _loosen(data)
    assert any(p.name == "calibration.json" for p in loose)
    assert any(p.name == "digests.json" for p in loose)
    assert any("cache" in p.parts for p in loose)  # chunk files and the cache's index

    with _serve(model_path, data, logs) as srv:
        port = int(srv.base_url.rsplit(":", 1)[1])
        still = [p for p in [data, *data.rglob("*")] if p.lstat().st_mode & 0o077]
        assert still == [], [f"{p} {stat.S_IMODE(p.lstat().st_mode):o}" for p in still]

        routes = srv.v1 + "/warmstart/"
        listed = {s["id"] for s in httpx.get(routes + "sessions", timeout=30).json()["data"]}
        assert set(LEGACY) <= listed
        for sid in LEGACY:
            found = httpx.get(routes + session_path(sid), timeout=30)
            assert found.status_code == 200, (sid, found.text)
            assert found.json()["id"] == sid and SECRET in found.text
        renamed = httpx.patch(routes + session_path(LEGACY[0]), json={"title": "t"}, timeout=30)
        assert renamed.status_code == 200 and renamed.json()["title"] == "t"
        deleted = httpx.delete(routes + session_path(LEGACY[0]), timeout=30)
        assert deleted.status_code == 200
        assert httpx.get(routes + session_path(LEGACY[0]), timeout=30).status_code == 400

        shown = _cli(data, port, "show", LEGACY[1])
        assert shown.returncode == 0 and SECRET in shown.stdout, shown.stderr
        for sid in LEGACY[1:4]:
            gone = _cli(data, port, "delete", sid)
            assert gone.returncode == 0 and "deleted" in gone.stdout, (sid, gone.stderr)

        headers = {"X-Warmstart-Session": "../new/one"}
        refused = httpx.post(srv.v1 + "/chat/completions", json=body, headers=headers, timeout=60)
        assert refused.status_code == 400 and "session id" in refused.json()["error"]["message"]

    # 3. with no server running, the CLI works on the files: the last one goes too
    offline = _cli(data, port, "delete", LEGACY[4])
    assert offline.returncode == 0 and "deleted" in offline.stdout, offline.stderr
    assert SECRET.encode() not in (data / "sessions.db").read_bytes()
    assert "Traceback" not in srv.log()
