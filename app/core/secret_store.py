"""Where the app keeps the API key of a server the user configured.

In the OS keyring (the ``keyring`` package: Secret Service, macOS Keychain, Windows
Credential Locker) when a usable backend exists; otherwise in ``api-key``, a 0600
file in the app's 0700 data dir. Never in the conversation database.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Protocol

from .private import private_file, write_private

log = logging.getLogger(__name__)
SERVICE = "warmstart-app"
ACCOUNT = "api-key"
FALLBACK_FILE = "api-key"


class SecretStore(Protocol):
    """One secret: the configured server's API key ("" = none)."""

    def get(self) -> str: ...

    def set(self, value: str) -> None: ...


def _usable_keyring() -> Any | None:
    """The keyring backend, or None when there is none worth using (no package, or
    its fail/null backend: a headless session without a Secret Service)."""
    try:
        import keyring
    except ImportError:
        return None
    backend = keyring.get_keyring()
    # fail.Keyring has priority 0 and null.Keyring -1: they store nothing.
    if float(getattr(backend, "priority", 0)) <= 0:
        return None
    return backend


class KeyringOrFile:
    """The keyring when it works, else the fallback file. A keyring that fails at
    call time (a locked or absent D-Bus service) falls back too, with a warning."""

    def __init__(self, data_dir: Path, keyring_backend: Any | None = None) -> None:
        self.path = data_dir / FALLBACK_FILE
        self._keyring = keyring_backend if keyring_backend is not None else _usable_keyring()

    @property
    def in_keyring(self) -> bool:
        return self._keyring is not None

    def get(self) -> str:
        if self._keyring is not None:
            try:
                value = self._keyring.get_password(SERVICE, ACCOUNT)
            except Exception as exc:  # any backend's failure: D-Bus, locked wallet, ...
                self._give_up_keyring(exc)
            else:
                return value or self._read_file()
        return self._read_file()

    def set(self, value: str) -> None:
        if self._keyring is not None:
            try:
                self._store_in_keyring(value)
            except Exception as exc:  # see get()
                self._give_up_keyring(exc)
            else:
                self._remove_file()  # the keyring has it now; no copy stays on disk
                return
        if value:
            write_private(self.path, value)
        else:
            self._remove_file()

    def _store_in_keyring(self, value: str) -> None:
        assert self._keyring is not None
        if value:
            self._keyring.set_password(SERVICE, ACCOUNT, value)
            return
        try:
            self._keyring.delete_password(SERVICE, ACCOUNT)
        except Exception as exc:  # PasswordDeleteError: there was none
            log.debug("no key to delete from the keyring: %s", exc)

    def _give_up_keyring(self, exc: Exception) -> None:
        log.warning("the keyring is not usable (%s); keeping the API key in %s", exc, self.path)
        self._keyring = None

    def _read_file(self) -> str:
        try:
            private_file(self.path)
            return self.path.read_text("utf-8").strip()
        except FileNotFoundError:
            return ""

    def _remove_file(self) -> None:
        self.path.unlink(missing_ok=True)
