"""`warmstart bench`: time to first token cold, from RAM and from disk in a fresh
process, side by side with llama-cpp-python's own LlamaRAMCache and LlamaDiskCache
on the same model, prompts and machine, in one run. Prints figures; asserts nothing.

This module runs the measurements in order and owns the child-process protocol: each
one that needs a fresh process runs in one (``python -m warmstart.runtime.bench._bench
--child KIND JSON``), printing one JSON line. What is measured lives beside it: the
prompts (`_workload`), warmstart's figures (`_ours`), llama-cpp-python's caches
(`_lcp`), a fresh `warmstart ask` (`_ask`), and the summary and its lines (`_report`).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from .._progress import Bar
from ..engine import LoaderChoice
from ..settings import Settings, load_settings
from ._ask import repeated_ask
from ._lcp import child_lcp
from ._ours import child_disk, run_ours
from ._report import render, summarize
from ._workload import conversation, system_prompt


# the child processes: one JSON payload in, one JSON line out --------------------------------
def _child(
    kind: str, payload: dict[str, Any], loader: LoaderChoice | None = None
) -> dict[str, Any]:
    # keep the caller's PYTHONPATH: an install with --target (make gpu-check) lives there
    paths = [str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
    if loader is not None:  # the loader verdict's environment (pinned staging)
        env = loader.child_env(env)
    proc = subprocess.run(
        [sys.executable, "-m", __name__, "--child", kind, json.dumps(payload)],
        capture_output=True,
        text=True,
        env=env,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"bench child {kind} failed:\n{proc.stderr[-3000:]}")
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def _main_child(kind: str, payload: dict[str, Any]) -> None:
    if kind == "disk":
        settings = load_settings(**{k: v for k, v in payload["settings"].items() if v is not None})
        out = child_disk(settings, payload["system"])
    else:
        out = child_lcp(
            Path(payload["model"]),
            Path(payload["cache_dir"]),
            payload["prompts"],
            payload["n_ctx"],
            payload["populate"],
            payload.get("extra_buffers", False),
            payload.get("n_gpu_layers", 0),
            payload.get("mmap"),
        )
    print(json.dumps(out))


# the run -------------------------------------------------------------------------------------
def du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def bench_settings(settings: Settings, work: Path, model: Path) -> Settings:
    data = settings.model_dump()
    data.update(data_dir=work / "ours", cache_dir=None, model=str(model), recalibrate=False)
    (work / "ours").mkdir(parents=True)
    # reuse this machine's calibration, extra-buffer and loader verdicts: keyed by machine
    # and model
    for name in ("calibration.json", "extra_buffers.json", "loader.json"):
        if (settings.data_dir / name).is_file():
            shutil.copy(settings.data_dir / name, work / "ours" / name)
    return load_settings(**{k: v for k, v in data.items() if v is not None})


def measure(settings: Settings, n_rules: int, n_conv: int) -> dict[str, Any]:
    from ..models import ModelManager

    model = ModelManager(settings.models_dir).resolve(settings.model)
    keep = os.environ.get("WARMSTART_BENCH_DIR")  # keep the work files, to look at them
    work = Path(keep) if keep else Path(tempfile.mkdtemp(prefix="warmstart-bench-"))
    try:
        ours_settings = bench_settings(settings, work, model)
        system = system_prompt(n_rules)
        with Bar("bench", n_conv + 8) as bar:
            return _measure(settings, ours_settings, system, n_conv, model, work, bar)
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)


def _measure(
    settings: Settings,
    ours_settings: Settings,
    system: str,
    n_conv: int,
    model: Path,
    work: Path,
    bar: Bar,
) -> dict[str, Any]:
    ours = run_ours(ours_settings, system, n_conv, bar)
    loader = LoaderChoice.from_dict(ours["loader"])
    bar.update(4 + n_conv, "a disk hit in a fresh process")
    disk = _child("disk", {"settings": ours_settings.model_dump(mode="json"), "system": system})
    from ..engine import ChatTemplate, LlamaModel

    # for its chat template only: nothing is decoded, nothing offloaded (read as proven)
    lm = LlamaModel(model, 0, mmap=loader.mmap)
    template = ChatTemplate(lm.chat_template(), "", "")
    lm.close()
    prompts = [template.render(conversation(system, i)) for i in (0, 1)]
    n_ctx = 4 * ours["cold"]["report"]["prompt_tokens"] + 512
    lcp_args = {
        "model": str(model),
        "cache_dir": str(work / "lcp"),
        "prompts": prompts,
        "n_ctx": n_ctx,
        # the comparison runs on the same machine: the same choices as ours
        "extra_buffers": ours["extra_buffers"],
        "n_gpu_layers": loader.n_gpu_layers,
        "mmap": loader.mmap,
    }
    bar.update(5 + n_conv, "llama-cpp-python's LlamaDiskCache, cold")
    lcp_cold = _child("lcp", {**lcp_args, "populate": True}, loader)
    bar.update(6 + n_conv, "llama-cpp-python's LlamaDiskCache, warm")
    lcp = _child("lcp", {**lcp_args, "populate": False}, loader)
    disk_bytes = du(work / "ours" / "cache")  # before the asks add their own chunks
    bar.update(7 + n_conv, "a repeated question, from process start")
    asks = repeated_ask(ours_settings)
    bar.update(8 + n_conv, "done")
    return summarize(ours, disk, lcp_cold, lcp, disk_bytes, du(work / "lcp"), asks)


def run_bench(
    settings: Settings, as_json: bool, quick: bool, system_tokens: int, conversations: int
) -> int:
    n_rules = max(2, (300 if quick else system_tokens) // 40)
    n_conv = 3 if quick else conversations
    result = measure(settings, n_rules, n_conv)
    print(json.dumps(result, indent=2) if as_json else render(result))
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        _main_child(sys.argv[2], json.loads(sys.argv[3]))
    else:
        sys.exit(
            "usage: python -m warmstart.runtime.bench._bench --child KIND JSON "
            "(use `warmstart bench`)"
        )
