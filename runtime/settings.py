"""One settings schema for the config file, environment variables and CLI flags.

Precedence, highest first: CLI flags, environment variables (``WARMSTART_<NAME>``),
the config file (``$WARMSTART_CONFIG`` or ``<config dir>/warmstart.toml``), defaults.
Tunables default to ``None``, meaning "chosen by the policy from this machine"; a
value given anywhere overrides the policy. A bad value fails loudly with a
:class:`~runtime.errors.ConfigError` that names the setting.
"""

from __future__ import annotations

import logging
import os
import stat
import tomllib
from pathlib import Path
from typing import Any, Literal

import platformdirs
from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from .errors import ConfigError

APP_NAME = "warmstart"
# systemd's LoadCredential=warmstart-api-key:/path puts the key in this file of
# $CREDENTIALS_DIRECTORY (the home-server installer relies on this name).
CREDENTIAL_NAME = "warmstart-api-key"

log = logging.getLogger(__name__)


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
            if os.environ.get("WARMSTART_CONFIG"):  # named on purpose: its absence is a mistake
                raise ConfigError(f"WARMSTART_CONFIG: no config file at {path}")
            return {}
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"config file {path}: {exc}") from exc
        table = {k.replace("-", "_"): v for k, v in data.get("warmstart", data).items()}
        if table.get("api_key"):
            _warn_if_readable(path)
        return table


def _warn_if_readable(path: Path) -> None:
    with_key = path.stat().st_mode
    if with_key & (stat.S_IRWXG | stat.S_IRWXO):
        log.warning(
            "config file %s holds api_key but other users can read it (mode %o); "
            "run: chmod 600 %s, or use api_key_file",
            path,
            stat.S_IMODE(with_key),
            path,
        )


