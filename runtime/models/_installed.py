"""The installed models: every GGUF in the models directory, by name, with what its
header says (architecture, context length, parameters, file type), read without
loading its weights. Both API dialects list models through :func:`list_installed`.

Names come from :func:`.models.model_name`, the one source of a model's name: the
catalogue's (``qwen2.5-0.5b``), ``smollm2-135m`` for the embedded default model, else
the file name without ``.gguf``.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from pathlib import Path

from ..errors import ModelError
from ._catalogue import load_catalogue
from ._catalogue import needs_bytes as catalogue_needs
from ._gguf import Header, read_header
from ._manager import model_name  # the one source of names; the API imports it from here

log = logging.getLogger(__name__)
OWNER = "warmstart"  # owned_by when neither the file nor the catalogue names an owner


@dataclass(frozen=True)
class InstalledModel:
    """One model file and what its header says; None where the header is silent or
    unreadable (a damaged file is still listed, so that it can be removed)."""

    name: str
    path: Path
    size_bytes: int
    modified: float  # the file's mtime, seconds since the epoch
    owned_by: str
    title: str | None = None  # general.name
    architecture: str | None = None
    parameters: int | None = None
    quantization: str | None = None  # the file type, e.g. "Q4_K_M"
    context_length: int | None = None  # n_ctx_train
    license: str | None = None
    chat_template: str | None = None  # tokenizer.chat_template, when the file has one
    problem: str | None = None  # why the header could not be read


class MetadataCache:
    """Headers by file identity (path, size, mtime): listing the models directory on
    every /v1/models must not parse each header again (50 ms to a few hundred ms)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._headers: dict[tuple[str, int, int], Header | str] = {}

    def header(self, path: Path) -> Header | str:
        """The header, or why it cannot be read."""
        st = path.stat()
        key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
        with self._lock:
            known = self._headers.get(key)
        if known is not None:
            return known
        try:
            found: Header | str = read_header(path)
        except ModelError as exc:
            log.warning("%s", exc)
            found = str(exc)
        with self._lock:
            self._headers[key] = found
        return found


def installed_paths(models_dir: Path) -> dict[str, Path]:
    """Name -> file of every installed model (cheap: no file is opened)."""
    if not models_dir.is_dir():
        return {}
    catalogue = load_catalogue()
    return {model_name(p, catalogue): p for p in sorted(models_dir.glob("*.gguf")) if p.is_file()}


def describe(name: str, path: Path, cache: MetadataCache | None = None) -> InstalledModel:
    """One model file's listing entry."""
    st = path.stat()
    header = (cache or MetadataCache()).header(path)
    if isinstance(header, str):
        return InstalledModel(name, path, st.st_size, st.st_mtime, OWNER, problem=header)
    meta = header.metadata
    ctx = header.arch_value("context_length")
    title, org, lic = (meta.get(f"general.{k}") for k in ("name", "organization", "license"))
    template = meta.get("tokenizer.chat_template")
    return InstalledModel(
        name=name,
        path=path,
        size_bytes=st.st_size,
        modified=st.st_mtime,
        owned_by=org if isinstance(org, str) and org else OWNER,
        title=title if isinstance(title, str) else None,
        architecture=header.architecture,
        parameters=header.n_params or None,
        quantization=header.file_type,
        context_length=ctx if isinstance(ctx, int) else None,
        license=lic if isinstance(lic, str) else None,
        chat_template=template if isinstance(template, str) else None,
    )


def list_installed(models_dir: Path, cache: MetadataCache | None = None) -> list[InstalledModel]:
    """Every installed model, by name, with its header's metadata (no weights loaded)."""
    cache = cache or MetadataCache()
    return [describe(name, path, cache) for name, path in installed_paths(models_dir).items()]


def kv_bytes_per_token(header: Header) -> int:
    """K and V of every layer for one token at f16, from the header (as the catalogue
    counts it); 0 where the header does not say (the weights then stand alone)."""
    layers, width = header.arch_value("block_count"), header.arch_value("embedding_length")
    heads = header.arch_value("attention.head_count")
    kv_heads = header.arch_value("attention.head_count_kv") or heads
    head_dim = header.arch_value("attention.key_length")
    if not head_dim and isinstance(width, int) and isinstance(heads, int) and heads > 0:
        head_dim = width // heads
    # an int each (a per-layer array is read as its length: no estimate from it)
    if not all(isinstance(v, int) and v > 0 for v in (layers, kv_heads, head_dim)):
        return 0
    return int(2 * layers * kv_heads * head_dim * 2)


def needs_bytes(path: Path, cache: MetadataCache | None = None) -> int:
    """Memory to run an installed file, counted as the catalogue counts its entries."""
    header = (cache or MetadataCache()).header(path)
    kv = 0 if isinstance(header, str) else kv_bytes_per_token(header)
    return catalogue_needs(path.stat().st_size, kv)
