"""One settings schema: config file < environment < flags; bad values name the setting."""

from __future__ import annotations

from pathlib import Path

import pytest
from warmstart.runtime.errors import ConfigError
from warmstart.runtime.settings import load_settings


@pytest.fixture(autouse=True)
def config_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "warmstart.toml"
    monkeypatch.setenv("WARMSTART_CONFIG", str(path))
    for name in ("WARMSTART_CHUNK_TOKENS", "WARMSTART_ZSTD_LEVEL", "WARMSTART_NO_CACHE"):
        monkeypatch.delenv(name, raising=False)
    return path


def test_precedence_file_env_flags(config_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config_file.write_text("[warmstart]\nchunk_tokens = 64\nzstd_level = 3\n")
    assert load_settings().chunk_tokens == 64
    monkeypatch.setenv("WARMSTART_CHUNK_TOKENS", "128")
    settings = load_settings()
    assert settings.chunk_tokens == 128 and settings.zstd_level == 3
    assert load_settings(chunk_tokens=512).chunk_tokens == 512
    assert load_settings(chunk_tokens=None).chunk_tokens == 128  # a flag not given


def test_tunables_default_to_automatic(config_file: Path) -> None:
    settings = load_settings()
    assert settings.ram_pool_bytes is None and settings.swap_in_threshold_tokens is None
    assert settings.host == "127.0.0.1"


@pytest.mark.parametrize(
    ("source", "name"),
    [
        ({"chunk_tokens": 3}, "chunk_tokens"),
        ({"zstd_level": 42}, "zstd_level"),
        ({"high_watermark": 0.5, "low_watermark": 0.8}, "low_watermark"),
        ({"type_kv": "q4"}, "type_kv"),
        ({"api_key": "short"}, "api_key"),
    ],
)
def test_bad_values_fail_loudly_naming_the_setting(source: dict[str, object], name: str) -> None:
    with pytest.raises(ConfigError, match=name):
        load_settings(**source)


def test_bad_config_file_and_unknown_key(config_file: Path) -> None:
    config_file.write_text("chunk_tokens = [oops")
    with pytest.raises(ConfigError, match="config file"):
        load_settings()
    config_file.write_text("chunk_tokenz = 64\n")
    with pytest.raises(ConfigError, match="chunk_tokenz"):
        load_settings()
