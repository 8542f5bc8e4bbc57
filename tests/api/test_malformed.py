"""Malformed strings are a 400 naming the field, never a 500 (a real server process)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

CHAT = [
    ('{"messages":[{"role":"user","content":"\\ud800"}]}', "messages.0.content", "surrogate"),
    ('{"messages":[{"role":"user","content":"ok \\udfff"}]}', "messages.0.content", "surrogate"),
    (
        '{"messages":[{"role":"user","content":[{"type":"text","text":"\\ud800"}]}]}',
        "messages.0.content.0.text",
        "surrogate",
    ),
    ('{"messages":[{"role":"user","content":null}]}', "messages.0.content", ""),
    ('{"messages":[{"role":"user"}]}', "messages.0.content", "required"),
    # a tool result is accepted (issue 13), but only as the answer to a call
    ('{"messages":[{"role":"tool","content":"x"}]}', "messages.0.tool_call_id", "tool_call_id"),
    ('{"messages":[{"role":"root","content":"x"}]}', "messages.0.role", ""),
    ('{"messages":[{"content":"x"}]}', "messages.0.role", "required"),
    ('{"messages":[{"role":"user","content":"x"}],"stop":"\\ud800"}', "stop", "surrogate"),
    ('{"messages":[{"role":"user","content":"x"}],"stop":["a","\\ud800"]}', "stop.1", "surrogate"),
    ('{"messages":[{"role":"user","content":"x"}],"model":"\\ud800"}', "model", "surrogate"),
    ('{"messages":[{"role":"user","content":"x"}],"user":"\\ud800"}', "user", "surrogate"),
    # inside JSON a field holds as it is: a schema's enum, a property's name (issue 23)
    (
        '{"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_schema",'
        '"json_schema":{"name":"x","schema":{"enum":["a","\\ud800"]}}}}',
        "response_format.json_schema.json_schema.schema",
        "surrogate",
    ),
    (
        '{"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":'
        '{"name":"f","parameters":{"properties":{"\\udc00":{}}}}}]}',
        "tools.0.function.parameters",
        "surrogate",
    ),
    (
        '{"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":'
        '{"name":"f","parameters":' + '{"items":' * 900 + "{}" + "}" * 900 + "}}]}",
        "tools.0.function.parameters",
        "nests more than 100 levels deep",
    ),
]
COMPLETION = [
    ('{"prompt":"\\ud800"}', "prompt", "surrogate"),
    ('{"prompt":["\\udbff\\udbff"]}', "prompt.0", "surrogate"),
    ('{"prompt":null}', "prompt", ""),
]


def _post(srv: Any, path: str, raw: str) -> httpx.Response:
    headers = {"Content-Type": "application/json"}
    return httpx.post(srv.v1 + path, content=raw.encode(), headers=headers, timeout=30)


@pytest.mark.parametrize(
    ("path", "raw", "param", "says"),
    [("/chat/completions", *case) for case in CHAT]
    + [("/completions", *case) for case in COMPLETION],
)
def test_a_malformed_string_is_a_400_naming_its_field(
    server: Any, path: str, raw: str, param: str, says: str
) -> None:
    response = _post(server, path, raw)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param
    assert error["message"].startswith(param + ":")
    assert says in error["message"]


OLLAMA = [
    ("/chat", '{"model":"default","messages":[],"format":{"enum":["\\ud800"]},"stream":false}'),
    ("/chat", '{"model":"default","messages":[],"options":{"\\ud800":1},"stream":false}'),
    ("/embed", '{"model":"default","input":"x","options":{"a":["\\ud800"]}}'),
]


@pytest.mark.parametrize(("path", "raw"), OLLAMA)
def test_a_lone_surrogate_in_an_ollama_body_is_a_400(server: Any, path: str, raw: str) -> None:
    headers = {"Content-Type": "application/json"}
    response = httpx.post(
        server.base_url + "/api" + path, content=raw.encode(), headers=headers, timeout=30
    )
    assert response.status_code == 400, response.text
    assert response.json()["error"].startswith(("format:", "options:"))


def test_no_traceback_is_logged_for_them(start: Any) -> None:
    with start() as srv:
        for raw, _, _ in CHAT:
            assert _post(srv, "/chat/completions", raw).status_code == 400
        assert httpx.get(srv.base_url + "/health").status_code == 200
        assert "Traceback" not in srv.log()
