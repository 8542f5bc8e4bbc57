"""warmstart's runtime: a local model that never prefills the same prefix twice.

The public surface is what ``__all__`` names. ``open_runtime`` (the real model) and
``open_fake_runtime`` (the same runtime over a fake engine, no model file) are
imported on first use, so the light parts (types, settings) load without llama.cpp.
"""

from ._lazy import on_first_use as _on_first_use
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
    Budget,
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
    "Budget",
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

__getattr__ = _on_first_use(__name__, _LAZY)
