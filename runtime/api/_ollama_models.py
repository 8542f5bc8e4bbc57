"""The models the Ollama routes list (/api/tags, /api/show, /api/ps).

``installed_models`` is the one place that finds them. For now it lists the loaded
model only, read from the runtime's engine where there is one (LocalRuntime) and
plain defaults otherwise (FakeRuntime); it is meant to be replaced by the runtime's
shared listing of installed models (the one /v1/models uses) without touching the
routes.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from ..service import Runtime


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


def installed_models(runtime: Runtime) -> list[ModelEntry]:
    """Every model this server can answer with; the loaded one first."""
    model = getattr(getattr(runtime, "engine", None), "model", None)
    if model is None:  # no engine to ask (FakeRuntime)
        return [ModelEntry(name=runtime.model_id, context_length=runtime.n_ctx, loaded=True)]
    arch = model.meta("general.architecture") or ""
    stat = model.path.stat()
    return [
        ModelEntry(
            name=runtime.model_id,
            size=stat.st_size,
            digest=str(getattr(runtime.engine.config, "model_digest", "")),  # type: ignore[attr-defined]
            modified=stat.st_mtime,
            architecture=arch,
            parameters=model.n_params,
            quantization=(model.describe().split() or [""])[-1],
            context_length=model.n_ctx_train,
            template=model.chat_template() or "",
            loaded=True,
        )
    ]


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
