"""warmstart's OpenAI-compatible HTTP API (see docs/api.md).

``create_app(settings, runtime)`` builds the ASGI app; ``serve(settings, runtime)``
runs it under uvicorn and refuses to bind beyond loopback without an API key.
"""

from ._app import create_app
from ._server import bind_listener, check_bind, is_loopback, serve
from ._unix import bind_unix

__all__ = ["bind_listener", "bind_unix", "check_bind", "create_app", "is_loopback", "serve"]
