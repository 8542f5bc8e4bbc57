"""The installed-model listing: names, and GGUF headers read without loading weights."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
from warmstart.runtime.errors import ModelError
from warmstart.runtime.models import _gguf as _gguf
from warmstart.runtime.models._catalogue import load_catalogue
from warmstart.runtime.models._installed import (
    MetadataCache,
    describe,
    installed_paths,
    list_installed,
    model_name,
)
from warmstart.runtime.models._manager import DEFAULT

from tests.gguf_files import tiny_model


def test_the_file_types_are_llama_cpps() -> None:
    # read from the bindings' source: importing llama_cpp leaves /dev/null open at exit
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or spec.origin is None:
        pytest.skip("llama_cpp is not installed")
    source = (Path(spec.origin).parent / "llama_cpp.py").read_text()
    theirs = {
        int(value): name
        for name, value in re.findall(r"^LLAMA_FTYPE_(?:MOSTLY_|ALL_)(\w+) = (\d+)", source, re.M)
    }
    assert len(theirs) > 30
    assert all(theirs[code] == name for code, name in _gguf.FILE_TYPES.items())


def test_a_tiny_header_is_read(tmp_path: Path) -> None:
    header = _gguf.read_header(tiny_model(tmp_path / "t.gguf", "qwen2", 32768, 15))
    assert header.architecture == "qwen2"
    assert header.arch_value("context_length") == 32768
    assert header.file_type == "Q4_K_M"
    assert header.n_params == 34
    assert header.metadata["tokenizer.ggml.tokens"] == 3  # an array: its length


def test_a_file_that_is_not_gguf_is_a_model_error(tmp_path: Path) -> None:
    (tmp_path / "x.gguf").write_bytes(b"not a model at all")
    with pytest.raises(ModelError, match="not a readable GGUF"):
        _gguf.read_header(tmp_path / "x.gguf")
    truncated = tmp_path / "t.gguf"
    truncated.write_bytes(tiny_model(tmp_path / "whole.gguf").read_bytes()[:40])
    with pytest.raises(ModelError):
        _gguf.read_header(truncated)


def test_the_default_models_header(model_path: Path) -> None:
    info = describe("smollm2-135m", model_path)
    assert (info.architecture, info.quantization, info.context_length) == ("llama", "Q4_1", 8192)
    assert 130e6 < (info.parameters or 0) < 140e6  # SmolLM2-135M
    assert info.owned_by == "HuggingFaceTB"
    assert info.size_bytes == DEFAULT.size


def test_gemmas_header(gemma_path: Path) -> None:
    info = describe("gemma", gemma_path)
    assert (info.architecture, info.quantization, info.context_length) == (
        "gemma3",
        "Q4_K_M",
        32768,
    )
    assert 260e6 < (info.parameters or 0) < 280e6


def test_names(tmp_path: Path) -> None:
    catalogue = load_catalogue()
    entry = next(iter(catalogue.values()))
    assert model_name(tmp_path / DEFAULT.filename, catalogue) == "smollm2-135m"
    assert model_name(tmp_path / entry.file, catalogue) == entry.name
    assert model_name(tmp_path / "My-Model.Q8_0.gguf", catalogue) == "My-Model.Q8_0"


def test_the_listing_names_every_gguf_and_keeps_a_damaged_one(tmp_path: Path) -> None:
    models = tmp_path / "models"
    models.mkdir()
    tiny_model(models / "b-model.gguf")
    (models / "a-broken.gguf").write_bytes(b"GGUF\x03\x00")
    (models / "c-model.gguf.part").write_bytes(b"half")  # a download in progress
    assert list(installed_paths(models)) == ["a-broken", "b-model"]
    broken, good = list_installed(models)
    assert broken.problem is not None and broken.architecture is None
    assert good.problem is None and good.owned_by == "Testers" and good.parameters == 34
    assert list_installed(tmp_path / "nowhere") == []


def test_headers_are_read_once_per_file_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from warmstart.runtime.models import _installed as installed

    reads: list[Path] = []
    real = installed.read_header

    def counting(path: Path) -> _gguf.Header:
        reads.append(path)
        return real(path)

    monkeypatch.setattr(installed, "read_header", counting)
    cache = MetadataCache()
    path = tiny_model(tmp_path / "m.gguf", ctx=2048)
    assert describe("m", path, cache).context_length == 2048
    assert describe("m", path, cache).context_length == 2048
    assert len(reads) == 1
    tiny_model(path, "gemma3", ctx=4096)  # replaced: another size (and mtime)
    assert describe("m", path, cache).context_length == 4096
    assert len(reads) == 2


def test_a_listed_name_resolves_and_removes(tmp_path: Path) -> None:
    from warmstart.runtime.models._manager import ModelManager

    models = tmp_path / "models"
    models.mkdir()
    path = tiny_model(models / "My-Model.Q8_0.gguf")
    manager = ModelManager(models)
    (name,) = installed_paths(models)
    assert manager.resolve(name, auto_pull=False) == path
    assert manager.rm(name) == (path,)
    assert installed_paths(models) == {}


def test_one_function_names_a_model_for_every_listing(tmp_path: Path) -> None:
    """``models list``, the API's listings and the app's picker all name a file by
    ``model_name``: "default" is an alias that resolves, never a listed name."""
    from warmstart.runtime.hardware import probe
    from warmstart.runtime.models._catalogue import available_rows, fit
    from warmstart.runtime.models._manager import KNOWN, ModelManager, with_default

    models = tmp_path / "models"
    models.mkdir()
    for name in (DEFAULT.filename, "Mine.Q8_0.gguf"):
        tiny_model(models / name)
    manager = ModelManager(models)
    listed = [m["name"] for m in manager.list()]
    assert sorted(listed) == sorted(installed_paths(models)) == ["Mine.Q8_0", "smollm2-135m"]
    assert KNOWN["default"] is KNOWN["smollm2-135m"] and "default" not in listed
    shown = with_default(load_catalogue())
    assert next(iter(shown)) == DEFAULT.name and shown[DEFAULT.name].file == DEFAULT.filename
    rows = available_rows(shown, probe(tmp_path / "cache"), set(listed))
    starred = [r.split()[0] for r in rows[1:-1] if r.rstrip().endswith("*") or " * " in r]
    assert starred == [DEFAULT.name] and rows[-1].startswith("* installed")
    assert fit(shown[DEFAULT.name], probe(tmp_path / "cache"))[0] != "no"


def test_an_installed_files_memory_need_comes_from_its_header(model_path: Path) -> None:
    """The picker's fit for a file outside the catalogue: counted as the catalogue
    counts its entries (the default model's entry and its file agree)."""
    from warmstart.runtime.models._installed import kv_bytes_per_token, needs_bytes
    from warmstart.runtime.models._manager import default_entry

    entry = default_entry()
    assert kv_bytes_per_token(_gguf.read_header(model_path)) == entry.kv_bytes_per_token
    assert needs_bytes(model_path) == entry.needs_bytes
    assert _gguf.read_header(model_path).arch_value("context_length") == entry.context_length