class Settings(BaseSettings):
    """Every user-facing setting. ``None`` on a tunable means automatic."""

    model_config = SettingsConfigDict(env_prefix="WARMSTART_", extra="forbid", frozen=True)

    # where things live
    model: str = Field("default", description="model: 'default', a pulled name or a GGUF path")
    data_dir: Path = Field(default_factory=default_data_dir, description="models, cache, sessions")
    cache_dir: Path | None = Field(None, description="KV cache directory (default: data_dir/cache)")
    no_cache: bool = Field(
        False, description="run without the KV store, for comparison (also keeps no history)"
    )
    history: bool = Field(
        True, description="keep conversation text in sessions.db (off: only the KV cache)"
    )

    # the context
    n_ctx: int | None = Field(None, ge=256, le=262144, description="tokens per conversation")
    resident_sequences: int | None = Field(
        None, ge=1, le=63, description="conversations kept live in the context"
    )
    n_threads: int | None = Field(None, ge=1, le=512, description="CPU threads for prefill")
    decode_threads: int | None = Field(
        None, ge=1, le=512, description="CPU threads for one-token decode steps (default: all)"
    )
    merge_batch_tokens: int | None = Field(
        None,
        ge=0,
        le=8192,
        description="prefill whole aligned chunks together up to this many tokens, where "
        "the calibration found that a token gets the same KV bits either way (0: never)",
    )
    batch_tile: int | None = Field(
        None,
        ge=0,
        le=8192,
        description="where a token's KV bits depend only on whether its batch holds at "
        "least this many tokens (the calibration checks it), batches of one kind are "
        "prefilled together (0: only whole aligned chunks are)",
    )
    decode_batch: int | None = Field(
        None,
        ge=1,
        le=64,
        description="replies decoded together in one step, a token each (1: one at a "
        "time). Default: as many as the calibration proved give each reply the bits it "
        "gets alone (up to 8), else 1. Set above that, concurrent replies are faster but "
        "may differ from --no-cache in their last bits",
    )
    exact_replies: bool = Field(
        True,
        description="no effect, kept so that older configs load: a cached turn always "
        "equals --no-cache bit for bit (see step_replies)",
    )
    step_replies: bool | None = Field(
        None,
        description="prefill each earlier reply of a chat a token at a time, as it was "
        "decoded: the next turn then reuses the decoded reply exactly and prefills only "
        "its new message, even sent the moment the reply ends, and a history the cache "
        "never saw prefills its replies at decode speed; off, a reply is re-prefilled in "
        "batches after it is sent. Default: on unless layers are offloaded to a GPU, "
        "where that re-prefill is cheap",
    )
    n_gpu_layers: int = Field(-1, ge=-1, le=10000, description="layers offloaded (-1: all)")
    type_kv: Literal["f16", "q8_0"] = Field("f16", description="KV cache element type")
    flash_attn: Literal["auto", "on", "off"] = Field(
        "auto",
        description="flash attention; auto: llama.cpp's choice (on, where it can). Off on a "
        "CPU: decode steps and short batches (a follow-up's new message) at long contexts "
        "about twice and four times as fast, a long prompt's cold prefill slower (1.38 times "
        "as long served, on a 2-core Xeon); a q8_0 KV cache needs it",
    )
    extra_buffers: Literal["auto", "on", "off"] = Field(
        "auto",
        description="llama.cpp's extra buffer types (weight repacking, AMX); auto: a "
        "one-time smoke decode in a child process decides (they die by SIGILL on some CPUs)",
    )
    mmap: Literal["auto", "on", "off"] = Field(
        "auto",
        description="map the model file (on) or read it (off); auto: llama.cpp's choice, "
        "proven by a one-time smoke load in a child where layers are offloaded (read "
        "instead if the child dies)",
    )
    pinned_staging: Literal["auto", "on", "off"] = Field(
        "auto",
        description="CUDA's pinned host buffers for loading (off: GGML_CUDA_NO_PINNED); "
        "auto: on, unless the smoke load dies with them",
    )
    overflow: Literal["trim", "error"] = Field(
        "trim",
        description="a conversation longer than the context: 'trim' leaves out its earliest "
        "turns (the system prompt stays), 'error' refuses it (HTTP 400)",
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
    memory_floor_bytes: int | None = Field(
        None,
        ge=0,
        description="when the system's available memory falls below this, the RAM pool "
        "moves its coldest chunks to disk and gives their memory back (0: never)",
    )
    memory_check_s: float = Field(
        1.0, gt=0, le=3600, description="seconds between two looks at the available memory"
    )
    recalibrate: bool = Field(False, description="measure this machine again")
    calibrate_first: bool = Field(
        False,
        description="a server on a machine and model not calibrated yet calibrates before "
        "it answers (by default it answers at once, on estimates, and calibrates between "
        "requests for the next start)",
    )
    disk_retry_s: float = Field(
        30.0,
        gt=0,
        le=3600,
        description="seconds between attempts to bring back a disk tier that could not be "
        "written (full, read-only, damaged); meanwhile the cache runs from RAM",
    )

    durable_after_s: float = Field(
        5.0,
        gt=0,
        le=3600,
        description="a conversation answered this many seconds before a crash is on disk "
        "whatever the load: its capture and disk writes, which otherwise wait for idle "
        "moments, then take a waiting client's turn, at most once per half of it",
    )

    switch_wait_s: float = Field(
        60.0,
        gt=0,
        le=3600,
        description="seconds a switch to another model waits for the replies in progress "
        "before cancelling them",
    )

    # the HTTP API
    host: str = Field("127.0.0.1", description="address to bind")
    port: int = Field(8765, ge=0, le=65535, description="port to bind")
    api_key: str | None = Field(
        None, min_length=8, description="Bearer key (required off loopback)"
    )
    api_key_file: Path | None = Field(
        None, description="a file holding the Bearer key (kept off the command line)"
    )
    keys_file: Path | None = Field(
        None,
        description="the household's keys, one per person (`warmstart keys add NAME`; "
        "default: keys.json in the data dir); read again when it changes or on SIGHUP",
    )
    allowed_hosts: tuple[str, ...] = Field(
        (),
        description="Host names accepted besides loopback ('*.lan' matches a suffix, "
        "'*' turns the check off)",
    )
    cors_origins: tuple[str, ...] = Field((), description="origins allowed by CORS (none: off)")
    warmstart_routes: bool = Field(
        True,
        description="serve warmstart's own /v1/warmstart/ routes (sessions, stats, "
        "settings); off, the server answers like a plain OpenAI-compatible one (as vLLM "
        "does), to check that clients cope without them",
    )
    embedding_model: str | None = Field(
        None,
        description="a GGUF (path or pulled name) for /v1/embeddings and /api/embed "
        "(default: the chat model's own pooled embeddings)",
    )
    unix_socket: Path | None = Field(
        None,
        description="also serve on this Unix-domain socket (mode 0600, in a folder only "
        "its owner can write): clients that connect there reach this server and no other",
    )
    tls_cert: Path | None = Field(None, description="TLS certificate (PEM) for https")
    tls_key: Path | None = Field(None, description="TLS private key (PEM) for https")
    max_request_bytes: int = Field(4 << 20, ge=1024, description="largest request body")
    max_queue: int = Field(16, ge=1, le=4096, description="requests waiting before 429")
    max_queue_per_user: int | None = Field(
        None,
        ge=1,
        le=4096,
        description="requests of one user (one key) waiting before 429 (none: max_queue); "
        "users are served in turn either way",
    )
    max_messages: int = Field(
        4096, ge=1, le=1_000_000, description="most messages in one chat request"
    )
    max_prompt_chars: int = Field(
        2_000_000, ge=1, le=1 << 30, description="most characters of prompt text in a request"
    )
    max_connections: int = Field(
        256, ge=4, le=65536, description="open connections at most (also kept under ulimit -n)"
    )
    max_connections_per_client: int = Field(
        32,
        ge=1,
        le=65536,
        description="open connections from one client address at most (an IPv6 /64 is one "
        "address; never more than half of max_connections)",
    )
    header_timeout: float = Field(
        10.0, gt=0, le=3600, description="seconds a client has to send its request headers"
    )
    body_timeout: float = Field(
        30.0, gt=0, le=3600, description="seconds a client has to send its request body"
    )
    min_body_rate: int = Field(
        1024,
        ge=0,
        le=1 << 30,
        description="bytes a second a request body must average once it has had 2 s "
        "(slower: 408; 0: only body_timeout)",
    )
    keep_alive_timeout: float = Field(
        5.0, gt=0, le=3600, description="seconds an idle keep-alive connection stays open"
    )
    send_timeout: float = Field(
        5.0,
        gt=0,
        le=3600,
        description="seconds a streamed reply waits on a client that stopped reading "
        "before its generation is cancelled",
    )

    @field_validator("api_key")
    @classmethod
    def _key_has_no_whitespace(cls, value: str | None) -> str | None:
        # A key of spaces (or with a stray newline) is accepted by no client header.
        if value is not None and any(ch.isspace() for ch in value):
            raise ValueError("the key must not contain whitespace")
        return value

    @model_validator(mode="after")
    def _watermarks_ordered(self) -> Settings:
        if (
            self.high_watermark is not None
            and self.low_watermark is not None
            and self.low_watermark >= self.high_watermark
        ):
            raise ValueError("low_watermark must be below high_watermark")
        return self

    @model_validator(mode="after")
    def _quantized_v_has_flash_attn(self) -> Settings:
        if self.flash_attn == "off" and self.type_kv != "f16":
            raise ValueError(f"a {self.type_kv} KV cache needs flash_attn on or auto")
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

    def durability_reason(self) -> str:
        """Why durable_after_s is what it is (doctor, /v1/warmstart/settings)."""
        given = "durable_after_s" in self.model_fields_set
        why = "set by durable_after_s" if given else "the default"
        return (
            f"{why}: a chat answered this long before a crash restores from disk after it, "
            "however busy the server; its capture and writes yield to waiting clients, and "
            "take a client's turn at most once per half of it (shorter: more turns taken "
            "under load; longer: more recent chats lost in a crash)"
        )

    @property
    def effective_keys_file(self) -> Path:
        return self.keys_file if self.keys_file is not None else self.data_dir / "keys.json"

    @property
    def models_dir(self) -> Path:
        return self.data_dir / "models"


def load_settings(**overrides: Any) -> Settings:
    """Builds the settings; CLI flags come in as ``overrides`` (``None`` = not given).

    The API key comes from, in order: api_key, api_key_file (its content without
    the trailing newline), then ``$CREDENTIALS_DIRECTORY/warmstart-api-key``."""
    given = {k: v for k, v in overrides.items() if v is not None}
    key_file: tuple[Path, str] | None = None
    try:
        settings = Settings(**given)
        key_file = _key_file(settings)
        if key_file is None:
            return settings
        return Settings(**{**given, "api_key": _read_key(key_file[0], key_file[1])})
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            name = ".".join(str(p) for p in err["loc"]) or "settings"
            if name == "api_key" and key_file is not None:
                name = key_file[1]
            problems.append(f"{name}: {err['msg']}")
        raise ConfigError("invalid setting: " + "; ".join(problems)) from exc


def _key_file(settings: Settings) -> tuple[Path, str] | None:
    """(path, the setting it came from) of the file holding the key, if any."""
    if settings.api_key is not None:
        return None
    if settings.api_key_file is not None:
        return settings.api_key_file, "api_key_file"
    credentials = os.environ.get("CREDENTIALS_DIRECTORY")
    if credentials and (Path(credentials) / CREDENTIAL_NAME).is_file():
        return Path(credentials) / CREDENTIAL_NAME, "CREDENTIALS_DIRECTORY/" + CREDENTIAL_NAME
    return None


def _read_key(path: Path, setting: str) -> str:
    try:
        return path.read_text(encoding="utf-8").rstrip("\r\n")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{setting}: cannot read the key from {path}: {exc}") from exc
