"""The running server, seen from the command line: `cache` and `sessions` ask it when
one answers (so they show and change what it holds): the one the data dir's note
names, else the one on the configured host and port. They fall back to the files,
without loading a model, when none does."""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import quote

import httpx

from ..errors import ConfigError, WarmstartError
from ..settings import Settings
from ._running import local_host, read_note

log = logging.getLogger(__name__)
PROBE_TIMEOUT_S = 0.5  # a server on this machine answers /health in milliseconds


def session_path(session_id: str) -> str:
    """``/sessions/<id>``, the id encoded whole: a '/' in it (sessions stored before
    ids were checked may hold one) must not split the path, and a '..' must not be
    removed from it by the HTTP client."""
    return "/sessions/" + quote(session_id, safe="").replace(".", "%2E")


class RemoteError(WarmstartError):
    """The server answered with an error."""


class Server:
    """A warmstart server's own routes, through httpx."""

    def __init__(self, client: httpx.Client) -> None:
        self._client = client

    @classmethod
    def find(cls, settings: Settings, use_note: bool = True) -> Server | None:
        """The server that answers /health now, else None: with ``use_note`` (the
        command was given no --port) first the one the data dir's note names (see
        _running.py), whatever its port, then the one of these settings."""
        scheme = "https" if settings.tls_cert else "http"
        places = [(scheme, settings.host, settings.port)]
        note = read_note(settings.data_dir) if use_note else None
        if note is not None and (note.scheme, note.host, note.port) != places[0]:
            places.insert(0, (note.scheme, note.host, note.port))
        for place in places:
            found = cls._probe(settings, *place)
            if found is not None:
                return found
        return None

    @classmethod
    def _probe(cls, settings: Settings, scheme: str, host: str, port: int) -> Server | None:
        host = local_host(host)
        headers = {"Authorization": f"Bearer {settings.api_key}"} if settings.api_key else {}
        client = httpx.Client(
            base_url=f"{scheme}://{host}:{port}",
            headers=headers,
            timeout=httpx.Timeout(30.0, connect=PROBE_TIMEOUT_S),
            verify=str(settings.tls_cert) if settings.tls_cert else True,
            trust_env=False,  # a proxy must never see the key or the conversations
        )
        try:
            health = client.get("/health", timeout=PROBE_TIMEOUT_S)
            if health.status_code == 200 and health.json().get("status"):
                return cls(client)
        except (httpx.HTTPError, ValueError, AttributeError) as exc:
            log.debug("no server at %s: %s", client.base_url, exc)
        client.close()
        return None

    def _call(self, method: str, path: str) -> Any:
        response = self._client.request(method, "/v1/warmstart" + path)
        if response.status_code == 401:
            raise ConfigError(
                f"api_key: the server at {self._client.base_url} asks for a key; "
                "give the one it was started with (WARMSTART_API_KEY or api_key_file)"
            )
        if response.status_code == 404:
            return None
        if response.status_code >= 400:
            raise RemoteError(f"the server answered {response.status_code}: {response.text}")
        return response.json()

    @property
    def url(self) -> str:
        return str(self._client.base_url).rstrip("/")

    def stats(self) -> dict[str, Any]:
        return dict(self._call("GET", "/stats"))

    def clear_cache(self) -> None:
        self._call("POST", "/cache/clear")

    def sessions(self, anonymous: bool = False) -> list[dict[str, Any]]:
        return list(self._call("GET", "/sessions?all=1" if anonymous else "/sessions")["data"])

    def session(self, session_id: str) -> dict[str, Any] | None:
        found = self._call("GET", session_path(session_id))
        return dict(found) if found is not None else None

    def delete_session(self, session_id: str) -> bool:
        return self._call("DELETE", session_path(session_id)) is not None

    def close(self) -> None:
        self._client.close()
