"""Qt runs offscreen; every test gets its own app data directory."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import pytest

from tests.app.fakes import FakeBackend
from tests.app.servers import (  # noqa: F401 - fixtures
    fake_server,
    plain_server,
    real_server,
    servers,
    shared_real_server,
)


@pytest.fixture(autouse=True)
def no_real_keyring():
    """The tests never touch the user's keyring: keyring's fail backend makes the app
    keep keys in its fallback file (tests that want a keyring set their own)."""
    import keyring
    from keyring.backends import fail

    before = keyring.get_keyring()
    keyring.set_keyring(fail.Keyring())
    yield
    keyring.set_keyring(before)


@pytest.fixture(autouse=True)
def app_data(tmp_path, monkeypatch):
    path = tmp_path / "appdata"
    monkeypatch.setenv("WARMSTART_APP_DATA", str(path))
    return path


@pytest.fixture
def fake_backend() -> FakeBackend:
    return FakeBackend()
