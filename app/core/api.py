"""The HTTP client of warmstart's OpenAI-compatible API (and of any other such server).

All I/O goes through one ``httpx`` transport, so tests pass ``httpx.MockTransport``.
httpx's errors are translated here, at the boundary, into :mod:`app.core.errors`.

A client made with ``verify=True`` (the app's own local server) sends its key and
messages only to a server it has checked first: one that refuses a request without
the key (401) and accepts the app's key; see :meth:`ApiClient.verify`. With ``uds``
every connection goes to that Unix-domain socket, whatever the URL's port: only the
server the app started can listen there (see app/core/launcher.py).
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any
from urllib.parse import quote

import httpcore
import httpx

try:  # httpcore's own stream class, for the backend below
    from httpcore._backends.sync import SyncStream
except ImportError:  # another httpcore: its own backend connects, as it does
    SyncStream = None  # type: ignore[assignment,misc]

from .errors import (
    ApiError,
    ModelMissing,
    ProtocolError,
    ServerBusy,
    ServerUnavailable,
    UntrustedServer,
    api_error_class,
)
from .report import ReplyReport
from .sse import DONE, iter_sse_json
from .types import (
    ChatEvent,
    Finished,
    Health,
    Sampling,
    ServerSetting,
    SessionSummary,
    TextDelta,
)

DEFAULT_BASE_URL = "http://127.0.0.1:8765/v1"
SESSION_HEADER = "X-Warmstart-Session"
# A cold prefill of a long conversation takes seconds on a small machine (DESIGN.md:
# 1,777 tokens in 11.9 s on 2 cores), so a reply's first byte may be slow to come.
CHAT_TIMEOUT = httpx.Timeout(5.0, read=600.0)
# Loading an 8B model from a cold disk can take minutes; the server answers when done.
LOAD_TIMEOUT = httpx.Timeout(5.0, read=900.0)
QUICK_TIMEOUT = httpx.Timeout(5.0)


class _ClosingUnixBackend(httpcore.SyncBackend):
    """httpcore's connect to a Unix-domain socket, but a failed connect closes its
    socket: httpcore 1.0.9 leaves it open (closed only by the garbage collector, with a
    ResourceWarning), and a dead server is the very case the socket is for. A probe
    connect before each request did not cover a server that went away between the
    probe and the request (the app closing its server while a poll was under way)."""

    def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.NetworkStream:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            for option in socket_options or ():
                sock.setsockopt(*option)
            sock.settimeout(timeout)
            sock.connect(path)
        except TimeoutError as exc:  # (socket.timeout)
            sock.close()
            raise httpcore.ConnectTimeout(f"{path}: {exc}") from exc
        except OSError as exc:
            sock.close()
            raise httpcore.ConnectError(f"{path}: {exc}") from exc
        return SyncStream(sock)


def _unix_transport(path: str) -> httpx.HTTPTransport:
    """httpx's transport over the Unix-domain socket ``path``, through the backend
    above (httpx takes no backend of its own: its pool's is replaced, where this
    httpcore has the parts it is made of)."""
    transport = httpx.HTTPTransport(uds=path)
    pool = getattr(transport, "_pool", None)
    if SyncStream is not None and hasattr(pool, "_network_backend"):
        pool._network_backend = _ClosingUnixBackend()  # type: ignore[union-attr]
    return transport


def session_path(session_id: str) -> str:
    """``sessions/<id>`` with every character of the id that a URL path could read
    otherwise encoded: '/' (an id kept by an older server may hold one) and '.' (a
    '..' segment would be removed by the HTTP client before it is sent)."""
    return "sessions/" + quote(session_id, safe="").replace(".", "%2E")


def _error_from_response(response: httpx.Response) -> ApiError:
    try:
        body = json.loads(response.read() or b"null")
    except (json.JSONDecodeError, UnicodeDecodeError):
        body = None
    err = body.get("error") if isinstance(body, dict) else None
    if isinstance(err, dict):
        message = str(err.get("message") or response.reason_phrase)
        code, type_, param = err.get("code"), err.get("type"), err.get("param")
    else:
        message = (str(err) if err else "") or response.text[:200] or response.reason_phrase
        code = type_ = param = None
    retry_after: float | None = None
    if "retry-after" in response.headers:
        try:
            retry_after = float(response.headers["retry-after"])
        except ValueError:
            retry_after = None
    code = str(code) if code is not None else None
    type_ = str(type_) if type_ is not None else None
    cls = api_error_class(response.status_code, code, type_)
    return cls(
        response.status_code,
        message,
        type=type_,
        code=code,
        param=str(param) if param else None,
        retry_after=retry_after,
    )


class ApiClient:
    """A client of one server. Thread-safe: every call may run on a worker thread."""

    def __init__(
        self,
        base_url: str = DEFAULT_BASE_URL,
        *,
        api_key: str | None = None,
        transport: httpx.BaseTransport | None = None,
        verify: bool = False,
        before_key: Callable[[], None] | None = None,
        uds: str | None = None,
    ) -> None:
        """``verify``: check the server (see :meth:`verify`) before the key or any
        message goes to it. ``before_key`` runs then, and again before every request
        that carries the key, and raises :class:`UntrustedServer` when the app knows
        the server is not its own (it did not start one, or the one it started is not
        the one listening). ``uds``: connect only through this Unix-domain socket."""
        self.base_url = base_url.rstrip("/")
        self.root_url = self.base_url.removesuffix("/v1")
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._transport = transport
        self._uds = uds
        self._client = self._new_client(QUICK_TIMEOUT)
        # /health and the check without the key never carry it
        self._bare = self._new_client(QUICK_TIMEOUT, keyed=False)
        self._must_verify = verify
        self._before_key = before_key
        self._verified = threading.Event()
        self._verify_lock = threading.Lock()

    def _new_client(self, timeout: httpx.Timeout, *, keyed: bool = True) -> httpx.Client:
        headers = self._headers if keyed else {}
        if self._uds is None or self._transport is not None:
            return httpx.Client(headers=headers, transport=self._transport, timeout=timeout)
        # One transport per client (closing a client closes its transport), and no
        # proxy from the environment: it would carry the key off the socket.
        transport = _unix_transport(self._uds)
        return httpx.Client(headers=headers, transport=transport, timeout=timeout, trust_env=False)

    def close(self) -> None:
        self._client.close()
        self._bare.close()

    # -- is this the server we mean? -----------------------------------------------------

    def verify(self) -> None:
        """Raises :class:`UntrustedServer` unless the server is the one holding our key.

        In this order, so that nothing of value reaches an impostor: ``before_key``;
        a request without the key, which must get 401 (a server that answers anything
        is not ours, and never sees the key); then one with the key, which must get
        200. Done once, and again after the server has gone away (another process
        may have taken its port). A no-op for a client made without ``verify``."""
        if not self._must_verify or self._verified.is_set():
            return
        with self._verify_lock:
            if self._verified.is_set():
                return
            if self._before_key is not None:
                self._before_key()
            url = f"{self.base_url}/models"
            status = self._status(self._bare, url)
            if status == 503:  # overloaded: neither trusted nor refused yet
                raise ServerBusy(503, "busy")
            if status != 401:
                reason = f"it answers without the app's key (HTTP {status} instead of 401)"
                raise UntrustedServer(self.base_url, reason)
            status = self._status(self._client, url)
            if status == 503:
                raise ServerBusy(503, "busy")
            if status != 200:
                reason = f"it does not accept the app's key (HTTP {status})"
                raise UntrustedServer(self.base_url, reason)
            self._verified.set()

    def _status(self, client: httpx.Client, url: str) -> int:
        try:
            return client.get(url).status_code
        except httpx.TransportError as exc:
            raise ServerUnavailable(self.base_url, type(exc).__name__) from exc

    def _lost(self, exc: httpx.TransportError) -> ServerUnavailable:
        self._verified.clear()  # whatever answers next on this port is checked again
        return ServerUnavailable(self.base_url, type(exc).__name__)

    # -- plain requests ------------------------------------------------------------------

    def guard(self) -> None:
        """Before anything that carries the key: the server was verified, and (with
        ``before_key``) the process the app started still listens there now."""
        self.verify()
        if self._must_verify and self._before_key is not None:
            try:
                self._before_key()
            except UntrustedServer:
                self._verified.clear()  # whatever answers later is checked afresh
                raise

    def _request(
        self, method: str, url: str, *, keyed: bool = True, **kwargs: Any
    ) -> httpx.Response:
        if keyed:
            self.guard()
        try:
            client = self._client if keyed else self._bare
            response = client.request(method, url, **kwargs)
        except httpx.TransportError as exc:
            raise self._lost(exc) from exc
        if response.status_code >= 400:
            raise _error_from_response(response)
        return response

    def _json(self, method: str, url: str, **kwargs: Any) -> Any:
        response = self._request(method, url, **kwargs)
        try:
            return response.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ProtocolError(f"{url} did not return JSON") from exc

    def _warmstart_json(self, method: str, path: str, **kwargs: Any) -> Any | None:
        """A warmstart-only endpoint; ``None`` when the server does not have it (or,
        for one conversation, does not know it)."""
        try:
            return self._json(method, f"{self.base_url}/warmstart/{path}", **kwargs)
        except ApiError as exc:
            if exc.status in (404, 405, 501):
                return None
            raise

    def health(self) -> Health:
        url = f"{self.root_url}/health"
        try:
            try:
                data = self._json("GET", url, keyed=False)
            except ServerUnavailable:
                status = self._port_answers()
                if status is None:
                    raise  # nobody there either: the port is free for the app's server
                data = self._socket_again(url, status)
        except ApiError as exc:
            if self._must_verify and exc.status in (401, 403):
                # warmstart's /health is open: whatever wants a key there is not ours
                reason = f"it asks for a key on /health (HTTP {exc.status})"
                raise UntrustedServer(self.base_url, reason) from exc
            if exc.status != 404:
                raise
            # A plain OpenAI-compatible server may have no /health: answering is enough.
            self.models()
            return Health(status="ok")
        if not isinstance(data, dict):
            raise ProtocolError("/health did not return an object")
        progress = data.get("progress")
        return Health(
            status=str(data.get("status", "ok")),
            model=str(data["model"]) if data.get("model") else None,
            progress=float(progress) if isinstance(progress, int | float) else None,
            raw=data,
        )

    def _port_answers(self) -> int | None:
        """Nothing answered on the socket: is another program on the URL's port? Asked
        without the key (a plain /health), so that the app says so instead of trying
        to start its server there. The HTTP status of the port's answer, or None."""
        if self._uds is None:
            return None
        with httpx.Client(timeout=QUICK_TIMEOUT, trust_env=False) as tcp:
            try:
                return tcp.get(f"{self.root_url}/health").status_code
            except httpx.TransportError:
                return None

    def _socket_again(self, url: str, port_status: int) -> Any:
        """The port answered after the socket refused: the app's own server listens on
        the socket before the port, so either it had just started (the socket answers
        now) or another program holds the port."""
        try:
            return self._json("GET", url, keyed=False)
        except ServerUnavailable as exc:
            reason = f"another program answers on its port (HTTP {port_status})"
            raise UntrustedServer(self.base_url, f"{reason}, not the app's server") from exc

    def models(self) -> list[str]:
        data = self._json("GET", f"{self.base_url}/models")
        items = data.get("data") if isinstance(data, dict) else None
        if not isinstance(items, list):
            raise ProtocolError("/models did not return a list")
        return [str(m["id"]) for m in items if isinstance(m, dict) and "id" in m]

    def load_model(self, name: str) -> float | None:
        """Makes ``name`` the server's loaded model (``POST /v1/warmstart/models/load``);
        returns the load time in ms, or ``None`` when the server has no such route (an
        older warmstart, a plain OpenAI server): naming the model in requests is then
        all there is. Raises :class:`ModelMissing` when the server does not know it."""
        url = f"{self.base_url}/warmstart/models/load"
        try:
            data = self._json("POST", url, json={"model": name}, timeout=LOAD_TIMEOUT)
        except ModelMissing:
            raise
        except ApiError as exc:
            if exc.status in (404, 405, 501):  # the route itself is missing
                return None
            raise
        if not isinstance(data, dict) or data.get("loaded") is False:
            raise ProtocolError(f"{url} did not confirm that {name!r} is loaded")
        load_ms = data.get("load_ms")
        return float(load_ms) if isinstance(load_ms, int | float) else 0.0

    def sessions(self, search: str = "") -> list[SessionSummary] | None:
        params = {"q": search} if search else None
        data = self._warmstart_json("GET", "sessions", params=params)
        if data is None:
            return None
        items = data.get("data") if isinstance(data, dict) else data
        if not isinstance(items, list):
            raise ProtocolError("/warmstart/sessions did not return a list")
        return [SessionSummary.from_json(s) for s in items if isinstance(s, dict)]

    def session(self, session_id: str) -> SessionSummary | None:
        data = self._warmstart_json("GET", session_path(session_id))
        return SessionSummary.from_json(data) if isinstance(data, dict) else None

    def delete_session(self, session_id: str) -> None:
        self._warmstart_json("DELETE", session_path(session_id))

    def rename_session(self, session_id: str, title: str) -> None:
        self._warmstart_json("PATCH", session_path(session_id), json={"title": title})

    def import_sessions(self, sessions: list[dict[str, Any]]) -> dict[str, Any] | None:
        data = self._warmstart_json("POST", "sessions/import", json={"sessions": sessions})
        return data if isinstance(data, dict) else None

    def prewarm(self, session_id: str) -> bool:
        """Ask the server to bring a conversation's KV up a tier; False when unsupported
        or when the server does not know the conversation."""
        try:
            path = session_path(session_id) + "/prewarm"
            return self._warmstart_json("POST", path) is not None
        except ApiError as exc:
            if exc.status == 404:
                return False
            raise

    def prefill(
        self, messages: list[dict[str, str]], *, session_id: str, model: str | None
    ) -> dict[str, Any] | None:
        """A draft (``POST /v1/warmstart/prefill``): the server computes what the
        message being typed is certain to share, and answers once that stops with
        ``ready_tokens`` of ``prompt_tokens``; None when it has no such route."""
        body = {"model": model or "default", "messages": messages, "user": session_id}
        headers = {SESSION_HEADER: session_id}
        data = self._warmstart_json(
            "POST", "prefill", json=body, headers=headers, timeout=LOAD_TIMEOUT
        )
        return data if isinstance(data, dict) else None

    def stats(self) -> dict[str, Any] | None:
        data = self._warmstart_json("GET", "stats")
        return data if isinstance(data, dict) else None

    def server_settings(self) -> dict[str, ServerSetting] | None:
        data = self._warmstart_json("GET", "settings")
        if not isinstance(data, dict):
            return None
        out: dict[str, ServerSetting] = {}
        for name, entry in data.items():
            if isinstance(entry, dict):
                out[name] = ServerSetting(name, entry.get("value"), str(entry.get("reason", "")))
            else:
                out[name] = ServerSetting(name, entry)
        return out

    # -- streaming chat -------------------------------------------------------------------

    def chat(
        self,
        messages: list[dict[str, str]],
        *,
        session_id: str,
        model: str | None,
        sampling: Sampling,
    ) -> HttpChatStream:
        body: dict[str, Any] = {
            "model": model or "default",
            "messages": messages,
            "stream": True,
            "stream_options": {"include_usage": True},
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "max_tokens": sampling.max_tokens,
            "user": session_id,
        }
        if sampling.seed is not None:
            body["seed"] = sampling.seed
        if sampling.stop:
            body["stop"] = list(sampling.stop)
        return HttpChatStream(self, body, {SESSION_HEADER: session_id})


