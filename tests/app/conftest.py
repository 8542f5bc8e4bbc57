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
def app_data(tmp_path, monkeypatch):
    path = tmp_path / "appdata"
    monkeypatch.setenv("WARMSTART_APP_DATA", str(path))
    return path


@pytest.fixture
def fake_backend() -> FakeBackend:
    return FakeBackend()
