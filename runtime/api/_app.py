"""The app factory: one FastAPI app per (settings, runtime), no module-level state."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware

from ..serving import Runtime
from ..settings import Settings
from ..users import KeyBook
from . import (
    _anthropic,
    _embeddings,
    _errors,
    _ollama,
    _ollama_manage,
    _openai,
    _responses,
    _tokenize,
    _warmstart,
)
from ._anthropic_stream import AnthropicErrorMiddleware
from ._guard import HostGuardMiddleware, HostPolicy
from ._metrics import Metrics
from ._middleware import (
    AuthMiddleware,
    BodyLimitMiddleware,
    CountingMiddleware,
    JsonBodyMiddleware,
)
from ._ollama_stream import OllamaErrorMiddleware
from ._state import AppState, LoadedStats, Opener, loaded_model

DESCRIPTION = """An OpenAI-compatible API over a local model whose KV cache is kept in
tiers (live context, RAM pool, disk). Every reply reports how many prompt tokens came
from the cache in `usage.prompt_tokens_details.cached_tokens` and in `x_warmstart`."""


def create_app(settings: Settings, runtime: Runtime, opener: Opener | None = None) -> FastAPI:
    """An ASGI app serving ``runtime``. The caller owns the runtime (and closes it).

    With ``opener`` (a model file -> a runtime), a request naming another installed
    model switches to it: the app then owns whichever runtime is loaded
    (``app.state.warmstart.runtime``), and closes the one it replaces.

    Middleware, outermost first: Anthropic's error shape on /v1/messages, Ollama's
    on /api/ routes, the Host and
    Origin guard (403 before anything else, see _guard.py), CORS (only when
    ``settings.cors_origins``, so a preflight needs no key), request counting, the key
    and its user (``api_key`` or the keys file; before the body is read), body size limit, a
    JSON body read as JSON whatever its Content-Type (as Ollama does).
    """
    app = FastAPI(title="warmstart", version="0.1.0", description=DESCRIPTION)
    path, name = loaded_model(settings, runtime) if opener else (None, runtime.model_id)
    metrics = Metrics(LoadedStats(lambda: st.settled()))  # the loaded runtime's at a scrape
    st = AppState(settings, runtime, metrics, opener=opener, model_path=path, model_name=name)
    app.state.warmstart = st
    _errors.install(app)
    app.include_router(_openai.build_router())
    app.include_router(_responses.build_router())  # OpenAI's Responses API
    app.include_router(_embeddings.build_router())
    app.include_router(_ollama.build_router())  # the Ollama dialect, same runtime and guards
    app.include_router(_ollama_manage.build_router())  # its pull, delete, copy
    app.include_router(_tokenize.build_router())  # llama-server's /tokenize, /detokenize
    app.include_router(_anthropic.build_router())  # Anthropic's Messages API, the same
    if settings.warmstart_routes:  # off: a plain OpenAI-compatible server (docs/scale-out.md)
        app.include_router(_warmstart.build_router())
    app.include_router(_warmstart.build_service_router())
    _add_middleware(app, settings, metrics, st.keys)
    return app


def _add_middleware(app: FastAPI, settings: Settings, metrics: Metrics, users: KeyBook) -> None:
    """The stack create_app's docstring lists, added innermost first."""
    # add_middleware wraps: the last added is the outermost.
    app.add_middleware(JsonBodyMiddleware)  # inside the limit: sees the bounded body
    app.add_middleware(
        BodyLimitMiddleware,
        limit=settings.max_request_bytes,
        timeout=settings.body_timeout,
        min_rate=settings.min_body_rate,
    )
    app.add_middleware(AuthMiddleware, api_key=settings.api_key, users=users)
    app.add_middleware(CountingMiddleware, metrics=metrics)
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(settings.cors_origins),
            allow_methods=["GET", "POST", "DELETE", "OPTIONS"],
            allow_headers=[
                "Authorization",
                "Content-Type",
                "X-Warmstart-Session",
                "X-Api-Key",
                "Anthropic-Version",
                "Anthropic-Beta",
            ],
        )
    policy = HostPolicy(settings.host, settings.allowed_hosts)
    app.add_middleware(HostGuardMiddleware, policy=policy, cors_origins=settings.cors_origins)
    # outermost: every error of an /api/ route, the guards' too, in Ollama's shape
    app.add_middleware(OllamaErrorMiddleware)
    app.add_middleware(AnthropicErrorMiddleware)  # and those of /v1/messages in Anthropic's
