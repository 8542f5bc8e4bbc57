"""warmstart's exceptions, and the framework's, as OpenAI-shaped error responses.

Every error body is ``{"error": {"message", "type", "param", "code"}}``. Exception
*types* choose the status (never message text):

    RequestError, validation, bad JSON   400 invalid_request_error
    a field warmstart does not implement 400 invalid_request_error / unsupported_parameter
    ContextOverflow                      400 invalid_request_error / context_length_exceeded
    missing or wrong API key             401 authentication_error / invalid_api_key
    unknown model, session or route      404 invalid_request_error / *_not_found
    body over max_request_bytes          413 invalid_request_error / request_too_large
    Busy                                 429 rate_limit_error / rate_limit_exceeded + Retry-After
    Cancelled (the client went away)     499, which nobody reads
    any other WarmstartError             500 server_error (logged)
    anything else                        500 server_error (logged with its traceback)
"""

from __future__ import annotations

import logging
import math
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..errors import Busy, Cancelled, ContextOverflow, RequestError, WarmstartError

log = logging.getLogger(__name__)


class APIError(Exception):
    """An error the HTTP layer itself decides (unknown model or session, auth, size)."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers


# a field warmstart does not implement (unknown, or known in its neutral value only)
_CODE = "unsupported_parameter"
_UNSUPPORTED = frozenset({"extra_forbidden", _CODE})


def unsupported(param: str, why: str = "") -> APIError:
    """The 400 for a field (or a value of one) warmstart does not implement, naming it."""
    reason = f": {why}" if why else ""
    return APIError(400, f"{param} is not supported by warmstart{reason}", param=param, code=_CODE)


def error_body(
    message: str, type: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    # A message may quote client input; a lone surrogate in it must not make the error
    # itself fail to encode (a 500 in place of the 4xx).
    message = message.encode("utf-8", "replace").decode("utf-8")
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def to_response(exc: APIError) -> JSONResponse:
    body = error_body(exc.message, exc.type, exc.param, exc.code)
    return JSONResponse(body, status_code=exc.status, headers=exc.headers)


def from_runtime(exc: WarmstartError, prompt_param: str = "messages") -> APIError:
    """The APIError for an exception the runtime raised; ``prompt_param`` names the
    request field that holds the prompt (``prompt`` for raw completions)."""
    if isinstance(exc, ContextOverflow):
        return APIError(400, str(exc), param=prompt_param, code="context_length_exceeded")
    if isinstance(exc, RequestError):
        return APIError(400, str(exc), param=exc.param)
    if isinstance(exc, Busy):
        retry = str(max(1, math.ceil(exc.retry_after)))
        return APIError(
            429,
            str(exc),
            type="rate_limit_error",
            code="rate_limit_exceeded",
            headers={"Retry-After": retry},
        )
    if isinstance(exc, Cancelled):
        # 499 (nginx's "client closed request"): nobody reads it, the access log does.
        return APIError(499, str(exc), code="cancelled")
    log.error("runtime error: %s", exc, exc_info=exc)
    return APIError(500, f"the runtime failed: {exc}", type="server_error")


# Pydantic names the union member that failed ("str", "list[TextPart]",
# "function-after[...]") in an error's location; a client wants the field only.
_UNION_TAGS = frozenset({"str", "int", "float", "bool", "list", "dict", "none", "body"})


def _is_field(part: object) -> bool:
    if isinstance(part, int):
        return True
    text = str(part)
    return text.isidentifier() and text not in _UNION_TAGS


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None, str | None]:
    """A one-line message naming the first bad field, that field as ``param``, and the
    error code (``unsupported_parameter`` for a field warmstart does not implement)."""
    errors = exc.errors()
    if not errors:
        return "the request body is invalid", None, None
    # A refused field first: the client must learn it asked for what is not done. Then
    # a failed check on a value says more than "not a list" about a union's other arm.
    first = next(
        (e for e in errors if e.get("type") in _UNSUPPORTED),
        next((e for e in errors if e.get("type") == "value_error"), errors[0]),
    )
    if first.get("type") == "json_invalid":
        return "the request body is not valid JSON", None, None
    loc = [str(p) for p in first.get("loc", ()) if _is_field(p)]
    param = ".".join(loc) or None
    where = f"{param}: " if param else "request body: "
    more = f" (and {len(errors) - 1} more problems)" if len(errors) > 1 else ""
    if first.get("type") == "extra_forbidden":
        return f"{where}warmstart does not support this parameter{more}", param, _CODE
    code = _CODE if first.get("type") in _UNSUPPORTED else None
    return f"{where}{first.get('msg', 'invalid value')}{more}", param, code


def install(app: FastAPI) -> None:
    """Registers the handlers that give every error OpenAI's shape."""

    async def on_api_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, APIError)
        return to_response(exc)

    async def on_runtime_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, WarmstartError)
        return to_response(from_runtime(exc))

    async def on_validation(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        message, param, code = _validation_message(exc)
        return to_response(APIError(400, message, param=param, code=code))

    async def on_http(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        code = "not_found" if exc.status_code == 404 else None
        if exc.status_code in (404, 405):  # say which request missed, not just "Not Found"
            exc.detail = f"{exc.detail}: {request.method} {request.url.path}"
        kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
        headers = dict(exc.headers or {})
        return to_response(
            APIError(exc.status_code, str(exc.detail), type=kind, code=code, headers=headers)
        )

    async def on_unexpected(_: Request, exc: Exception) -> JSONResponse:
        log.error("unexpected error while serving a request", exc_info=exc)
        return to_response(APIError(500, "internal server error", type="server_error"))

    app.add_exception_handler(APIError, on_api_error)
    app.add_exception_handler(WarmstartError, on_runtime_error)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(StarletteHTTPException, on_http)
    app.add_exception_handler(Exception, on_unexpected)
