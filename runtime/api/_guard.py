"""Host and Origin checks: no web page gets in through the user's browser.

Two attacks a loopback server meets on a desktop:

- DNS rebinding: a page on ``evil.example`` re-points its own name at 127.0.0.1,
  and the browser then treats our API as same-origin with that page. The browser
  still sends ``Host: evil.example``, so only Host names this server answers to
  are accepted: loopback names and addresses, ``localhost`` and ``*.localhost``;
  off loopback also the bound address (any IP literal for a wildcard bind), this
  machine's name, and ``allowed_hosts``. An IP literal cannot be rebound.
- Cross-site requests: any page may POST a "simple" request (no preflight) at
  127.0.0.1. A state-changing request (POST, PUT, PATCH, DELETE) that carries an
  ``Origin`` is refused unless that origin is this server itself or listed in
  ``cors_origins``. Non-browser clients send no Origin and are not affected.

Both answer 403 in OpenAI's error shape before the body is read.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Receive, Scope, Send

from ._errors import error_body
from ._middleware import send_error

STATE_CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
_WILDCARD_BINDS = frozenset({"0.0.0.0", "::", ""})


def split_host(value: str) -> str:
    """The host part of a Host header (``name:port``, ``[v6]:port``), lowercased."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1 : value.find("]")] if "]" in value else value
    if value.count(":") == 1:
        value = value.split(":", 1)[0]
    return value.rstrip(".")


def _ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


class HostPolicy:
    """Which Host names this server answers to (see the module docstring)."""

    def __init__(self, bind: str, extra: Iterable[str] = (), *, machine_name: str | None = None):
        bind = split_host(bind)
        bind_ip = _ip(bind)
        self.loopback_only = bind == "localhost" or bool(bind_ip and bind_ip.is_loopback)
        self.any_ip = not self.loopback_only and (bind in _WILDCARD_BINDS)
        names = {n.strip().lower().rstrip(".") for n in extra if n.strip()}
        self.allow_all = "*" in names
        self.suffixes = tuple(n[1:] for n in names if n.startswith("*."))  # ".example.lan"
        self.names = {n for n in names if not n.startswith("*")}
        if not self.loopback_only:
            self.names.add(bind)
            name = (machine_name or socket.gethostname()).lower()
            self.names.update({name, name.split(".")[0], name.split(".")[0] + ".local"})

    def allows(self, host: str) -> bool:
        if self.allow_all or not host:
            # No Host at all is HTTP/1.0 from a tool; browsers always send one.
            return True
        if host == "localhost" or host.endswith(".localhost"):
            return True
        ip = _ip(host)
        if ip is not None:
            return ip.is_loopback or self.any_ip or host in self.names
        return host in self.names or host.endswith(self.suffixes)


def same_origin(origin: str, host_header: str) -> bool:
    """Is ``origin`` (scheme://host[:port]) this very server, as the client named it?"""
    parts = urlsplit(origin)
    return parts.scheme in ("http", "https") and parts.netloc.lower() == host_header.lower()


class HostGuardMiddleware:
    """403 unless the Host is allowed and, on a state-changing request, the Origin."""

    def __init__(self, app: ASGIApp, policy: HostPolicy, cors_origins: Iterable[str]) -> None:
        self.app = app
        self.policy = policy
        self.origins = frozenset(o.rstrip("/") for o in cors_origins)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        host_header = headers.get(b"host", b"").decode("latin-1")
        if not self.policy.allows(split_host(host_header)):
            message = (
                f"the Host {host_header!r} is not one this server answers to; "
                "add it to allowed_hosts if it is this machine's name"
            )
            await self._refuse(send, message, "host_not_allowed")
            return
        origin = headers.get(b"origin")
        if origin is not None and scope["method"] in STATE_CHANGING:
            value = origin.decode("latin-1").rstrip("/")
            if value not in self.origins and not same_origin(value, host_header):
                message = (
                    f"cross-origin {scope['method']} from {value!r} refused; "
                    "list the origin in cors_origins to allow it"
                )
                await self._refuse(send, message, "origin_not_allowed")
                return
        await self.app(scope, receive, send)

    @staticmethod
    async def _refuse(send: Send, message: str, code: str) -> None:
        await send_error(send, 403, error_body(message, "permission_error", code=code))
