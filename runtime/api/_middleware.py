"""Pure ASGI middleware: API key check, request size limit, JSON bodies whatever their
Content-Type, request counting.

Pure ASGI (not BaseHTTPMiddleware) so streamed replies and disconnect messages pass
through untouched.
"""

from __future__ import annotations

import hmac
import json
from contextvars import ContextVar

import anyio
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..users import LOCAL, Caller, KeyBook, User, find_user
from ._errors import error_body
from ._metrics import Metrics

# The caller of the request being handled, for the runtime's Request (see
# _admission.py): set by AuthMiddleware for the request's own task, and copied into
# the threads it runs on by anyio.
CALLER: ContextVar[Caller] = ContextVar("warmstart_caller", default=LOCAL)

# Probes and load balancers check liveness without a key ("/" is the short status
# that front ends made for Ollama probe).
OPEN_PATHS = frozenset({"/health", "/"})


async def send_error(send: Send, status: int, body: dict, headers: list | None = None) -> None:
    raw = json.dumps(body).encode()
    head = [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": head + (headers or [])})
    await send({"type": "http.response.body", "body": raw})


class AuthMiddleware:
    """Requires ``Authorization: Bearer <key>`` on every path but OPEN_PATHS, or
    ``x-api-key: <key>``, the header Anthropic's clients send, once any key is set:
    ``api_key`` (the one local user, as in a single-user install) or a user's key of
    the keys file (``users``, read again when it changes). The request's caller goes
    into the scope's state (``caller_of``) and into CALLER for the runtime's requests.
    With no key set at all (loopback), every request is the local user's."""

    def __init__(self, app: ASGIApp, api_key: str | None, users: KeyBook | None) -> None:
        self.app = app
        self._key = api_key.encode() if api_key else None
        self._users = users

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        given = _bearer(headers.get(b"authorization", b"")) or headers.get(b"x-api-key", b"")
        users = self._users.current() if self._users is not None else ()
        caller = self._caller(given, users)
        if caller is not None:
            scope.setdefault("state", {})["caller"] = caller
            token = CALLER.set(caller)
            try:
                await self.app(scope, receive, send)
            finally:
                CALLER.reset(token)
            return
        message = "missing API key" if not given else "incorrect API key"
        body = error_body(
            f"{message}: send 'Authorization: Bearer <key>' (or 'x-api-key: <key>')",
            "authentication_error",
            code="invalid_api_key",
        )
        await send_error(send, 401, body, [(b"www-authenticate", b"Bearer")])

    def _caller(self, given: bytes, users: tuple[User, ...]) -> Caller | None:
        if self._key is None and not users:
            return LOCAL  # no key anywhere: the loopback desktop's one user
        # compare_digest: the time taken must not reveal how much of a key matched;
        # every user is compared too (find_user), whichever matched.
        local = self._key is not None and hmac.compare_digest(given, self._key)
        user = find_user(users, given.decode("latin-1")) if given else None
        if local:
            return LOCAL
        return user.caller() if user is not None else None


def _bearer(value: bytes) -> bytes:
    scheme, _, token = value.partition(b" ")
    return token.strip() if scheme.lower() == b"bearer" else b""


def caller_of(scope_state: object) -> Caller:
    """The caller AuthMiddleware found (the local user where it did not run)."""
    found = getattr(scope_state, "caller", None)
    return found if isinstance(found, Caller) else LOCAL


# how much of an over-large body is read (and dropped) before the 413, and for how long
DRAIN_BYTES = 64 << 20
DRAIN_S = 5.0


# A body may pause this long before min_body_rate counts (a client that sends the
# headers first and the body once its JSON is built, or after "100 Continue").
BODY_GRACE_S = 2.0


class BodyLimitMiddleware:
    """Answers 413 to a body over ``limit`` bytes, declared or streamed, and 408 to one
    that takes longer than ``timeout`` seconds or, after BODY_GRACE_S, averages less
    than ``min_rate`` bytes a second (0: no rate). A trickled body must not hold a
    connection (and a descriptor) for long: 300 of them once locked every other
    client out for the 30 s of ``timeout``.

    The body is read up front (it is bounded) and replayed to the app; after it the
    app's ``receive`` reaches the server again, so disconnects still arrive."""

    def __init__(self, app: ASGIApp, limit: int, timeout: float = 30.0, min_rate: int = 0) -> None:
        self.app = app
        self.limit = limit
        self.timeout = timeout
        self.min_rate = min_rate

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.limit:
            await self._too_large(receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        started = anyio.current_time()
        while True:
            with anyio.move_on_after(self._patience(started, size)) as waited:
                message = await receive()
            if waited.cancelled_caught:
                await self._too_slow(send, anyio.current_time() - started >= self.timeout)
                return
            if message["type"] != "http.request":  # the client left before sending it all
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.limit:
                await self._too_large(receive, send, more=message.get("more_body", False))
                return
            if not message.get("more_body", False):
                break
        await self.app(scope, _replay(b"".join(chunks), receive), send)

    def _patience(self, started: float, size: int) -> float:
        """Seconds the next part of the body may take: until ``timeout``, or until the
        ``size`` bytes so far fall below ``min_rate`` after the grace period."""
        latest = self.timeout
        if self.min_rate:
            latest = min(latest, BODY_GRACE_S + size / self.min_rate)
        return max(0.0, started + latest - anyio.current_time())

    async def _too_slow(self, send: Send, timed_out: bool) -> None:
        if timed_out:
            message = f"the request body took longer than {self.timeout:g} s to arrive"
        else:
            message = f"the request body arrived slower than {self.min_rate} bytes a second"
        body = error_body(message, "invalid_request_error", code="request_timeout")
        await send_error(send, 408, body, [(b"connection", b"close")])

    async def _too_large(self, receive: Receive, send: Send, more: bool = True) -> None:
        """The 413, once the rest of the body (up to DRAIN_BYTES, for DRAIN_S) is read
        and dropped: closing a connection with unread bytes in its receive queue sends a
        TCP reset, which can destroy the 413 before a client that is still uploading
        (as most are) reads it."""
        drained = 0
        with anyio.move_on_after(min(self.timeout, DRAIN_S)):
            while more and drained <= DRAIN_BYTES:
                message = await receive()
                if message["type"] != "http.request":
                    return  # the client left: nobody to answer
                drained += len(message.get("body", b""))
                more = message.get("more_body", False)
        body = error_body(
            f"the request body is larger than {self.limit} bytes",
            "invalid_request_error",
            code="request_too_large",
        )
        await send_error(send, 413, body, [(b"connection", b"close")])


def _replay(body: bytes, receive: Receive) -> Receive:
    return _first(receive, {"type": "http.request", "body": body, "more_body": False})


def _first(receive: Receive, message: Message) -> Receive:
    """``receive`` that answers ``message`` first, then the server's."""
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return message
        return await receive()

    return replayed


_WITH_BODY = frozenset({"POST", "PUT", "PATCH"})


def _is_json(content_type: bytes) -> bool:
    kind = content_type.split(b";", 1)[0].strip().lower()
    return kind == b"application/json" or kind.endswith(b"+json")


class JsonBodyMiddleware:
    """Reads a body that looks like JSON (``{`` or ``[`` first) as JSON, whatever its
    Content-Type says (or without one), as Ollama does. ``curl -d`` sends
    application/x-www-form-urlencoded, and FastAPI hands a body of any type but JSON
    (none included) to the route's pydantic model as bytes ("Input should be a valid
    dictionary"). Every body this API takes is JSON, so no other kind is lost.

    Inside BodyLimitMiddleware: the body is bounded and arrives as one message. A
    browser's cross-site "simple" POST (text/plain, no preflight) is still refused by
    the Origin check of _guard.py, which runs first: that, not the type, keeps pages
    out."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        declared = dict(scope.get("headers", ())).get(b"content-type", b"")
        if scope["type"] != "http" or scope["method"] not in _WITH_BODY or _is_json(declared):
            await self.app(scope, receive, send)
            return
        message = await receive()
        if message["type"] == "http.request" and _looks_like_json(message.get("body", b"")):
            headers = [(k, v) for k, v in scope["headers"] if k != b"content-type"]
            scope = {**scope, "headers": [*headers, (b"content-type", b"application/json")]}
        await self.app(scope, _first(receive, message), send)


def _looks_like_json(body: bytes) -> bool:
    return body.lstrip()[:1] in (b"{", b"[")


class CountingMiddleware:
    """Counts every response by route template (not raw path) and status."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500

        async def counted(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, counted)
        finally:
            route = getattr(scope.get("route"), "path", "unmatched")
            self.metrics.count_request(route, status)


class ErrorBodyMiddleware:
    """Rewrites the OpenAI-shaped error bodies of one dialect's routes (from the
    handlers and from the auth, Host and size middleware alike) into that dialect's
    shape, which its clients read. Successful replies pass untouched. A dialect says
    which paths are its own (``applies``) and what its error body is (``reshape``:
    the new body, and the content type to send it with, or None to keep it)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    def applies(self, path: str) -> bool:
        raise NotImplementedError

    def reshape(self, status: int, raw: bytes) -> tuple[bytes, bytes | None]:
        raise NotImplementedError

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.applies(scope["path"]):
            await self.app(scope, receive, send)
            return
        start: Message | None = None
        held: list[bytes] = []

        async def reshaped(message: Message) -> None:
            nonlocal start
            if message["type"] == "http.response.start" and message["status"] >= 400:
                start = message
                return
            if start is None or message["type"] != "http.response.body":
                await send(message)
                return
            held.append(message.get("body", b""))
            if not message.get("more_body", False):
                await self._send(send, start, b"".join(held))

        await self.app(scope, receive, reshaped)

    async def _send(self, send: Send, start: Message, raw: bytes) -> None:
        body, content_type = self.reshape(start["status"], raw)
        dropped = (b"content-length", b"content-type") if content_type else (b"content-length",)
        headers = [(k, v) for k, v in start.get("headers", []) if k.lower() not in dropped]
        headers.append((b"content-length", str(len(body)).encode()))
        if content_type:
            headers.append((b"content-type", content_type))
        await send({**start, "headers": headers})
        await send({"type": "http.response.body", "body": body})
