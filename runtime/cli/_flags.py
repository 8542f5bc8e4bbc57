"""Command-line flags generated from the one settings schema, per subcommand: each
command shows the settings it uses, with their default, bounds and choices."""

from __future__ import annotations

import argparse
import types
import typing
from dataclasses import fields
from typing import Any

from pydantic.fields import FieldInfo

from ..policy import Tuning
from ..settings import Settings, load_settings

# Which settings each kind of command uses; every setting is in one group.
GROUPS: dict[str, tuple[str, ...]] = {
    "where": ("data_dir",),
    "model": (
        "model",
        "n_ctx",
        "resident_sequences",
        "n_threads",
        "decode_threads",
        "exact_replies",
        "step_replies",
        "n_gpu_layers",
        "type_kv",
        "flash_attn",
        "extra_buffers",
        "mmap",
        "pinned_staging",
        "merge_batch_tokens",
        "batch_tile",
        "decode_batch",
        "overflow",
        "history",
        "no_cache",
        "embedding_model",
    ),
    "store": (
        "cache_dir",
        "ram_pool_bytes",
        "disk_budget_bytes",
        "chunk_tokens",
        "swap_in_threshold_tokens",
        "high_watermark",
        "low_watermark",
        "zstd_level",
        "prewarm_sessions",
        "recalibrate",
        "calibrate_first",
        "disk_retry_s",
        "durable_after_s",
        "memory_floor_bytes",
        "memory_check_s",
    ),
    # what a client of a running server needs (cache and sessions ask it first)
    "client": ("host", "port", "api_key", "api_key_file", "tls_cert"),
    "server": (
        "keys_file",
        "unix_socket",
        "allowed_hosts",
        "cors_origins",
        "warmstart_routes",
        "tls_key",
        "max_request_bytes",
        "max_queue",
        "max_queue_per_user",
        "max_messages",
        "max_prompt_chars",
        "max_connections",
        "max_connections_per_client",
        "header_timeout",
        "body_timeout",
        "min_body_rate",
        "keep_alive_timeout",
        "send_timeout",
        "switch_wait_s",
    ),
}
TITLES = {
    "where": "where data lives",
    "model": "the model and its context",
    "store": "the KV cache",
    "client": "the server to talk to",
    "server": "the HTTP server",
}
RUN = ("where", "model", "store")
COMMANDS: dict[str, tuple[str, ...]] = {
    "ask": RUN,
    "chat": RUN,
    "bench": RUN,
    "doctor": RUN,
    "serve": (*RUN, "client", "server"),
    "sessions": ("where", "client"),
    "cache": ("where", "client"),
    "models": ("where",),
    "keys": ("where",),
}
# files they fall back to (sessions, cache) or work on (keys)
EXTRA = {"sessions": ("cache_dir",), "cache": ("cache_dir",), "keys": ("keys_file",)}
# None on these means "the policy chooses from this machine"
TUNABLES = frozenset(f.name for f in fields(Tuning) if f.name != "reasons")
NOTE = "each also WARMSTART_<NAME> or a line of the config file"


def _flag_type(annotation: Any) -> tuple[Any, bool, tuple[str, ...] | None]:
    """(converter, is_bool, choices) for a Settings field annotation."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    base = args[0] if isinstance(annotation, types.UnionType) and args else annotation
    if base is bool:
        return None, True, None
    if typing.get_origin(base) is tuple:
        return lambda v: tuple(x.strip() for x in v.split(",") if x.strip()), False, None
    if typing.get_origin(base) is typing.Literal:
        return str, False, tuple(str(c) for c in typing.get_args(base))
    return base, False, None


def _bounds(field: FieldInfo) -> str:
    """ "16 <= value <= 8192" from the field's constraints (annotated_types objects,
    read by attribute so that no import of pydantic's internals is needed)."""
    low = high = ""
    for m in field.metadata:
        for attr, text in (("ge", "{} <= "), ("gt", "{} < "), ("le", " <= {}"), ("lt", " < {}")):
            value = getattr(m, attr, None)
            if value is not None and attr in ("ge", "gt"):
                low = text.format(value)
            elif value is not None:
                high = text.format(value)
        if getattr(m, "min_length", None) is not None:
            return f"at least {m.min_length} characters"
    return f"{low}value{high}" if low or high else ""


