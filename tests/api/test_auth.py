"""The bind rule and the API key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from warmstart.runtime.api import check_bind, is_loopback, serve
from warmstart.runtime.errors import ConfigError
from warmstart.runtime.settings import load_settings

from tests.conftest import fake_runtime

KEY = "test-key-0123456789"


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost"])
def test_loopback_hosts(host: str) -> None:
    assert is_loopback(host)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.5", "10.0.0.1", "example.com", ""])
def test_exposed_hosts(host: str) -> None:
    assert not is_loopback(host)


def test_serve_refuses_an_exposed_bind_without_a_key(tmp_path: Path) -> None:
    runtime = fake_runtime(tmp_path)
    try:
        with pytest.raises(ConfigError, match="api_key"):
            serve(load_settings(host="0.0.0.0", port=0), runtime)
    finally:
        runtime.close()
    check_bind(load_settings(host="0.0.0.0", api_key=KEY))  # with a key it is allowed
    check_bind(load_settings(host="127.0.0.1"))


def test_keyed_server_requires_the_key(start: Any) -> None:
    with start("--api-key", KEY) as srv:
        chat = srv.v1 + "/chat/completions"
        messages: list[Any] = [{"role": "user", "content": "hi"}]
        body = {"messages": messages, "max_tokens": 2}
        for headers in ({}, {"Authorization": "Bearer wrong-key-000"}, {"Authorization": KEY}):
            for method, url in (
                ("POST", chat),
                ("GET", srv.v1 + "/models"),
                ("GET", srv.base_url + "/metrics"),
                ("GET", srv.v1 + "/warmstart/sessions"),
            ):
                response = httpx.request(method, url, json=body, headers=headers)
                assert response.status_code == 401, (method, url, headers)
                assert response.json()["error"]["code"] == "invalid_api_key"
                assert response.headers["WWW-Authenticate"] == "Bearer"
        assert httpx.get(srv.base_url + "/health").status_code == 200  # probes need no key
        with openai.OpenAI(base_url=srv.v1, api_key=KEY, max_retries=0) as good:
            assert good.chat.completions.create(model="default", messages=messages)
        bad = openai.OpenAI(base_url=srv.v1, api_key="nope-nope", max_retries=0)
        with bad, pytest.raises(openai.AuthenticationError):
            bad.models.list()


def test_loopback_without_a_key_needs_none(server: Any) -> None:
    response = httpx.get(server.v1 + "/models")  # no Authorization header at all
    assert response.status_code == 200


def test_a_key_from_a_file_stays_off_the_command_line(start: Any, tmp_path: Any) -> None:
    key_file = tmp_path / "key"
    key_file.write_text(KEY + "\n")
    key_file.chmod(0o600)
    with start(env={"WARMSTART_API_KEY_FILE": str(key_file)}) as srv:
        cmdline = (Path("/proc") / str(srv.process.pid) / "cmdline").read_bytes()
        assert KEY.encode() not in cmdline
        models = srv.v1 + "/models"
        assert httpx.get(models).status_code == 401
        assert httpx.get(models, headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
