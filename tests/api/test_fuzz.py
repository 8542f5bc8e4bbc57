"""Property run: schemathesis generates valid and invalid requests from the app's own
OpenAPI document and sends them to a real server; no response may be a 5xx.

Bounded: ``WARMSTART_FUZZ_EXAMPLES`` examples per operation and mode (default 80 for
the generating routes, a third of that for the rest), about 40 s on 2 cores.
schemathesis' own pytest plugin is not used: its lazy loader breaks on pytest 9.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from warmstart.runtime.api import create_app
from warmstart.runtime.settings import load_settings

from tests.api.conftest import Server
from tests.conftest import fake_runtime

EXAMPLES = int(os.environ.get("WARMSTART_FUZZ_EXAMPLES", "80"))
MODES = (schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE)


def _schema() -> Any:
    """The OpenAPI document, built in process so operations are known at collection;
    it is the same document every server of this app serves."""
    with tempfile.TemporaryDirectory() as data_dir:
        runtime = fake_runtime(Path(data_dir))
        try:
            document = create_app(load_settings(), runtime).openapi()
        finally:
            runtime.close()
    return schemathesis.openapi.from_dict(document)


SCHEMA = _schema()
OPERATIONS = {op.label: op for op in (r.ok() for r in SCHEMA.get_all_operations())}
GENERATING = {
    "POST /v1/chat/completions",
    "POST /v1/completions",
    "POST /v1/embeddings",
    "POST /v1/responses",
    "POST /api/chat",
    "POST /api/generate",
    "POST /api/embed",
    "POST /v1/messages",
    "POST /v1/messages/count_tokens",
}


@pytest.fixture(scope="module")
def fuzz_server(start: Any) -> Iterator[Server]:
    with start() as srv:  # no token delay: many short replies
        yield srv


@pytest.fixture(scope="module")
def http() -> Iterator[requests.Session]:
    with requests.Session() as session:
        yield session


def _runs() -> Iterator[Any]:
    for label, op in OPERATIONS.items():
        # Negative examples need a constraint to break: only the request bodies have
        # them (any string is a valid model or session id).
        has_body = "requestBody" in op.definition.raw
        for mode in MODES if has_body else MODES[:1]:
            yield pytest.param(label, mode, id=f"{label}-{mode.value}")


@pytest.mark.parametrize("label,mode", list(_runs()))
def test_no_server_errors(
    label: str, mode: Any, fuzz_server: Server, http: requests.Session
) -> None:
    examples = EXAMPLES if label in GENERATING else max(1, EXAMPLES // 3)

    @given(case=OPERATIONS[label].as_strategy(generation_mode=mode))
    @settings(
        max_examples=examples,
        deadline=None,
        database=None,  # no .hypothesis/ directory in the checkout
        suppress_health_check=list(HealthCheck),
    )
    def check(case: Any) -> None:
        response = case.call(base_url=fuzz_server.base_url, session=http, timeout=30)
        assert response.status_code < 500, (case.as_curl_command(), response.text)

    check()
