"""Several installed models, one loaded at a time (the switch in api/_state.py), over
the fake runtime: listing, switching by name, the load route, queued concurrent
requests, the bounded wait for replies in progress, and a model that fails to load.
The same on the real models: tests/api/test_model_switch_real.py."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import openai
import pytest
from warmstart.runtime.api import create_app
from warmstart.runtime.engine._fake import FakeOptions
from warmstart.runtime.errors import ModelError
from warmstart.runtime.serving._core import LocalRuntime
from warmstart.runtime.settings import load_settings

from tests.api.inproc import serving
from tests.conftest import fake_runtime
from tests.gguf_files import tiny_model

ASK = [{"role": "user", "content": "Which model are you?"}]


class Model(LocalRuntime):
    """The runtime over the fake engine, saying when it is closed."""

    log: list[str]

    def close(self) -> None:
        if not self.worker.closing:
            self.log.append(f"close {self.model_id}")
        super().close()


def model(data_dir: Path, name: str, log: list[str], **kw: object) -> Model:
    n_ctx = 1024 if name == "alpha" else 2048
    options = FakeOptions(model_id=name, n_ctx=n_ctx, **kw)  # type: ignore[arg-type]
    runtime: Model = fake_runtime(data_dir, options, Model)
    runtime.log = log
    return runtime


@dataclass
class Setup:
    url: str
    log: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.client = openai.OpenAI(base_url=self.url + "/v1", api_key="x", max_retries=0)

    def ask(self, model: str, **kw: object) -> openai.types.chat.ChatCompletion:
        return self.client.chat.completions.create(model=model, messages=ASK, **kw)  # type: ignore[arg-type, call-overload, no-any-return]


@pytest.fixture
def setup(tmp_path: Path, clean_settings: None, request: pytest.FixtureRequest) -> Iterator[Setup]:
    kw = getattr(request, "param", {})
    models = tmp_path / "models"
    models.mkdir()
    alpha = tiny_model(models / "alpha.gguf", "llama", 8192)
    tiny_model(models / "beta.gguf", "gemma3", 32768)
    settings = load_settings(data_dir=tmp_path, model=str(alpha), switch_wait_s=kw.get("wait", 5))
    log: list[str] = []

    def opener(path: Path) -> Model:
        if path.stem == "broken":
            raise ModelError(f"{path} cannot be loaded")
        log.append(f"open {path.stem}")
        time.sleep(kw.get("open_s", 0.0))
        return model(tmp_path, path.stem, log, token_delay=delay, reply_words=words)

    delay, words = kw.get("token_delay", 0.0), kw.get("reply_words")
    first = model(tmp_path, "alpha", log, token_delay=delay, reply_words=words)
    app = create_app(settings, first, opener)
    with serving(app) as url:
        setup = Setup(url, log)
        yield setup
        setup.client.close()
    app.state.warmstart.close()


def test_every_installed_model_is_listed_with_its_header(setup: Setup) -> None:
    cards = httpx.get(setup.url + "/v1/models").json()["data"]
    assert [c["id"] for c in cards] == ["alpha", "beta"]  # the loaded one first
    alpha, beta = cards
    assert alpha["loaded"] and alpha["aliases"] == ["default"] and not beta["loaded"]
    assert (alpha["n_ctx"], alpha["n_ctx_train"], alpha["context_length"]) == (1024, 8192, 1024)
    assert (beta["n_ctx"], beta["n_ctx_train"], beta["context_length"]) == (None, 32768, 32768)
    assert beta["architecture"] == "gemma3" and beta["quantization"] == "Q4_K_M"
    assert beta["parameters"] == 34 and beta["size_bytes"] > 0 and beta["owned_by"] == "Testers"
    assert setup.client.models.retrieve("default").id == "alpha"
    assert setup.client.models.retrieve("beta").model_extra["loaded"] is False  # type: ignore[index]
    assert setup.log == []  # listing loads nothing


def test_a_request_naming_another_model_switches_to_it(setup: Setup) -> None:
    assert setup.ask("alpha").model == "alpha"
    assert setup.ask("beta").model == "beta"
    assert setup.log == ["close alpha", "open beta"]
    assert setup.ask("default").model == "beta"  # the alias never switches
    assert httpx.get(setup.url + "/health").json()["model"] == "beta"
    assert setup.ask("alpha").model == "alpha"
    assert setup.log[2:] == ["close beta", "open alpha"]
    cards = {c["id"]: c for c in httpx.get(setup.url + "/v1/models").json()["data"]}
    assert cards["beta"]["n_ctx"] == 2048 and not cards["beta"]["loaded"]  # served here before


def test_an_unknown_model_is_a_404_in_openais_shape(setup: Setup) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        setup.ask("gamma")
    assert info.value.body["code"] == "model_not_found"  # type: ignore[index]
    assert info.value.body["param"] == "model"  # type: ignore[index]
    assert "alpha, beta" in info.value.body["message"]  # type: ignore[index]
    reply = httpx.post(setup.url + "/v1/warmstart/models/load", json={"model": "gamma"})
    assert reply.status_code == 404 and reply.json()["error"]["code"] == "model_not_found"
    assert setup.log == []


def test_the_load_route_switches_and_answers_when_loaded(setup: Setup) -> None:
    load = setup.url + "/v1/warmstart/models/load"
    reply = httpx.post(load, json={"model": "beta"}).json()
    assert reply["model"] == "beta" and reply["loaded"] is True and reply["load_ms"] > 0
    assert httpx.post(load, json={"model": "beta"}).json()["load_ms"] == 0
    assert setup.log == ["close alpha", "open beta"]
    assert httpx.post(load, json={}).status_code == 400


@pytest.mark.parametrize("setup", [{"token_delay": 0.01}], indirect=True)
def test_concurrent_requests_for_different_models_queue(setup: Setup) -> None:
    names = ["alpha", "beta"] * 6
    with ThreadPoolExecutor(len(names)) as pool:
        replies = list(pool.map(lambda n: setup.ask(n, max_tokens=8), names))
    assert [r.model for r in replies] == names
    assert all(r.choices[0].message.content for r in replies)
    opens = [e for e in setup.log if e.startswith("open")]
    assert len(opens) == len([e for e in setup.log if e.startswith("close")])


@pytest.mark.parametrize(
    "setup", [{"wait": 0.5, "token_delay": 0.05, "reply_words": 400}], indirect=True
)
def test_a_switch_waits_boundedly_then_cancels_the_replies_in_progress(setup: Setup) -> None:
    done: list[openai.types.chat.ChatCompletion] = []

    def slow() -> None:
        done.append(setup.ask("alpha", max_tokens=400))

    long_reply = threading.Thread(target=slow)
    long_reply.start()
    time.sleep(0.3)  # it is generating, a token every 50 ms
    assert setup.ask("beta", max_tokens=4).model == "beta"
    long_reply.join(timeout=30)
    assert done and done[0].model == "alpha"
    assert done[0].model_extra["x_warmstart"]["finish_reason"] == "cancelled"  # type: ignore[index]
    # 0.5 s of waiting, not the reply's 20 s: counted in the reply's own tokens, which
    # a loaded machine slows down as it slows the switch (a bound in seconds it breaks)
    assert done[0].usage is not None and done[0].usage.completion_tokens < 400 // 2


@pytest.mark.parametrize("setup", [{"open_s": 1.0}], indirect=True)
def test_other_routes_wait_for_a_switch_instead_of_meeting_a_closed_model(setup: Setup) -> None:
    loading = threading.Thread(
        target=httpx.post,
        args=(setup.url + "/v1/warmstart/models/load",),
        kwargs={"json": {"model": "beta"}, "timeout": 30},
    )
    loading.start()
    deadline = time.monotonic() + 10
    while "open beta" not in setup.log and time.monotonic() < deadline:
        time.sleep(0.01)
    health = httpx.get(setup.url + "/health").json()  # answers at once, and says so
    assert health == {"status": "ok", "model": "alpha", "loading": "beta"}
    assert httpx.get(setup.url + "/metrics").status_code == 200
    assert httpx.get(setup.url + "/v1/warmstart/stats", timeout=30).json()["model"] == "beta"
    assert httpx.get(setup.url + "/v1/warmstart/sessions", timeout=30).status_code == 200
    loading.join(timeout=30)
    assert "loading" not in httpx.get(setup.url + "/health").json()


def test_a_model_that_fails_to_load_leaves_the_previous_one_serving(
    setup: Setup, tmp_path: Path
) -> None:
    tiny_model(tmp_path / "models" / "broken.gguf")
    with pytest.raises(openai.InternalServerError):
        setup.ask("broken")
    assert setup.ask("default").model == "alpha"
    assert setup.log == ["close alpha", "open alpha"]


def test_without_an_opener_only_the_loaded_model_is_served(
    tmp_path: Path, clean_settings: None
) -> None:
    tiny_model(tmp_path / "models.gguf")
    runtime = fake_runtime(tmp_path, FakeOptions(model_id="solo"))
    app = create_app(load_settings(data_dir=tmp_path), runtime)
    try:
        with serving(app) as url:
            cards = httpx.get(url + "/v1/models").json()["data"]
            assert [c["id"] for c in cards] == ["solo"] and cards[0]["loaded"]
            reply = httpx.post(url + "/v1/warmstart/models/load", json={"model": "other"})
            assert reply.status_code == 404
    finally:
        runtime.close()


def test_the_ollama_dialect_lists_and_switches_the_same_models(setup: Setup) -> None:
    tags = httpx.get(setup.url + "/api/tags").json()["models"]
    assert [t["name"] for t in tags] == ["alpha:latest", "beta:latest"]
    assert tags[1]["details"]["family"] == "gemma3" and tags[1]["details"]["parameter_size"]
    shown = httpx.post(setup.url + "/api/show", json={"model": "beta"}).json()
    assert shown["model_info"]["gemma3.context_length"] == 32768  # read without loading it
    assert setup.log == []
    body = {"model": "beta:latest", "messages": ASK, "stream": False}
    reply = httpx.post(setup.url + "/api/chat", json=body, timeout=30).json()
    assert reply["model"] == "beta:latest" and reply["message"]["content"]
    assert setup.log == ["close alpha", "open beta"]
    assert [m["name"] for m in httpx.get(setup.url + "/api/ps").json()["models"]] == ["beta:latest"]
    missing = httpx.post(setup.url + "/api/chat", json={**body, "model": "gamma"}, timeout=30)
    assert missing.status_code == 404
