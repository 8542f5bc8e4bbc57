"""The app in process (no server): CORS, per-app metrics, and failures of the runtime
itself, which a real server cannot be made to produce on demand."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from warmstart.runtime.api import create_app
from warmstart.runtime.serving._core import LocalRuntime
from warmstart.runtime.serving._service import Runtime
from warmstart.runtime.serving._streams import QueueStream
from warmstart.runtime.settings import load_settings
from warmstart.runtime.types import Request, Stream

from tests.conftest import fake_runtime

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[LocalRuntime]:
    runtime = fake_runtime(tmp_path)
    yield runtime
    runtime.close()


def _client(runtime: Runtime, **settings: Any) -> TestClient:
    # base_url: the Host check refuses names other than loopback ones ("testserver")
    app = create_app(load_settings(**settings), runtime)
    return TestClient(app, base_url="http://localhost", raise_server_exceptions=False)


def test_fake_runtime_satisfies_the_protocol(fake: LocalRuntime) -> None:
    assert isinstance(fake, Runtime)


def test_cors_is_off_unless_configured(fake: LocalRuntime) -> None:
    origin = {"Origin": "http://example.test"}
    with _client(fake) as off:
        assert "access-control-allow-origin" not in off.get("/v1/models", headers=origin).headers
    with _client(fake, cors_origins=("http://example.test",)) as on:
        headers = on.get("/v1/models", headers=origin).headers
        assert headers["access-control-allow-origin"] == "http://example.test"


def test_each_app_has_its_own_metrics(fake: LocalRuntime) -> None:
    with _client(fake) as first, _client(fake) as second:
        assert first.post("/v1/chat/completions", json=CHAT).status_code == 200
        assert "warmstart_prompt_tokens_total 0.0" not in first.get("/metrics").text
        assert "warmstart_prompt_tokens_total 0.0" in second.get("/metrics").text


class _Broken(LocalRuntime):
    """A runtime whose stats raise and whose streams fail after one token."""

    def stats(self) -> dict[str, Any]:
        raise RuntimeError("boom")

    def settings_report(self) -> dict[str, dict[str, Any]]:
        return {"api_key": {"value": "secret-value", "reason": "flag"}}

    def generate(self, request: Request) -> Stream:
        stream = QueueStream()
        stream.put_token("partial")
        stream.fail(RuntimeError("engine exploded"))
        return stream


@pytest.fixture
def broken(tmp_path: Path) -> Iterator[_Broken]:
    runtime = fake_runtime(tmp_path, runtime_class=_Broken)
    yield runtime
    runtime.close()


def test_unexpected_errors_are_500_in_openai_shape(broken: _Broken) -> None:
    with _client(broken) as client:
        response = client.get("/v1/warmstart/stats")
        assert response.status_code == 500
        assert response.json()["error"]["type"] == "server_error"
        assert "secret-value" not in client.get("/v1/warmstart/settings").text
        assert client.get("/metrics").status_code == 200  # a failing stats() skips its metrics


def test_a_stream_failing_midway_ends_with_an_error_event(broken: _Broken) -> None:
    with _client(broken) as client:
        response = client.post("/v1/chat/completions", json={**CHAT, "stream": True})
        events = [line for line in response.text.splitlines() if line.startswith("data: ")]
        assert '"error"' in events[-2]
        assert events[-1] == "data: [DONE]"
