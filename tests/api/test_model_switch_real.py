"""Issue 14's acceptance for several models: the default model (SmolLM2-135M) and
Gemma-3-270M installed side by side, one server (the real app factory, served over
loopback), the official ``openai`` client alternating between them by name.

Each model's first reply comes from a freshly opened runtime with nothing cached:
its reply in isolation. After a switch away and back, the same request must give
the same reply (greedy) and find its own cache: the KV chunks of each model are
keyed by its fingerprint, and the runtime closed by the switch flushed them to disk.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from warmstart.runtime.api import create_app
from warmstart.runtime.serving._core import LocalRuntime
from warmstart.runtime.serving._factory import build_runtime

from tests.api.conftest import run_server
from tests.api.inproc import serving
from tests.conftest import SYSTEM, seed_calibration, seed_extra_buffer_verdicts, small_settings

pytestmark = pytest.mark.slow

SMOL, GEMMA = "smollm2-135m", "gemma-3-270m-q4_k_m"


def install(data_dir: Path, *paths: Path) -> Path:
    """The models directory of ``data_dir``, holding ``paths`` as a pull leaves them."""
    models = data_dir / "models"
    models.mkdir(parents=True)
    for path in paths:
        (models / path.name).symlink_to(path)
    return models


@pytest.fixture
def client(tmp_path: Path, model_path: Path, gemma_path: Path) -> Iterator[openai.OpenAI]:
    models = install(tmp_path, model_path, gemma_path)

    def opener(path: Path) -> LocalRuntime:
        return build_runtime(small_settings(tmp_path, path))

    first = opener(models / model_path.name)
    app = create_app(first.settings, first, opener)
    try:
        with (
            serving(app) as url,
            openai.OpenAI(base_url=url + "/v1", api_key="local", max_retries=0) as client,
        ):
            yield client
    finally:
        app.state.warmstart.close()


def ask(client: openai.OpenAI, model: str) -> tuple[str, int, dict[str, int]]:
    reply = client.chat.completions.create(
        model=model,
        messages=[
            {"role": "system", "content": SYSTEM.content},
            {"role": "user", "content": "What is the capital of France?"},
        ],
        temperature=0,
        max_tokens=8,
    )
    assert reply.model == model
    usage = reply.usage
    assert usage is not None and usage.prompt_tokens_details is not None
    cached = usage.prompt_tokens_details.cached_tokens or 0
    extra = reply.model_extra or {}
    return reply.choices[0].message.content or "", cached, extra["x_warmstart"]["restored"]


def test_alternating_models_by_name_get_their_own_replies_and_caches(
    client: openai.OpenAI,
) -> None:
    assert [m.id for m in client.models.list().data] == [SMOL, GEMMA]
    smol, smol_cached, _ = ask(client, SMOL)
    gemma, gemma_cached, _ = ask(client, GEMMA)
    assert smol_cached == 0 and gemma_cached == 0  # fresh: their replies in isolation
    assert smol != gemma
    assert "<|im_end|>" not in gemma and "<end_of_turn>" not in smol
    for model, alone in ((SMOL, smol), (GEMMA, gemma)):
        again, cached, restored = ask(client, model)
        assert again == alone, model
        assert cached > 0, model  # its own chunks, from disk (or RAM once prewarmed)
        assert restored["disk"] + restored["ram"] == cached, (model, restored)
    cards = {m.id: m.model_extra or {} for m in client.models.list().data}
    assert cards[GEMMA]["loaded"] and cards[GEMMA]["architecture"] == "gemma3"
    assert not cards[SMOL]["loaded"] and cards[SMOL]["n_ctx"] == 1024


def test_warmstart_serve_switches_through_its_factory(
    tmp_path: Path, model_path: Path, gemma_path: Path, calibration: Path
) -> None:
    """The real command: `warmstart serve` opens the other model through the factory
    (probe, calibration, policy), on the load route and on a request naming it. The
    default model starts on the run's calibration record; Gemma calibrates on its switch."""
    install(tmp_path, model_path, gemma_path)
    seed_extra_buffer_verdicts(tmp_path)
    seed_calibration(calibration, tmp_path)
    cmd = [sys.executable, "-m", "warmstart.runtime.cli", "serve", "--data-dir", str(tmp_path)]
    with run_server(cmd, "--prewarm-sessions", "0", start_timeout_s=180, log_dir=tmp_path) as srv:
        cards = httpx.get(srv.v1 + "/models").json()["data"]
        assert [(c["id"], c["loaded"]) for c in cards] == [(SMOL, True), (GEMMA, False)]
        load = httpx.post(srv.v1 + "/warmstart/models/load", json={"model": GEMMA}, timeout=180)
        assert load.status_code == 200 and load.json()["model"] == GEMMA, load.text
        assert httpx.get(srv.base_url + "/health").json()["model"] == GEMMA
        with openai.OpenAI(base_url=srv.v1, api_key="local", max_retries=0, timeout=180) as c:
            text, _, _ = ask(c, SMOL)  # a request naming the other switches back
            assert text
    log = srv.log()
    assert "Traceback" not in log and "ERROR" not in log, log