class HttpChatStream:
    """One streamed reply. Iterate it once, on a worker thread."""

    def __init__(self, api: ApiClient, body: dict[str, Any], headers: dict[str, str]) -> None:
        self._api = api
        self._body = body
        self._headers = headers
        self._cancelled = threading.Event()
        self._response: httpx.Response | None = None

    def cancel(self) -> None:
        self._cancelled.set()
        response = self._response
        if response is not None:
            # Closing the connection is what tells the server to stop generating; the
            # reading thread then fails or ends, and either way reports "cancelled".
            with contextlib.suppress(Exception):  # closing may race the reading thread
                response.close()

    def __iter__(self) -> Iterator[ChatEvent]:
        self._api.guard()  # before a byte of the conversation leaves the app
        # Each reply gets its own connection, so closing it to stop cannot disturb others.
        client = self._api._new_client(CHAT_TIMEOUT)
        started = time.perf_counter()
        state: dict[str, Any] = {"ttft": None, "n": 0, "finish": None, "usage": None, "x": None}
        try:
            yield from self._events(client, started, state)
        except httpx.TransportError as exc:
            if not self._cancelled.is_set():
                raise self._api._lost(exc) from exc
        except httpx.StreamError as exc:
            if not self._cancelled.is_set():
                raise ServerUnavailable(self._api.base_url, type(exc).__name__) from exc
        finally:
            client.close()
        total = (time.perf_counter() - started) * 1000
        cancelled = self._cancelled.is_set()
        finish = "cancelled" if cancelled else state["finish"]
        report = ReplyReport.from_payload(
            state["x"], state["usage"], finish_reason=finish, ttft_ms=state["ttft"], total_ms=total
        )
        if cancelled and report.finish_reason != "cancelled":
            report = ReplyReport.from_json({**report.to_json(), "finish_reason": "cancelled"})
        if report.completion_tokens == 0 and state["n"]:
            report = ReplyReport.from_json({**report.to_json(), "completion_tokens": state["n"]})
        yield Finished(report)

    def _events(
        self, client: httpx.Client, started: float, state: dict[str, Any]
    ) -> Iterator[ChatEvent]:
        url = f"{self._api.base_url}/chat/completions"
        with client.stream("POST", url, json=self._body, headers=self._headers) as response:
            self._response = response
            if response.status_code >= 400:
                raise _error_from_response(response)
            for payload in iter_sse_json(response.iter_lines()):
                if self._cancelled.is_set() or payload is DONE:
                    return
                if not isinstance(payload, dict):
                    continue
                if isinstance(payload.get("error"), dict):
                    err = payload["error"]
                    cls = api_error_class(500, err.get("code"), err.get("type"))
                    raise cls(500, str(err.get("message")), code=err.get("code"))
                state["usage"] = payload.get("usage") or state["usage"]
                state["x"] = payload.get("x_warmstart") or state["x"]
                for choice in payload.get("choices") or []:
                    state["finish"] = choice.get("finish_reason") or state["finish"]
                    text = (choice.get("delta") or {}).get("content")
                    if text:
                        if state["ttft"] is None:
                            state["ttft"] = (time.perf_counter() - started) * 1000
                        state["n"] += 1
                        yield TextDelta(text)
