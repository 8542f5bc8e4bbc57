"""Issue 21 items 1, 4 and 5 over the fake runtime, with Ollama's own client where it
shows the field: tools on /api/chat (shapes, refusals), keep_alive (parsing, the
unload and the reopen, a reply never cut), /api/pull against the hub imitation
(progress, offline, refusals), /api/copy and /api/delete, /tokenize and /detokenize.
The same on the real model: test_ollama_manage_real.py."""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx
import ollama
import pytest
from warmstart.runtime.api import create_app
from warmstart.runtime.api._keep_alive import Expiry, keep_alive_seconds
from warmstart.runtime.engine._fake import FakeOptions
from warmstart.runtime.errors import RequestError
from warmstart.runtime.serving._admit import Admitted
from warmstart.runtime.serving._core import LocalRuntime
from warmstart.runtime.settings import load_settings
from warmstart.runtime.types import Budget, Request

from tests.api.conftest import Server
from tests.api.inproc import serving
from tests.conftest import fake_runtime
from tests.gguf_files import tiny_model
from tests.hubfake import Hub, serve_hub

REPO = "someone/tiny-GGUF"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather for a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
ASK = [{"role": "user", "content": "Weather in Paris?"}]


class Model(LocalRuntime):
    """A fake that logs its closing and, with tools, always calls the first one (the
    fake calls only a forced tool; Ollama has no tool_choice)."""

    log: list[str]

    def admit(self, request: Request, budget: Budget | None = None) -> Admitted:
        if request.tools:
            request = replace(request, tool_choice="required")
        return super().admit(request, budget)

    def close(self) -> None:
        if not self.worker.closing:
            self.log.append(f"close {self.model_id}")
        super().close()


def model(data_dir: Path, name: str, log: list[str]) -> Model:
    runtime: Model = fake_runtime(data_dir, FakeOptions(model_id=name, token_delay=0.002), Model)
    runtime.log = log
    return runtime


@dataclass
class Setup:
    url: str
    models: Path
    log: list[str] = field(default_factory=list)

    def chat(self, **body: Any) -> httpx.Response:
        body = {"model": "default", "messages": ASK, "stream": False, **body}
        return httpx.post(self.url + "/api/chat", json=body, timeout=30)


@pytest.fixture
def setup(tmp_path: Path, clean_settings: None) -> Iterator[Setup]:
    models = tmp_path / "models"
    models.mkdir()
    alpha = tiny_model(models / "alpha.gguf")
    settings = load_settings(data_dir=tmp_path, model=str(alpha), switch_wait_s=5)
    log: list[str] = []

    def opener(path: Path) -> Model:
        log.append(f"open {path.stem}")
        return model(tmp_path, path.stem, log)

    app = create_app(settings, model(tmp_path, "alpha", log), opener)
    with serving(app) as url:
        yield Setup(url, models, log)
    app.state.warmstart.close()


@pytest.fixture
def client(setup: Setup) -> Iterator[ollama.Client]:
    with ollama.Client(host=setup.url, timeout=30) as c:
        yield c


# tools -----------------------------------------------------------------------------------


def test_a_call_comes_in_ollamas_shape_whole_and_streamed(client: ollama.Client) -> None:
    whole = client.chat(model="default", messages=ASK, tools=TOOLS)
    assert whole.done and whole.message.tool_calls
    call = whole.message.tool_calls[0]
    assert call.function.name == "get_weather" and call.function.arguments == {}
    parts = list(client.chat(model="default", messages=ASK, tools=TOOLS, stream=True))
    assert parts[-1].done and [bool(p.message.tool_calls) for p in parts] == [True, False]


def test_the_result_goes_back_as_a_tool_message(setup: Setup, client: ollama.Client) -> None:
    call = {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
    result = {"role": "tool", "content": "sunny", "tool_name": "get_weather"}
    messages = [*ASK, {"role": "assistant", "content": "", "tool_calls": [call]}, result]
    reply = setup.chat(messages=messages, tools=TOOLS, user="tool-loop")
    assert reply.status_code == 200, reply.text
    kept = httpx.get(setup.url + "/v1/warmstart/sessions/tool-loop").json()["messages"]
    assert [m["role"] for m in kept] == ["user", "assistant", "tool", "assistant"]
    assert json.loads(kept[1]["tool_calls"][0]["function"]["arguments"]) == {"city": "Paris"}
    assert kept[2]["name"] == "get_weather"
    # the client's own message objects are accepted back as they are
    first = client.chat(model="default", messages=ASK, tools=TOOLS)
    assert client.chat(model="default", messages=[*ASK, first.message, result], tools=TOOLS).done


@pytest.mark.parametrize(
    "messages,tools,param",
    [
        (ASK, [{"type": "code", "function": {"name": "f"}}], "tools.0.type"),
        (
            ASK,
            [{"type": "function", "function": {"name": "f", "strict": True}}],
            "tools.0.function.strict",
        ),
        (ASK, [{"type": "function", "function": {"name": "bad name"}}], "tools.0.function.name"),
        (
            [{"role": "user", "content": "x", "tool_calls": [{"function": {"name": "f"}}]}],
            [],
            "messages.0.tool_calls",
        ),
        ([{"role": "user", "content": "x", "tool_name": "f"}], [], "messages.0.tool_name"),
        (
            [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "x": 1}}]}],
            [],
            "messages.0.tool_calls.0.function.x",
        ),
    ],
)
def test_bad_tool_shapes_are_refused_by_name(
    setup: Setup, messages: list[Any], tools: list[Any], param: str
) -> None:
    reply = setup.chat(messages=messages, tools=tools)
    assert reply.status_code == 400, reply.text
    assert param in reply.json()["error"]


