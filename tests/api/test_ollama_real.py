"""The Ollama dialect and the embeddings on the real default model (SmolLM2-135M).

One real ``warmstart serve`` with an API key, driven by Ollama's own client (chat,
generate, list, show), by the official ``openai`` client (/v1/embeddings) and by
raw HTTP where a client cannot show a field (the cache report) or a header (Host).
"""

from __future__ import annotations

import base64
import struct
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import ollama
import openai
import pytest

from tests.api.conftest import Server
from tests.api.real import real_server

pytestmark = pytest.mark.slow

KEY = "ollama-real-key-0123456789"
AUTH = {"Authorization": f"Bearer {KEY}"}
GREEDY = {"temperature": 0, "num_predict": 16}


@pytest.fixture(scope="module")
def served(
    model_path: Path, calibration: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    data_dir = tmp_path_factory.mktemp("ollama-real")
    with real_server(model_path, data_dir, "--api-key", KEY, calibration=calibration) as server:
        yield server


@pytest.fixture
def client(served: Server) -> Iterator[ollama.Client]:
    with ollama.Client(host=served.base_url, headers=AUTH, timeout=120) as c:
        yield c


def _chat(topic: str) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": "You are a helpful assistant. Answer in one sentence."},
        {"role": "user", "content": f"What is {topic}?"},
    ]


def test_chat_whole_and_streamed(client: ollama.Client) -> None:
    messages = _chat("the capital of Italy")
    whole = client.chat(model="default", messages=messages, options=GREEDY)
    assert whole.done and whole.message.content
    assert whole.prompt_eval_count and whole.eval_count and whole.eval_count <= 16
    assert whole.eval_duration is not None and whole.prompt_eval_duration is not None
    parts = list(client.chat(model="default", messages=messages, options=GREEDY, stream=True))
    assert len(parts) > 2 and parts[-1].done and not parts[0].done
    assert "".join(p.message.content or "" for p in parts) == whole.message.content


def test_generate(client: ollama.Client) -> None:
    reply = client.generate(model="default", prompt="Name a fruit that is red.", options=GREEDY)
    assert reply.done and reply.response
    parts = list(
        client.generate(
            model="default", prompt="Name a fruit that is red.", options=GREEDY, stream=True
        )
    )
    assert "".join(p.response or "" for p in parts) == reply.response


def test_format_holds_the_reply_to_a_schema(client: ollama.Client) -> None:
    """format (a JSON schema) with the sampler options /v1 has: the reply parses and
    has the schema's shape, from Ollama's own client."""
    import json

    import jsonschema

    schema = {
        "type": "object",
        "properties": {"city": {"type": "string"}, "sunny": {"type": "boolean"}},
        "required": ["city", "sunny"],
        "additionalProperties": False,
    }
    reply = client.chat(
        model="default",
        messages=[
            {"role": "system", "content": 'Answer in JSON, e.g. {"city": "Rome", "sunny": true}'},
            {"role": "user", "content": "Is it sunny in Paris?"},
        ],
        format=schema,
        options={"temperature": 0, "num_predict": 96, "top_k": 20, "repeat_penalty": 1.1},
    )
    jsonschema.validate(json.loads(reply.message.content), schema)


def test_list_and_show(client: ollama.Client) -> None:
    models = client.list().models
    assert len(models) == 1
    entry = models[0]
    assert entry.model and entry.size and entry.size > 50_000_000
    assert entry.digest and len(entry.digest) == 64
    assert entry.details is not None and entry.details.family == "llama"
    assert entry.details.quantization_level == "Q4_1"
    shown = client.show(entry.model)
    assert shown.template and "im_start" in shown.template  # the GGUF's own chat template
    assert shown.modelinfo is not None and shown.modelinfo["llama.context_length"] == 8192
    assert shown.details is not None and shown.details.parameter_size.endswith("M")


