"""One settings schema for the config file, environment variables and CLI flags.

Precedence, highest first: CLI flags, environment variables (``WARMSTART_<NAME>``),
the config file (``$WARMSTART_CONFIG`` or ``<config dir>/warmstart.toml``), defaults.
Tunables default to ``None``, meaning "chosen by the policy from this machine"; a
value given anywhere overrides the policy. A bad value fails loudly with a
:class:`~runtime.errors.ConfigError` that names the setting.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any, Literal

import platformdirs
from pydantic import Field, ValidationError, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from .errors import ConfigError

APP_NAME = "warmstart"


def default_data_dir() -> Path:
    return Path(platformdirs.user_data_dir(APP_NAME, appauthor=False))


def default_config_file() -> Path:
    explicit = os.environ.get("WARMSTART_CONFIG")
    if explicit:
        return Path(explicit)
    return Path(platformdirs.user_config_dir(APP_NAME, appauthor=False)) / "warmstart.toml"


class _TomlSource(PydanticBaseSettingsSource):
    """Reads the flat ``[warmstart]`` table (or top level) of the config file."""

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        path = default_config_file()
        if not path.is_file():
            return {}
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"config file {path}: {exc}") from exc
        table = data.get("warmstart", data)
        return {k.replace("-", "_"): v for k, v in table.items()}


class Settings(BaseSettings):
    """Every user-facing setting. ``None`` on a tunable means automatic."""

    model_config = SettingsConfigDict(env_prefix="WARMSTART_", extra="forbid", frozen=True)

    # where things live
    model: str = Field("default", description="model: 'default', a pulled name or a GGUF path")
    data_dir: Path = Field(default_factory=default_data_dir, description="models, cache, sessions")
    cache_dir: Path | None = Field(None, description="KV cache directory (default: data_dir/cache)")
    no_cache: bool = Field(False, description="run without the KV store, for comparison")

    # the context
    n_ctx: int | None = Field(None, ge=256, le=262144, description="tokens per conversation")
    resident_sequences: int | None = Field(
        None, ge=1, le=63, description="conversations kept live in the context"
    )
    n_threads: int | None = Field(None, ge=1, le=512, description="CPU threads for prefill")
    decode_threads: int = Field(
        1,
        ge=1,
        le=512,
        description="CPU threads for one-token decode steps; 1 keeps greedy replies "
        "identical whatever else is cached (llama.cpp splits attention by thread)",
    )
    n_gpu_layers: int = Field(-1, ge=-1, le=10000, description="layers offloaded (-1: all)")
    type_kv: Literal["f16", "q8_0"] = Field("f16", description="KV cache element type")
    flash_attn: Literal["auto", "on"] = Field("auto", description="flash attention")
    extra_buffers: Literal["auto", "on", "off"] = Field(
        "auto",
        description="llama.cpp's extra buffer types (weight repacking, AMX); auto: a "
        "one-time smoke decode in a child process decides (they die by SIGILL on some CPUs)",
    )

    # the store
    ram_pool_bytes: int | None = Field(None, ge=0, description="size of the RAM pool")
    disk_budget_bytes: int | None = Field(None, ge=0, description="size budget of the disk tier")
    chunk_tokens: int | None = Field(None, ge=16, le=8192, description="tokens per KV chunk")
    swap_in_threshold_tokens: int | None = Field(
        None, ge=0, le=1_000_000, description="shortest cached prefix worth restoring"
    )
    high_watermark: float | None = Field(None, gt=0.0, le=1.0, description="pool fill to demote")
    low_watermark: float | None = Field(None, ge=0.0, lt=1.0, description="pool fill to demote to")
    zstd_level: int | None = Field(None, ge=0, le=19, description="disk compression, 0 = raw")
    prewarm_sessions: int | None = Field(None, ge=0, le=1000, description="chats warmed at start")
    recalibrate: bool = Field(False, description="measure this machine again")

    # the HTTP API
    host: str = Field("127.0.0.1", description="address to bind")
    port: int = Field(8765, ge=0, le=65535, description="port to bind")
    api_key: str | None = Field(
        None, min_length=8, description="Bearer key (required off loopback)"
    )
    cors_origins: tuple[str, ...] = Field((), description="origins allowed by CORS (none: off)")
    max_request_bytes: int = Field(4 << 20, ge=1024, description="largest request body")
    max_queue: int = Field(16, ge=1, le=4096, description="requests waiting before 429")

    @model_validator(mode="after")
    def _watermarks_ordered(self) -> Settings:
        if (
            self.high_watermark is not None
            and self.low_watermark is not None
            and self.low_watermark >= self.high_watermark
        ):
            raise ValueError("low_watermark must be below high_watermark")
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, _TomlSource(settings_cls))

    @property
    def effective_cache_dir(self) -> Path:
        return self.cache_dir if self.cache_dir is not None else self.data_dir / "cache"

    @property
    def models_dir(self) -> Path:
        return self.data_dir / "models"


def load_settings(**overrides: Any) -> Settings:
    """Builds the settings; CLI flags come in as ``overrides`` (``None`` = not given)."""
    given = {k: v for k, v in overrides.items() if v is not None}
    try:
        return Settings(**given)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            name = ".".join(str(p) for p in err["loc"]) or "settings"
            problems.append(f"{name}: {err['msg']}")
        raise ConfigError("invalid setting: " + "; ".join(problems)) from exc