def _default(name: str, field: FieldInfo) -> str:
    if field.default_factory is not None:
        return str(field.default_factory())  # type: ignore[call-arg]
    if field.default is None:
        return "automatic: chosen for this machine" if name in TUNABLES else "none"
    if isinstance(field.default, tuple):
        return ",".join(field.default) or "none"
    return str(field.default)


def help_for(name: str, field: FieldInfo) -> str:
    said = "(default" in (field.description or "")  # the description says it already
    extras = [] if said else [f"default: {_default(name, field)}"]
    bounds = _bounds(field)
    if bounds:
        extras.append(bounds)
    text = f"{field.description} ({'; '.join(extras)})" if extras else str(field.description)
    return text.replace("%", "%%")


# What ``ask`` and ``chat`` show in their --help; the other settings they use (the
# context's and the cache's tunables, about thirty) are listed by --help-all only, so
# that the conversation's own options fit on a screen.
EVERYDAY = ("model", "data_dir", "n_ctx", "n_gpu_layers", "no_cache")
BRIEF = frozenset({"ask", "chat"})


def settings_from(args: argparse.Namespace) -> Settings:
    """The settings, with the flags given: a flag left out (None) leaves its setting to
    the environment, the config file or the default."""
    return load_settings(**{n: getattr(args, n, None) for n in Settings.model_fields})


def add_settings_flags(parser: argparse.ArgumentParser, command: str, show_all: bool = True) -> int:
    """Adds the settings ``command`` uses as flags, grouped; returns how many of them
    were left out of --help (``show_all`` False on a BRIEF command: all but EVERYDAY)."""
    names = [n for g in COMMANDS[command] for n in GROUPS[g]] + list(EXTRA.get(command, ()))
    if not show_all and command in BRIEF:
        group = parser.add_argument_group(f"the model and where data lives ({NOTE})")
        for name in EVERYDAY:
            _add(group, name, Settings.model_fields[name])
        for name, field in Settings.model_fields.items():
            if name not in EVERYDAY:
                _add(parser, name, field, hidden=True)
        return len([n for n in names if n not in EVERYDAY])
    for group_name in COMMANDS[command]:
        title = f"{TITLES[group_name]} ({NOTE})"
        group = parser.add_argument_group(title)
        wanted = [n for n in GROUPS[group_name] if n in names]
        if group_name == "where":
            wanted += list(EXTRA.get(command, ()))
        for name in wanted:
            _add(group, name, Settings.model_fields[name])
    # The others are accepted and not shown: a script that passes the same settings to
    # every command keeps working, and --help lists only what the command uses.
    for name, field in Settings.model_fields.items():
        if name not in names:
            _add(parser, name, field, hidden=True)
    return 0


def _add(group: Any, name: str, field: FieldInfo, hidden: bool = False) -> None:
    flag = "--" + name.replace("_", "-")
    conv, is_bool, choices = _flag_type(field.annotation)
    shown = argparse.SUPPRESS if hidden else help_for(name, field)
    if is_bool:
        group.add_argument(
            flag,
            dest=name,
            action="store_const",
            const=True,
            default=None,
            help=shown,
        )
        if field.default is not False:  # on (or chosen) by default: it can be turned off
            group.add_argument(
                "--no-" + name.replace("_", "-"),
                dest=name,
                action="store_const",
                const=False,
                help=argparse.SUPPRESS if hidden else f"turn {flag} off",
            )
        return
    group.add_argument(
        flag,
        dest=name,
        type=conv,
        default=None,
        choices=choices,
        help=shown,
    )
