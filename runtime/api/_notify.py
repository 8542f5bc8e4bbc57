"""Readiness for systemd (``Type=notify``): READY=1 once the API answers /health.

The model is loaded before the server binds, so the first answer from /health
means requests will be served. Without ``$NOTIFY_SOCKET`` (not under systemd,
or another service type) nothing happens. Standard library only: the sd_notify
protocol is one datagram on a unix socket.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time

import httpx

log = logging.getLogger(__name__)

_POLL_S = 0.2
_GIVE_UP_S = 600.0  # systemd's TimeoutStartSec= decides before this; the thread just ends


def _probe_host(host: str) -> str:
    """Where a local probe reaches a server bound to ``host``."""
    if host in ("", "0.0.0.0"):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


def sd_notify(message: str, socket_path: str | None = None) -> bool:
    """Sends one sd_notify datagram; False when there is no socket to send to."""
    path = socket_path if socket_path is not None else os.environ.get("NOTIFY_SOCKET", "")
    if not path:
        return False
    address = "\0" + path[1:] if path.startswith("@") else path  # abstract namespace
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.connect(address)
        sock.sendall(message.encode())
    return True


def _wait_then_notify(url: str, socket_path: str) -> None:
    deadline = time.monotonic() + _GIVE_UP_S
    # verify=False: a loopback probe of our own server, whose certificate may be self-signed
    with httpx.Client(timeout=2.0, verify=False) as client:
        while time.monotonic() < deadline:
            try:
                if client.get(url).status_code == 200:
                    sd_notify("READY=1\nSTATUS=serving", socket_path)
                    log.info("told systemd the API is ready (%s)", url)
                    return
            except httpx.HTTPError:
                pass  # not listening yet
            time.sleep(_POLL_S)
    log.warning("the API never answered %s; systemd was not told it is ready", url)


def notify_when_ready(host: str, port: int, *, tls: bool = False) -> threading.Thread | None:
    """Starts a daemon thread that sends READY=1 when /health answers; None without
    ``$NOTIFY_SOCKET``."""
    socket_path = os.environ.get("NOTIFY_SOCKET", "")
    if not socket_path or not hasattr(socket, "AF_UNIX"):
        return None
    scheme = "https" if tls else "http"
    url = f"{scheme}://{_probe_host(host)}:{port}/health"
    thread = threading.Thread(
        target=_wait_then_notify, args=(url, socket_path), name="sd-notify", daemon=True
    )
    thread.start()
    return thread
