"""The GPU check's CPU-testable parts: the synthetic model loads and answers through
llama.cpp on the CPU, and the report has its shape with the GPU parts absent."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from dataclasses import replace
from pathlib import Path

import pytest

from installers.gpu import gpu_check, synth_gguf
from tests.conftest import chat, small_settings

REPORT_KEYS = {
    "started_at", "python", "machine", "cpus", "seconds", "errors",
    "llama_cpp", "gpu", "copies", "model", "verdicts", "loads", "sweep", "equivalence",
    "batched_decode", "ours", "bench", "serve",
}  # fmt: skip
ROOT = Path(__file__).resolve().parents[2]


pytestmark = pytest.mark.usefixtures("clean_settings")


def test_the_8b_geometry_is_llama_3_8b() -> None:
    g = synth_gguf.GEOMETRIES["llama-8b"]
    assert (g.n_layer, g.n_embd, g.n_head, g.n_head_kv, g.n_ff) == (32, 4096, 32, 8, 14336)
    assert g.kv_bytes_per_token() == 131072  # 128 KiB of f16 KV per token


def test_one_layer_of_the_8b_geometry_loads_with_its_shapes(tmp_path: Path) -> None:
    from warmstart.runtime.engine._llama import LlamaModel

    # (its 128,256-token vocabulary left out: a gigabyte of embeddings for nothing here)
    one = replace(synth_gguf.GEOMETRIES["llama-8b"], n_layer=1, n_vocab=0)
    model = LlamaModel(synth_gguf.write(tmp_path / "8b-1.gguf", one))
    try:
        assert (model.n_embd, model.n_head, model.n_head_kv, model.n_layer) == (4096, 32, 8, 1)
        assert model.n_vocab == 262 and model.chat_template() == synth_gguf.CHAT_TEMPLATE
        # every text tokenizes: byte fallback, <s> first
        assert model.tokenize("Hi é", add_special=True)[:3] == [1, 3 + 0xE2, 3 + 0x96]
    finally:
        model.close()


def test_the_tiny_synthetic_model_answers_on_the_cpu(tmp_path: Path) -> None:
    from warmstart.runtime.serving._factory import build_runtime

    path = synth_gguf.write(tmp_path / "tiny.gguf", synth_gguf.GEOMETRIES["tiny"])
    settings = small_settings(tmp_path / "data", path, n_ctx=512, extra_buffers="off")
    with build_runtime(settings) as rt:
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
    assert report["sweep"] is None and report["equivalence"] is None  # not asked for
    # the product's verdicts, found by its own smoke children: a CPU build offloads nothing
    assert "nothing to prove" in report["verdicts"]["loader"]["reason"]
    assert set(report["verdicts"]["extra_buffers"]) == {"enabled", "reason"}
    # llama-cpp-python's loader and ours, offloaded or not, each in its own child
    assert len(report["loads"]) == 4
    assert all(load["returncode"] == 0 for load in report["loads"].values()), report["loads"]


def test_the_sweep_the_equivalence_and_serve_on_the_cpu(tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    gpu_check.main(["--out", str(out), "--work", str(tmp_path), "--geometry", "tiny", "--no-bench",
                    "--no-loads", "--sweep", "16,64,256", "--equivalence", "--serve"])  # fmt: skip
    report = json.loads(out.read_text())
    assert not report["errors"], report["errors"]
    sweep = report["sweep"]
    assert {"16", "64", "256"} <= set(sweep["sweep"])
    assert sweep["policy_threshold_tokens"] >= 1 and sweep["policy_reason"]
    measured = sweep["measured_threshold_tokens"]
    assert measured is None or str(measured) in sweep["sweep"]
    eq = report["equivalence"]
    assert len(eq["replies"]) == len(gpu_check.EQUIVALENCE_SET)
    assert eq["all_equal"], eq["replies"]  # greedy: the cache changes nothing
    assert all(set(row) == {"no_cache", "cold", "live", "ram"} for row in eq["replies"].values())
    served = report["serve"]
    assert served["status"] == 200 and served["usage"]["completion_tokens"] > 0


def test_the_scripts_parse() -> None:
    for name in ("carry.sh", "install.sh", "device_run.sh", "build_wheel.sh"):
        proc = subprocess.run(["bash", "-n", str(ROOT / "installers" / "gpu" / name)])
        assert proc.returncode == 0, name


@pytest.mark.slow
def test_the_one_device_call_runs_here_on_the_cpu(tmp_path: Path) -> None:
    """device_run.sh --cpu: every step the GPU call makes, on the CPU build and tiny
    models, each leaving its files in OUT, and the summary with the GPU parts absent."""
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "GPU_CHECK_WORK": str(tmp_path / "work")}
    env["PYTHON"] = sys.executable
    back = tmp_path / "back"  # the device tool's $OUT: at most 8 files come back from it
    back.mkdir()
    env["GPU_CHECK_PACK"] = str(back / "gpu-check.tgz")
    script = ROOT / "installers" / "gpu" / "device_run.sh"
    proc = subprocess.run(["bash", str(script), "--cpu"], env=env, capture_output=True,
                          text=True, timeout=900)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    steps = [row.split("\t") for row in (out / "steps.tsv").read_text().splitlines()]
    names = ["facts", "diagnose", "figures-small", "figures-big", "bench-small"]
    assert [s[0] for s in steps] == names
    assert all(s[1] == "0" for s in steps), steps
    assert json.loads((out / "diagnosis" / "diagnosis.json").read_text())["cases"]
    big = json.loads((out / "gpu-check-big.json").read_text())
    assert not big["errors"] and big["ours"]["cold_ttft_s"] > 0 and big["sweep"]["sweep"]
    assert big["ours"]["greedy_same_reply"] and big["ours"]["disk_ttft_s"] > 0
    whole = json.loads((out / "gpu-check-bench.json").read_text())
    assert not whole["errors"] and whole["bench"]["process_start_to_first_token_s"] > 0
    summary = (out / "summary.md").read_text()
    assert "## Diagnosis" in summary and "| big_gpu_all | ok |" in summary
    assert "| pinned host-to-device GB/s | - |" in summary  # no GPU here: absent, not guessed
    assert "| greedy cold = live = RAM = no cache | True |" in summary
    assert "| `warmstart serve --n-gpu-layers -1` HTTP status | 200 |" in summary
    assert proc.stdout.startswith("# make gpu-check")
    # everything packed into one file, the summary beside it
    assert sorted(p.name for p in back.iterdir()) == ["gpu-check.tgz", "summary.md"]
    with tarfile.open(back / "gpu-check.tgz") as packed:
        names = set(packed.getnames())
    assert {"./summary.md", "./steps.tsv", "./diagnosis/diagnosis.json"} <= names
    assert (back / "summary.md").read_text() == summary


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


def test_a_child_that_hangs_is_killed_with_the_stacks_of_its_whole_tree() -> None:
    """gpu_check's steps run children (bench, serve) that spawn more: a hang names the
    line each process waits on (py-spy, a dev dependency) instead of a bare timeout."""
    child = "import time\ndef waits_here():\n    print(1, flush=True)\n    time.sleep(60)\n"
    child += "waits_here()\n"
    parent = (  # says "started" once its child is in waits_here
        "import subprocess, sys, time\n"
        f"child = subprocess.Popen([sys.executable, '-c', {child!r}], stdout=subprocess.PIPE)\n"
        "child.stdout.readline()\n"
        "print('started', flush=True)\n"
        "time.sleep(60)\n"
    )
    code, out, err = gpu_check.run_or_dump([sys.executable, "-c", parent], 8.0)
    assert code is None and out == "started\n"
    assert "[timed out after 8 s]" in err
    assert err.count("[py-spy dump --pid") == 2 and "waits_here (<string>:4)" in err
    code, out, err = gpu_check.run_or_dump([sys.executable, "-c", "print('done')"], 30.0)
    assert (code, out, err) == (0, "done\n", "")
