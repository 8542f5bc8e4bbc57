"""One settings schema: config file < environment < flags; bad values name the setting."""

from __future__ import annotations

from pathlib import Path

import pytest
from warmstart.runtime.errors import ConfigError
from warmstart.runtime.settings import load_settings


@pytest.fixture(autouse=True)
def config_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "warmstart.toml"
    path.write_text("")  # named in WARMSTART_CONFIG, so it must exist
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


# the API key from a file, a systemd credential, and its rules ----------------------------
def test_the_api_key_comes_from_a_file(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from warmstart.runtime.errors import ConfigError
    from warmstart.runtime.settings import load_settings

    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    key = tmp_path / "key"
    key.write_text("s3cret-key-from-file\n")
    assert load_settings(api_key_file=key).api_key == "s3cret-key-from-file"
    monkeypatch.setenv("WARMSTART_API_KEY_FILE", str(key))
    assert load_settings().api_key == "s3cret-key-from-file"
    assert load_settings(api_key="given-on-purpose").api_key == "given-on-purpose"
    key.write_text("        \n")
    try:
        load_settings()
    except ConfigError as exc:
        assert "api_key_file" in str(exc) and "whitespace" in str(exc)
    else:
        raise AssertionError("a key of spaces was accepted")
    monkeypatch.setenv("WARMSTART_API_KEY_FILE", str(tmp_path / "missing"))
    try:
        load_settings()
    except ConfigError as exc:
        assert "api_key_file" in str(exc)
    else:
        raise AssertionError("a missing key file was accepted")


def test_the_api_key_comes_from_a_systemd_credential(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from warmstart.runtime.settings import CREDENTIAL_NAME, load_settings

    monkeypatch.delenv("WARMSTART_API_KEY_FILE", raising=False)
    monkeypatch.delenv("WARMSTART_API_KEY", raising=False)
    (tmp_path / CREDENTIAL_NAME).write_text("credential-key-0123\n")
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(tmp_path))
    assert CREDENTIAL_NAME == "warmstart-api-key"  # the installer's contract
    assert load_settings().api_key == "credential-key-0123"
    assert load_settings(api_key="explicit-key-99").api_key == "explicit-key-99"


def test_a_key_with_whitespace_is_refused() -> None:
    from warmstart.runtime.errors import ConfigError
    from warmstart.runtime.settings import load_settings

    for bad in ("        ", "two words here", "tab\there-123"):
        try:
            load_settings(api_key=bad)
        except ConfigError as exc:
            assert "api_key" in str(exc)
        else:
            raise AssertionError(f"{bad!r} was accepted")


def test_a_readable_config_file_with_a_key_warns(tmp_path, monkeypatch, caplog) -> None:  # type: ignore[no-untyped-def]
    from warmstart.runtime.settings import load_settings

    config = tmp_path / "warmstart.toml"
    config.write_text('api_key = "config-key-12345"\n')
    config.chmod(0o644)
    monkeypatch.setenv("WARMSTART_CONFIG", str(config))
    with caplog.at_level("WARNING"):
        assert load_settings().api_key == "config-key-12345"
    assert "chmod 600" in caplog.text
    caplog.clear()
    config.chmod(0o600)
    with caplog.at_level("WARNING"):
        load_settings()
    assert "chmod 600" not in caplog.text
