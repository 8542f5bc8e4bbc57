"""What every route needs, held on ``app.state`` (one per app, never per module)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import anyio
from fastapi import Request

from ..service import Runtime
from ..settings import Settings
from ._errors import APIError, error_body
from ._metrics import Metrics
from ._schemas import ErrorResponse

# Names a client may use for the loaded model besides its own id.
MODEL_ALIASES = frozenset({"default"})

# The OpenAPI "responses" of the routes that reach the runtime.
ERRORS: dict[int | str, dict] = {
    400: {"model": ErrorResponse, "description": "invalid request"},
    401: {"model": ErrorResponse, "description": "missing or wrong API key"},
    403: {"model": ErrorResponse, "description": "Host or Origin not allowed"},
    404: {"model": ErrorResponse, "description": "unknown model or session"},
    413: {"model": ErrorResponse, "description": "request body too large"},
    429: {"model": ErrorResponse, "description": "busy; see Retry-After"},
}


@dataclass
class AppState:
    settings: Settings
    runtime: Runtime
    metrics: Metrics
    started: int = field(default_factory=lambda: int(time.time()))
    _limiter: anyio.CapacityLimiter | None = None

    @property
    def limiter(self) -> anyio.CapacityLimiter:
        """Threads that wait on the runtime's streams; created in the running loop.

        Its own limiter so that many waiting replies cannot starve the threads that
        FastAPI uses for plain sync routes (sessions, stats)."""
        if self._limiter is None:
            self._limiter = anyio.CapacityLimiter(self.settings.max_queue + 64)
        return self._limiter

    def check_model(self, name: str | None) -> None:
        """Raises 404 model_not_found unless ``name`` is empty, an alias or the model id."""
        if name is None or name in MODEL_ALIASES or name == self.runtime.model_id:
            return
        raise APIError(
            404,
            f"the model '{name}' does not exist; this server runs '{self.runtime.model_id}'",
            param="model",
            code="model_not_found",
        )


def state(request: Request) -> AppState:
    app_state = request.app.state.warmstart
    assert isinstance(app_state, AppState)
    return app_state


__all__ = ["ERRORS", "MODEL_ALIASES", "AppState", "error_body", "state"]
