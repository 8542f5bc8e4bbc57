"""The model manager: the embedded default model, local paths, hub references."""

from __future__ import annotations

from pathlib import Path

import pytest
from warmstart.runtime.errors import ModelError, ModelNotFound
from warmstart.runtime.models._manager import DEFAULT, DigestCache, ModelManager, file_sha256


def test_default_model_is_pulled_once_and_verified(model_path: Path) -> None:
    assert model_path.stat().st_size == DEFAULT.size
    assert file_sha256(model_path) == DEFAULT.sha256
    manager = ModelManager(model_path.parent)
    assert manager.pull("default") == model_path  # kept: no second download
    assert manager.resolve("default") == model_path
    assert [m["name"] for m in manager.list()] == ["smollm2-135m"]  # "default" is an alias


def test_local_paths_and_bad_files(tmp_path: Path, model_path: Path) -> None:
    manager = ModelManager(tmp_path / "models")
    assert manager.resolve(str(model_path)) == model_path
    not_gguf = tmp_path / "notes.gguf"
    not_gguf.write_text("hello")
    with pytest.raises(ModelError, match="not a GGUF"):
        manager.resolve(str(not_gguf))
    with pytest.raises(ModelNotFound):
        manager.resolve(str(tmp_path / "missing.gguf"))
    with pytest.raises(ModelNotFound, match="not pulled"):
        manager.resolve("default", auto_pull=False)


def test_hub_reference(tmp_path: Path, model_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """hf:OWNER/REPO/FILE.gguf is fetched once into the models directory (from a local
    imitation of the hub: HF_ENDPOINT), and an unreachable hub is a ModelError."""
    from tests.hubfake import Hub, serve_hub

    manager = ModelManager(tmp_path)
    with pytest.raises(ModelNotFound, match="OWNER/REPO/FILE"):
        manager.resolve("hf:just-a-name")
    with serve_hub(Hub()) as hub:
        hub.add_hub_file("someone/some-repo", "model.Q4.gguf", model_path.read_bytes())
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        path = manager.resolve("hf:someone/some-repo/model.Q4.gguf")
        assert path == tmp_path / "model.Q4.gguf" and file_sha256(path) == DEFAULT.sha256
        assert manager.resolve("hf:someone/some-repo/model.Q4.gguf") == path
        assert len(hub.ranges) == 1  # fetched once
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    with pytest.raises(ModelError, match="offline or unreachable"):
        manager.resolve("hf:someone/some-repo/other.Q4.gguf")


def test_digest_cache_hashes_once(tmp_path: Path) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF" + bytes(100))
    cache = DigestCache(tmp_path / "digests.json")
    first = cache.digest(model)
    assert first == file_sha256(model)
    model.write_bytes(b"GGUF" + bytes(101))  # another size: hashed again
    assert cache.digest(model) != first
