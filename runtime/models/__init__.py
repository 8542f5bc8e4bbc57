"""Model files: the catalogue of known GGUFs, downloads (resumable, verified), the
installed models and what their GGUF headers say; synthetic models of real shapes
(random weights) for the benchmarks."""

from ._catalogue import available_rows, fit, fit_bytes, load_catalogue
from ._installed import (
    OWNER,
    InstalledModel,
    MetadataCache,
    describe,
    installed_paths,
    model_name,
    needs_bytes,
)
from ._manager import KNOWN, DigestCache, ModelManager, known_names, with_default
from ._pull import Watch
from ._synthetic import synthetic_model, synthetic_name

__all__ = [
    "KNOWN",
    "OWNER",
    "DigestCache",
    "InstalledModel",
    "MetadataCache",
    "ModelManager",
    "Watch",
    "available_rows",
    "describe",
    "fit",
    "fit_bytes",
    "installed_paths",
    "known_names",
    "load_catalogue",
    "model_name",
    "needs_bytes",
    "synthetic_model",
    "synthetic_name",
    "with_default",
]
