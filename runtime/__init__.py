"""warmstart's runtime: a local model that never prefills the same prefix twice.

The public surface is what ``__all__`` names. ``open_runtime`` (the real model) and
``open_fake_runtime`` (the same runtime over a fake engine, no model file) are
imported on first use, so the light parts (types, settings) load without llama.cpp.
"""

from typing import Any

from .errors import (
    Busy,
    CacheError,
    Cancelled,
    ConfigError,
    ContextOverflow,
    DiskFull,
    EngineError,
    ModelError,
    ModelNotFound,
    RequestError,
    WarmstartError,
)
from .serving import Admitted, Runtime
from .settings import Settings, load_settings
from .types import (
    Done,
    Message,
    Report,
    Request,
    Sampling,
    SessionInfo,
    StoredResponse,
    Stream,
    Token,
    TokenLogprob,
    Tool,
    ToolCall,
)

__all__ = [
    "Admitted",
    "Busy",
    "CacheError",
    "Cancelled",
    "ConfigError",
    "ContextOverflow",
    "DiskFull",
    "Done",
    "EngineError",
    "FakeOptions",
    "Message",
    "ModelError",
    "ModelNotFound",
    "Report",
    "Request",
    "RequestError",
    "Runtime",
    "Sampling",
    "SessionInfo",
    "Settings",
    "StoredResponse",
    "Stream",
    "Token",
    "TokenLogprob",
    "Tool",
    "ToolCall",
    "WarmstartError",
    "load_settings",
    "open_fake_runtime",
    "open_runtime",
]

_LAZY = {
    "open_runtime": ".serving",
    "open_fake_runtime": ".serving",
    "FakeOptions": ".engine",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