def test_show_says_tools(client: ollama.Client) -> None:
    assert "tools" in (client.show("alpha").capabilities or [])


# keep_alive -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value,seconds",
    [
        (None, None),
        ("", None),
        (0, 0.0),
        ("0", 0.0),
        ("0s", 0.0),
        (30, 30.0),
        (2.5, 2.5),
        ("300", 300.0),
        ("5m", 300.0),
        ("1h30m", 5400.0),
        ("250ms", 0.25),
        (-1, math.inf),
        ("-1m", math.inf),
        (1e12, math.inf),
    ],
)
def test_keep_alive_values(value: Any, seconds: float | None) -> None:
    assert keep_alive_seconds(value) == seconds


@pytest.mark.parametrize("value", ["soon", "5 minutes", "1d", "m", True, float("nan")])
def test_keep_alive_nonsense_is_refused(value: Any) -> None:
    with pytest.raises(RequestError, match="keep_alive"):
        keep_alive_seconds(value)


def test_the_expiry_unloads_when_due_and_not_before() -> None:
    unloaded = threading.Event()
    expiry = Expiry(unloaded.set)
    try:
        expiry.set(60)
        expiry.set(math.inf)  # a later request keeps it for good
        assert not unloaded.wait(0.3) and expiry.due is None
        expiry.set(0.1)
        assert unloaded.wait(10)
    finally:
        expiry.close()


def _wait_unloaded(setup: Setup) -> None:
    deadline = time.monotonic() + 20
    while httpx.get(setup.url + "/api/ps").json()["models"]:
        assert time.monotonic() < deadline, "never unloaded"
        time.sleep(0.02)


def test_keep_alive_0_unloads_after_the_reply_and_the_next_request_reopens(
    setup: Setup,
) -> None:
    assert setup.chat(keep_alive=0).status_code == 200
    _wait_unloaded(setup)
    assert setup.log == ["close alpha"]
    assert httpx.get(setup.url + "/metrics").status_code == 200  # no runtime to read: fine
    assert setup.chat().json()["done"]
    assert setup.log == ["close alpha", "open alpha"]
    assert httpx.get(setup.url + "/api/ps").json()["models"]


def test_an_empty_request_with_keep_alive_0_only_unloads(
    client: ollama.Client, setup: Setup
) -> None:
    reply = client.generate(model="alpha", keep_alive=0)
    assert reply.done and reply.done_reason == "unload"
    _wait_unloaded(setup)
    assert client.generate(model="alpha").done_reason == "load"
    assert setup.log == ["close alpha", "open alpha"]


def test_a_duration_unloads_later_and_negative_never(setup: Setup) -> None:
    # long enough that /api/ps still lists the model on a busy machine (300 ms ran out
    # before the next request once, in a whole-suite run), short enough to wait out
    assert setup.chat(keep_alive="3s").status_code == 200
    expires = httpx.get(setup.url + "/api/ps").json()["models"][0]["expires_at"]
    assert expires < "2100"  # a time set, not "for good"
    _wait_unloaded(setup)
    assert setup.chat(keep_alive=-1).status_code == 200
    time.sleep(0.5)
    assert httpx.get(setup.url + "/api/ps").json()["models"]
    assert setup.log == ["close alpha", "open alpha"]


def test_an_unload_never_cuts_another_reply(setup: Setup) -> None:
    body = {"model": "default", "messages": [{"role": "user", "content": "long"}]}
    body["options"] = {"num_predict": 300}
    with httpx.stream("POST", setup.url + "/api/chat", json=body, timeout=60) as long:
        lines = long.iter_lines()
        next(lines)
        assert setup.chat(keep_alive=0).status_code == 200
        rest = [json.loads(line) for line in lines if line]
    assert rest[-1]["done"] and rest[-1]["done_reason"] in ("stop", "length")
    _wait_unloaded(setup)  # once the long reply ended


