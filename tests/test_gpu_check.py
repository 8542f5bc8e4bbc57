"""The GPU check's CPU-testable parts: the synthetic model loads and answers through
llama.cpp on the CPU, and the report has its shape with the GPU parts absent."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from installers.gpu import gpu_check, synth_gguf
from tests.conftest import chat, small_settings

REPORT_KEYS = {
    "started_at", "python", "machine", "cpus", "seconds", "errors",
    "llama_cpp", "gpu", "copies", "model", "loads", "bench",
}  # fmt: skip


pytestmark = pytest.mark.usefixtures("clean_settings")


def test_the_8b_geometry_is_llama_3_8b() -> None:
    g = synth_gguf.GEOMETRIES["llama-8b"]
    assert (g.n_layer, g.n_embd, g.n_head, g.n_head_kv, g.n_ff) == (32, 4096, 32, 8, 14336)
    assert g.kv_bytes_per_token() == 131072  # 128 KiB of f16 KV per token


def test_one_layer_of_the_8b_geometry_loads_with_its_shapes(tmp_path: Path) -> None:
    from warmstart.runtime.engine._llama import LlamaModel

    one = replace(synth_gguf.GEOMETRIES["llama-8b"], n_layer=1)
    model = LlamaModel(synth_gguf.write(tmp_path / "8b-1.gguf", one))
    try:
        assert (model.n_embd, model.n_head, model.n_head_kv, model.n_layer) == (4096, 32, 8, 1)
        assert model.n_vocab == 259 and model.chat_template() == synth_gguf.CHAT_TEMPLATE
        # every text tokenizes: byte fallback, <s> first
        assert model.tokenize("Hi é", add_special=True)[:3] == [1, 3 + 0xE2, 3 + 0x96]
    finally:
        model.close()


def test_the_tiny_synthetic_model_answers_on_the_cpu(tmp_path: Path) -> None:
    from warmstart.runtime.core import LocalRuntime

    path = synth_gguf.write(tmp_path / "tiny.gguf", synth_gguf.GEOMETRIES["tiny"])
    settings = small_settings(tmp_path / "data", path, n_ctx=512, extra_buffers="off")
    with LocalRuntime(settings) as rt:
        request = chat("Say something.", max_tokens=6)
        _, first = rt.generate(request).text()
        _, again = rt.generate(request).text()
    assert first.prompt_tokens > 0  # random weights: any reply, even none, will do
    assert again.restored["live"] + again.restored["ram"] > 0  # the cache works on it too


def test_the_report_without_a_gpu(tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    code = gpu_check.main(["--out", str(out), "--work", str(tmp_path), "--geometry", "tiny",
                           "--no-bench"])  # fmt: skip
    report = json.loads(out.read_text())
    assert code == 0 and not report["errors"] and set(report) == REPORT_KEYS
    assert "CPU" in report["llama_cpp"]["backends"]
    if not report["gpu"]["gpus"]:  # this machine: the GPU parts are absent, not failed
        assert report["copies"] is None
    assert report["model"]["geometry"] == "tiny" and report["model"]["bytes"] > 0
    assert report["bench"] is None and set(report["seconds"]) >= {"gpu", "copies", "model"}
    # llama-cpp-python's loader and ours, offloaded or not, each in its own child
    assert len(report["loads"]) == 4
    assert all(load["returncode"] == 0 for load in report["loads"].values()), report["loads"]


@pytest.mark.slow
def test_the_report_with_the_bench(tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    gpu_check.main(["--out", str(out), "--work", str(tmp_path), "--geometry", "tiny", "--quick"])
    report = json.loads(out.read_text())
    assert not report["errors"], report["errors"]
    bench = report["bench"]
    for key in ("cold_ttft_s", "ram_ttft_s", "disk_ttft_s", "restore_gbps",
                "process_start_to_first_token_s", "extra_buffers"):  # fmt: skip
        assert key in bench, key
    assert bench["disk_restored_tokens"] > 0
