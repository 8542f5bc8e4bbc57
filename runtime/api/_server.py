"""Running the app under uvicorn, and the bind rule: off loopback only with a key."""

from __future__ import annotations

import ipaddress
import logging

import uvicorn

from ..errors import ConfigError
from ..service import Runtime
from ..settings import Settings
from ._app import create_app
from ._notify import notify_when_ready

log = logging.getLogger(__name__)


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and "localhost"; any other name counts as exposed."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name could resolve anywhere


def check_bind(settings: Settings) -> None:
    """Raises ConfigError when the server would be reachable from other machines
    without an API key."""
    if not is_loopback(settings.host) and not settings.api_key:
        raise ConfigError(
            f"host: binding {settings.host!r} exposes the API beyond this machine; "
            "set api_key (WARMSTART_API_KEY or --api-key) or bind 127.0.0.1"
        )


def serve(settings: Settings, runtime: Runtime, *, log_level: str = "info") -> None:
    """Serves ``runtime`` on settings.host:settings.port until interrupted (SIGINT or
    SIGTERM), then closes the runtime (close() is idempotent, so a caller may too).

    Raises ConfigError before binding anything when the bind rule is broken."""
    check_bind(settings)
    app = create_app(settings, runtime)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=log_level,
        # Streams in flight get a few seconds to finish, then are cut (and cancelled).
        timeout_graceful_shutdown=5,
    )
    # under systemd (Type=notify): READY=1 once /health answers, i.e. the model is loaded
    notify_when_ready(settings.host, settings.port, tls=config.ssl_certfile is not None)
    log.info("serving %s on http://%s:%d/v1", runtime.model_id, settings.host, settings.port)
    try:
        uvicorn.Server(config).run()
    finally:
        runtime.close()