def test_keep_alive_is_refused_where_the_model_cannot_be_reopened(server: Server) -> None:
    """The fake server has no model file to open again."""
    body = {"model": "default", "messages": ASK, "stream": False, "keep_alive": 0}
    reply = httpx.post(server.base_url + "/api/chat", json=body, timeout=30)
    assert reply.status_code == 400 and "keep_alive" in reply.json()["error"]
    body["keep_alive"] = "soon"
    reply = httpx.post(server.base_url + "/api/chat", json=body, timeout=30)
    assert reply.status_code == 400 and "'soon' is not a duration" in reply.json()["error"]
    body["keep_alive"] = -1
    assert httpx.post(server.base_url + "/api/chat", json=body, timeout=30).status_code == 200


# pull, copy, delete -----------------------------------------------------------------------


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch) -> Iterator[Hub]:
    with serve_hub(Hub()) as h:
        monkeypatch.setenv("HF_ENDPOINT", h.url)
        monkeypatch.setenv("HF_HUB_OFFLINE", "0")
        yield h


def test_pull_streams_progress_then_success(
    client: ollama.Client, hub: Hub, tmp_path: Path
) -> None:
    data = tiny_model(tmp_path / "tiny.gguf").read_bytes() + bytes(3 << 20)
    hub.add_hub_file(REPO, "tiny.gguf", data)
    hub.throttle = 0.001  # several blocks: several progress lines
    lines = list(client.pull(f"hf:{REPO}/tiny.gguf", stream=True))
    assert lines[0].status == "pulling manifest"
    assert [p.status for p in lines[-2:]] == ["verifying sha256 digest", "success"]
    progress = [p for p in lines if p.total]
    assert len(progress) > 1 and progress[-1].completed == progress[-1].total == len(data)
    assert [p.completed for p in progress] == sorted(p.completed or 0 for p in progress)
    assert "tiny:latest" in {m.model for m in client.list().models}
    again = client.pull(f"hf:{REPO}/tiny.gguf")  # kept: no second download
    assert again.status == "success" and len(hub.ranges) == 1


def test_pull_offline_ends_with_one_error_line(
    setup: Setup, monkeypatch: pytest.MonkeyPatch, client: ollama.Client
) -> None:
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    body = {"model": f"hf:{REPO}/tiny.gguf"}
    with httpx.stream("POST", setup.url + "/api/pull", json=body, timeout=60) as r:
        lines = [json.loads(line) for line in r.iter_lines() if line]
    assert r.status_code == 200 and lines[0] == {"status": "pulling manifest"}
    assert len(lines) == 2 and "offline or unreachable" in lines[1]["error"]
    with pytest.raises(ollama.ResponseError, match="offline or unreachable"):
        client.pull(f"hf:{REPO}/tiny.gguf")