def test_repeat_chat_reports_cached_tokens(served: Server) -> None:
    unique = f"Notes {uuid.uuid4()}: " + "tides follow the moon. " * 30
    body = {
        "model": "default",
        "messages": [{"role": "system", "content": unique}, {"role": "user", "content": "Why?"}],
        "stream": False,
        "options": GREEDY,
    }
    url = served.base_url + "/api/chat"
    first = httpx.post(url, json=body, headers=AUTH, timeout=120).json()
    second = httpx.post(url, json=body, headers=AUTH, timeout=120).json()
    assert first["message"]["content"] == second["message"]["content"]
    assert second["cached_tokens"] > 0
    assert second["cached_tokens"] == second["x_warmstart"]["cached_tokens"]
    assert second["prompt_eval_count"] == first["prompt_eval_count"]


def test_key_and_host_rules(served: Server) -> None:
    with ollama.Client(host=served.base_url, timeout=30) as bare:
        with pytest.raises(ollama.ResponseError) as refused:
            bare.chat(model="default", messages=_chat("x"))
        assert refused.value.status_code == 401
    rebound = httpx.post(
        served.base_url + "/api/chat",
        headers={**AUTH, "Host": "evil.example"},
        json={"messages": _chat("x")},
    )
    assert rebound.status_code == 403


@pytest.fixture
def openai_client(served: Server) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=served.v1, api_key=KEY, max_retries=0, timeout=120) as c:
        yield c


def test_embeddings_with_the_openai_client(openai_client: openai.OpenAI) -> None:
    texts = ["The cat sat on the mat.", "The cat sat on the mat.", "Stock prices fell today."]
    reply = openai_client.embeddings.create(model="default", input=texts)  # base64 on the wire
    a, b, c = (d.embedding for d in reply.data)
    assert [d.index for d in reply.data] == [0, 1, 2]
    assert a == b and a != c
    assert abs(sum(x * x for x in a) - 1.0) < 1e-4  # unit length (float32 on the wire)
    assert reply.usage.prompt_tokens > 0 and reply.usage.total_tokens == reply.usage.prompt_tokens
    single = openai_client.embeddings.create(
        model="default", input="Stock prices fell today.", encoding_format="float"
    )
    assert single.data[0].embedding == pytest.approx(c, abs=1e-6)


def test_base64_decodes_to_the_float_list(served: Server) -> None:
    url = served.v1 + "/embeddings"
    text = "Bees make honey."
    as_float = httpx.post(url, headers=AUTH, json={"input": text}, timeout=120).json()
    as_b64 = httpx.post(
        url, headers=AUTH, json={"input": [text], "encoding_format": "base64"}, timeout=120
    ).json()
    raw = base64.b64decode(as_b64["data"][0]["embedding"])
    decoded = struct.unpack(f"<{len(raw) // 4}f", raw)
    assert decoded == pytest.approx(as_float["data"][0]["embedding"], abs=1e-6)
    assert len(decoded) == 576  # SmolLM2-135M's embedding size


def test_embeddings_leave_the_chat_cache_alone(served: Server, client: ollama.Client) -> None:
    """A conversation's cached prefix survives embedding requests in between."""
    unique = f"Log {uuid.uuid4()}: " + "rivers run to the sea. " * 30
    messages = [{"role": "system", "content": unique}, {"role": "user", "content": "Where?"}]
    body = {"model": "default", "messages": messages, "stream": False, "options": GREEDY}
    url = served.base_url + "/api/chat"
    first = httpx.post(url, json=body, headers=AUTH, timeout=120).json()
    assert client.embed(model="default", input=[unique, "another text"]).embeddings
    second = httpx.post(url, json=body, headers=AUTH, timeout=120).json()
    assert second["message"]["content"] == first["message"]["content"]
    assert second["cached_tokens"] > 0


def test_unsupported_embedding_fields_are_refused(openai_client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        openai_client.embeddings.create(model="default", input="x", dimensions=8)
    assert refused.value.body["param"] == "dimensions"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError):
        openai_client.embeddings.create(model="default", input="")
