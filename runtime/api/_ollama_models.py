"""The models the Ollama routes list (/api/tags, /api/show, /api/ps): the shared
listing of the models this server answers with (_listing.py, as /v1/models), in
Ollama's shapes."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from ._listing import served_models
from ._state import AppState


@dataclass(frozen=True)
class ModelEntry:
    name: str  # the model's id, as /v1/models lists it
    size: int = 0  # bytes of the GGUF file
    digest: str = ""  # sha256 of the file
    modified: float = 0.0  # the file's mtime
    architecture: str = ""
    parameters: int = 0
    quantization: str = ""
    context_length: int = 0  # the model's training context
    template: str = ""  # the chat template
    loaded: bool = False


def installed_models(st: AppState) -> list[ModelEntry]:
    """Every model this server can answer with; the loaded one first."""
    out = []
    for model in served_models(st):
        info = model.info
        if info is None:  # a runtime without a model file (the fake engine)
            out.append(ModelEntry(model.name, context_length=st.runtime.n_ctx, loaded=True))
            continue
        out.append(
            ModelEntry(
                name=model.name,
                size=info.size_bytes,
                digest=model.digest,
                modified=info.modified,
                architecture=info.architecture or "",
                parameters=info.parameters or 0,
                quantization=info.quantization or "",
                context_length=info.context_length or 0,
                template=info.chat_template or "",
                loaded=model.loaded,
            )
        )
    return out


def parameter_size(n: int) -> str:
    """Ollama's way of writing a parameter count: "134.52M", "8.03B"."""
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f}{unit}"
    return str(n)


def timestamp(when: float) -> str:
    """RFC 3339 in UTC, as Ollama writes times."""
    moment = dt.datetime.fromtimestamp(when, dt.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def details(entry: ModelEntry) -> dict[str, Any]:
    family = entry.architecture or "unknown"
    return {
        "parent_model": "",
        "format": "gguf",
        "family": family,
        "families": [family],
        "parameter_size": parameter_size(entry.parameters) if entry.parameters else "",
        "quantization_level": entry.quantization,
    }


def tag(entry: ModelEntry) -> dict[str, Any]:
    """One model of /api/tags."""
    name = tag_name(entry.name)
    return {
        "name": name,
        "model": name,
        "modified_at": timestamp(entry.modified),
        "size": entry.size,
        "digest": entry.digest,
        "details": details(entry),
    }


def tag_name(model_id: str) -> str:
    """Ollama's names carry a tag; a model without one is "name:latest"."""
    return model_id if ":" in model_id else f"{model_id}:latest"


def untagged(name: str) -> str:
    return name.removesuffix(":latest")