def test_a_catalogue_name_is_pulled_and_checked_against_its_digest(
    client: ollama.Client, hub: Hub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from warmstart.runtime.models import _catalogue as catalogue
    from warmstart.runtime.models import _installed as installed
    from warmstart.runtime.models import _manager as models

    data = tiny_model(tmp_path / "tiny.gguf").read_bytes() + bytes(1 << 20)
    sha = hub.add_hub_file(REPO, "tiny-q4.gguf", data)
    entries = catalogue.load_catalogue()
    base = entries["qwen2.5-0.5b"]
    entries["tiny"] = replace(
        base, name="tiny", repo=REPO, revision="main", file="tiny-q4.gguf", sha256=sha
    )
    for module in (models, installed):
        monkeypatch.setattr(module, "load_catalogue", lambda: entries)
    lines = list(client.pull("tiny:latest", stream=True))
    assert lines[-1].status == "success"
    assert {p.digest for p in lines if p.total} == {f"sha256:{sha}"}
    assert "tiny:latest" in {m.model for m in client.list().models}
    entries["tiny"] = replace(entries["tiny"], file="tiny-bad.gguf", sha256="0" * 64)
    hub.add_hub_file(REPO, "tiny-bad.gguf", data)
    with pytest.raises(ollama.ResponseError, match="is not the expected 0000"):
        client.pull("tiny")


def test_one_pull_of_a_name_at_a_time_and_a_left_pull_resumes(
    setup: Setup, hub: Hub, tmp_path: Path, client: ollama.Client
) -> None:
    data = tiny_model(tmp_path / "tiny.gguf").read_bytes() + bytes(3 << 20)
    hub.add_hub_file(REPO, "tiny.gguf", data)
    hub.stall_after = 1 << 20  # the first download hangs after 1 MiB
    body = {"model": f"hf:{REPO}/tiny.gguf"}
    with httpx.stream("POST", setup.url + "/api/pull", json=body, timeout=60) as first:
        lines = first.iter_lines()
        while "completed" not in json.loads(next(lines)):
            pass
        second = httpx.post(setup.url + "/api/pull", json=body, timeout=30).text.splitlines()
        assert len(second) == 1 and "being pulled already" in json.loads(second[0])["error"]
    hub.release.set()  # the hub lets the first connection go; its pull ends, cancelled
    deadline = time.monotonic() + 20
    while True:  # the first pull's name is released once it ended
        try:
            last = client.pull(body["model"])
            break
        except ollama.ResponseError as exc:
            assert "being pulled already" in str(exc) and time.monotonic() < deadline
            time.sleep(0.1)
    assert last.status == "success"
    assert hub.ranges[-1] is not None and hub.ranges[-1].startswith("bytes=")  # resumed


@pytest.mark.parametrize(
    "body,status,says",
    [
        ({"model": "no-such-model"}, 404, "no known model named 'no-such-model'"),
        ({"model": "hf:just-a-name"}, 400, "expected hf:OWNER/REPO/FILE.gguf"),
        ({"model": "https://example.com/x.gguf"}, 400, "model is not supported"),
        ({"model": "qwen2.5-0.5b", "insecure": True}, 400, "insecure is not supported"),
        ({"model": "qwen2.5-0.5b", "username": "me"}, 400, "username is not supported"),
        ({}, 400, "model is required"),
    ],
)
def test_pull_refusals(setup: Setup, body: dict[str, Any], status: int, says: str) -> None:
    reply = httpx.post(setup.url + "/api/pull", json=body, timeout=30)
    assert reply.status_code == status and says in reply.json()["error"], reply.text


def test_copy_then_delete(setup: Setup, client: ollama.Client) -> None:
    tiny_model(setup.models / "beta.gguf")
    assert client.copy("beta:latest", "gamma").status == "success"
    names = {m.model for m in client.list().models}
    assert {"beta:latest", "gamma:latest"} <= names
    assert client.delete("gamma").status == "success"
    assert "gamma:latest" not in {m.model for m in client.list().models}
    assert (setup.models / "beta.gguf").is_file()


@pytest.mark.parametrize(
    "body,status,code",
    [
        ({"source": "nope", "destination": "x"}, 404, None),
        ({"source": "beta", "destination": "alpha"}, 400, "exists"),
        ({"source": "beta", "destination": "qwen2.5-0.5b"}, 400, "exists"),
        ({"source": "beta", "destination": "../evil"}, 400, "not a model name"),
        ({"source": "beta", "destination": "a:b"}, 400, "not a model name"),
    ],
)
def test_copy_refusals(setup: Setup, body: dict[str, Any], status: int, code: str | None) -> None:
    tiny_model(setup.models / "beta.gguf")
    reply = httpx.post(setup.url + "/api/copy", json=body, timeout=30)
    assert reply.status_code == status, reply.text
    assert code is None or code in reply.json()["error"]


def test_delete_refuses_the_loaded_model_and_unknown_ones(setup: Setup) -> None:
    loaded = httpx.request("DELETE", setup.url + "/api/delete", json={"model": "alpha"})
    assert loaded.status_code == 400 and "is loaded" in loaded.json()["error"]
    assert (setup.models / "alpha.gguf").is_file()
    missing = httpx.request("DELETE", setup.url + "/api/delete", json={"model": "nope"})
    assert missing.status_code == 404


# tokenize ---------------------------------------------------------------------------------


def test_tokenize_and_detokenize_round_trip(setup: Setup) -> None:
    text = "Hello world, again"
    ids = httpx.post(setup.url + "/tokenize", json={"content": text}).json()["tokens"]
    assert len(ids) == 3
    assert httpx.post(setup.url + "/detokenize", json={"tokens": ids}).json() == {"content": text}
    pieces = httpx.post(setup.url + "/tokenize", json={"content": text, "with_pieces": True})
    assert pieces.json()["tokens"][1] == {"id": ids[1], "piece": " world,"}


@pytest.mark.parametrize(
    "path,body,param",
    [
        ("/detokenize", {"tokens": [123456]}, "tokens"),
        ("/detokenize", {"tokens": [-1]}, "tokens.0"),
        ("/tokenize", {"content": 5}, "content"),
        ("/tokenize", {"content": "x", "add_bos": True}, "add_bos"),
    ],
)
def test_tokenize_refusals(setup: Setup, path: str, body: dict[str, Any], param: str) -> None:
    reply = httpx.post(setup.url + path, json=body)
    assert reply.status_code == 400 and reply.json()["error"]["param"] == param, reply.text
