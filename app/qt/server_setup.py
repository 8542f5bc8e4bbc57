"""Which server the app talks to, and how: the one it starts itself (with a fresh key,
sent only once that server is seen listening) or the one the user configured."""

from __future__ import annotations

import logging
import os
import shlex
from collections.abc import Callable
from pathlib import Path

from ..core.api import ApiClient
from ..core.errors import AppError, UntrustedServer
from ..core.launcher import (
    KEY_FILE,
    LocalServer,
    is_loopback,
    new_key,
    override_env,
    port_of,
    serve_command,
    socket_path_for,
)
from ..core.models import LocalModels
from ..core.preferences import Preferences

log = logging.getLogger(__name__)


class ServerSetup:
    """Builds the client and the launcher for the preferences of the moment.

    ``prefs`` reads the current preferences; ``local`` the server the connection has
    started, if any (asked before the key goes out)."""

    def __init__(
        self,
        data_dir: Path,
        prefs: Callable[[], Preferences],
        local: Callable[[], LocalServer | None],
    ) -> None:
        self.data_dir = data_dir
        self._prefs = prefs
        self._local = local
        # The local server's key: fresh for each run, given to no other server.
        self.key = new_key()
        # ...and the socket it is reached through (chosen when first needed)
        self._socket: tuple[Path | None] | None = None

    @property
    def manages_local_server(self) -> bool:
        """The app runs its own server (and trusts no other) unless the user configured
        one: a key, a URL off this machine, or "start a local server" off."""
        prefs = self._prefs()
        return prefs.autostart and is_loopback(prefs.base_url) and not prefs.api_key

    def backend(self) -> ApiClient:
        prefs = self._prefs()
        if self.manages_local_server:
            return ApiClient(
                prefs.base_url,
                api_key=self.key,
                verify=True,
                before_key=self._check_own_server,
                uds=str(self._socket_path) if self._socket_path else None,
            )
        return ApiClient(prefs.base_url, api_key=prefs.api_key or None)

    @property
    def _socket_path(self) -> Path | None:
        """Where the app's own server listens besides its port (None: nowhere else,
        as on Windows)."""
        if self._socket is None:
            self._socket = (socket_path_for(self.data_dir),)
        return self._socket[0]

    def _check_own_server(self) -> None:
        """Before the key goes out: is it our server that listens on the port?"""
        local = self._local()
        if local is None:
            raise UntrustedServer(
                self._prefs().base_url,
                "the app did not start it, and uses no server on this machine that it did "
                "not start unless you configure one",
            )
        local.check_listening(port_of(self._prefs().base_url))

    def launcher(self) -> Callable[[], LocalServer] | None:
        if not self.manages_local_server:
            return None
        override = os.environ.get("WARMSTART_APP_SERVER_CMD")
        data = self.data_dir

        def make() -> LocalServer:
            prefs = self._prefs()
            command = serve_command(
                port_of(prefs.base_url), shlex.split(override) if override else None
            )
            env = override_env(prefs.overrides)
            if prefs.model:
                env["WARMSTART_MODEL"] = prefs.model
            return LocalServer(
                command,
                data / "server.log",
                env,
                api_key=self.key,
                key_path=data / KEY_FILE,
                socket_path=self._socket_path,
            )

        return make

    def local_models(self) -> LocalModels | None:
        """The models directory of the server the app starts; None for any other server
        (its models live on its own machine)."""
        if not self.manages_local_server:
            return None
        try:
            return LocalModels.for_local_server(self._prefs().overrides)
        except AppError as exc:
            log.warning("no local models: %s", exc)
            return None
