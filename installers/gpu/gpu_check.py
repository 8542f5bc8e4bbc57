"""`make gpu-check`'s measurements, written as one JSON report.

Runs where warmstart and a (CUDA) llama-cpp-python are importable; installers/gpu/
check.sh prepares that on a machine without network. Sections:

- ``llama_cpp``: what the loaded library says it is (backends, GPU offload);
- ``gpu``: the hardware probe (NVML: name, VRAM, PCIe generation and width, the
  link's nominal GB/s); ``gpus`` is empty on a machine without one;
- ``copies``: host-to-device and device-to-host GB/s from pinned and pageable
  memory (torch as the ruler) and each as a fraction of the link; ``None``
  without torch and a CUDA device;
- ``model``: the synthetic GGUF (installers/gpu/synth_gguf.py) and how long it took;
- ``verdicts``: the extra-buffers and loader verdicts (engine._smoke, engine._loader)
  for it, found by their smoke children as the product finds them, in the data dir
  that every later section uses;
- ``loads``: the model loaded in a child each way, all layers offloaded or none, by
  llama-cpp-python's own ``Llama`` and by warmstart's loader, both as the verdicts
  say: exit status and the end of stderr (llama.cpp's log on);
- ``sweep``: restore against recompute over prefix lengths (``--sweep``), the
  threshold measured (the shortest length from which restoring wins) beside the
  policy's;
- ``equivalence``: greedy replies cold, from the live context and from the RAM pool
  against ``use_cache=False`` (``--equivalence``);
- ``batched_decode``: 2, 4 and 8 replies decoded in one batch against each decoded
  alone, every layer offloaded (runtime/engine/_decode_probe.py; ``--batched-decode``):
  whether each step's logits and KV are bit-identical, which is what decides whether a
  GPU build may decode replies together (docs/batched-decode.md);
- ``bench``: ``warmstart bench --json`` on it with every layer offloaded
  (cold, live, RAM-hit and disk-hit TTFT, restore GB/s, decode tok/s);
- ``serve``: ``warmstart serve --n-gpu-layers -1`` answering a chat completion over
  HTTP on loopback (``--serve``);
- ``seconds``: each phase; ``errors``: any section that failed, by name. The report
  is rewritten after every section, so a crash or a timeout keeps what came before.

    python installers/gpu/gpu_check.py --out report.json [--geometry llama-8b] [--no-bench]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # installers.gpu, run as a script

from installers.gpu.synth_gguf import GEOMETRIES, write

COPY_BYTES = 256 << 20  # large enough that fixed costs vanish at PCIe 5 speeds


def llama_cpp_section() -> dict[str, Any]:
    from warmstart.runtime.engine._build import llama_build_info

    return llama_build_info()


def gpu_section(cache_dir: Path) -> dict[str, Any]:
    from warmstart.runtime.hardware import probe

    profile = probe(cache_dir).to_dict()
    return {"gpus": profile["gpus"], "backend": profile["backend"], "notes": profile["notes"]}


def copies_section(gpu: dict[str, Any] | None, nbytes: int = COPY_BYTES) -> dict[str, Any] | None:
    from warmstart.runtime.hardware._measure import host_device_gbps

    rates = host_device_gbps(nbytes)
    if rates is None:
        return None
    gpus = (gpu or {}).get("gpus") or [{}]
    link = (gpus[0].get("pcie") or {}).get("gbps")
    out: dict[str, Any] = {f"{k}_gbps": v for k, v in rates.items()}
    out["bytes"] = nbytes
    out["link_gbps"] = link
    out["fraction_of_link"] = {k: v / link for k, v in rates.items()} if link else None
    return out


def model_section(path: Path, geometry: str) -> dict[str, Any]:
    g = GEOMETRIES[geometry]
    reused = path.is_file()  # written whole by an earlier step (diagnose.py)
    if not reused:
        write(path, g)
    return {
        "reused": reused,
        "path": str(path),
        "bytes": path.stat().st_size,
        "geometry": geometry,
        "n_layer": g.n_layer,
        "n_embd": g.n_embd,
        "kv_bytes_per_token_f16": g.kv_bytes_per_token(),
    }


def bench_section(model: Path, data_dir: Path, args: argparse.Namespace) -> dict[str, Any]:
    # -X faulthandler: a crash in native code still names the Python line that called it
    cmd = [sys.executable, "-X", "faulthandler", "-m", "warmstart.runtime.cli", "bench", "--json"]
    cmd += ["--model", str(model), "--data-dir", str(data_dir), "--n-gpu-layers", "-1"]
    cmd += ["--prewarm-sessions", "0"]
    if args.quick:
        cmd.append("--quick")
    else:
        cmd += ["--conversations", str(args.conversations)]
        cmd += ["--system-tokens", str(args.system_tokens)]
    code, out, err = run_or_dump(cmd, args.bench_timeout)
    if code != 0:
        raise RuntimeError(f"warmstart bench failed ({code}): {err[-12000:]}")
    return dict(json.loads(out))


# warmstart bench's own figures (runtime/bench/_ours.py) in a child: cold, live and RAM-pool
# TTFT, set-data and restore rates, decode speed, the threshold check. argv: MODEL DATA_DIR
# RULES CONVERSATIONS; prints the JSON of run_ours, then the settings it ran with
_OURS = """
import json, sys
from pathlib import Path
from warmstart.runtime._progress import Bar
from warmstart.runtime.bench._ours import run_ours
from warmstart.runtime.bench._workload import system_prompt
from warmstart.runtime.settings import load_settings
s = load_settings(model=sys.argv[1], data_dir=Path(sys.argv[2]), n_gpu_layers=-1,
                  prewarm_sessions=0)
system = system_prompt(int(sys.argv[3]))
with Bar("ours", int(sys.argv[4]) + 8) as bar:
    ours = run_ours(s, system, int(sys.argv[4]), bar)
print(json.dumps({"ours": ours, "settings": s.model_dump(mode="json"), "system": system}))
"""


def ours_section(model: Path, data_dir: Path, args: argparse.Namespace) -> dict[str, Any]:
    """The figures of ``warmstart bench`` that need no other program, each process under
    ``--ours-timeout`` (a hang names its line): run_ours in one child, then the disk hit
    of a fresh process in another, as bench times it."""
    rules = max(2, (300 if args.quick else args.system_tokens) // 40)
    n_conv = 3 if args.quick else args.conversations
    cmd = [sys.executable, "-X", "faulthandler", "-c", _OURS, str(model), str(data_dir)]
    code, out, err = run_or_dump([*cmd, str(rules), str(n_conv)], args.ours_timeout)
    if code != 0:
        raise RuntimeError(f"run_ours failed ({code}): {err[-12000:]}")
    got = json.loads(out.strip().splitlines()[-1])
    ours = got["ours"]
    result: dict[str, Any] = {
        "cold_ttft_s": ours["cold"]["ttft_s"],
        "live_ttft_s": ours["live"]["ttft_s"],
        "ram_ttft_s": ours["ram"]["ttft_s"],
        "prompt_tokens": ours["cold"]["report"]["prompt_tokens"],
        "ram_report": ours["ram"]["report"],
        "set_data_gbps": ours["set_data_gbps"],
        "kv_bytes_per_token": ours["kv_bytes_per_token"],
        **{k: v for k, v in ours.items() if k.startswith("decode_tok_s") or k == "one_step_s"},
        "threshold": ours["threshold"],
        "tuning": {k: v["value"] for k, v in ours["tuning"].items()},
    }
    ram = ours["ram"]["report"]
    restored = ram["restored"]["ram"] * ours["kv_bytes_per_token"]
    result["restore_gbps"] = restored / max(ram["restore_ms"], 1e-6) / 1e6
    payload = json.dumps({"settings": got["settings"], "system": got["system"]})
    disk_cmd = [sys.executable, "-X", "faulthandler", "-m", "warmstart.runtime.bench._bench"]
    code, out, err = run_or_dump([*disk_cmd, "--child", "disk", payload], args.ours_timeout)
    if code != 0:
        result["disk_error"] = err[-12000:]
        return result
    disk = json.loads(out.strip().splitlines()[-1])
    result["disk_ttft_s"] = disk["ttft_s"]
    result["disk_report"] = disk["report"]
    result["greedy_same_reply"] = ours["cold"]["text"] == ours["ram"]["text"] == disk["text"]
    return result


def _py_spy() -> str | None:
    """py-spy: on PATH, beside this Python, or installed with ``pip --target`` beside
    these packages (``<target>/bin``)."""
    import shutil

    places = [Path(sys.executable).parent, *(Path(p) / "bin" for p in sys.path if p)]
    found = shutil.which("py-spy") or next(
        (str(d / "py-spy") for d in places if (d / "py-spy").is_file()), None
    )
    return found


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants, parents first (from /proc; Linux only)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    order, todo = [], [pid]
    while todo:
        order.append(todo.pop(0))
        todo += children.get(order[-1], [])
    return order


def run_or_dump(cmd: list[str], timeout: float) -> tuple[int | None, str, str]:
    """(exit status or None on a timeout, stdout, stderr) of ``cmd``. When it runs past
    ``timeout``, the Python stacks of it and every process it started (py-spy, where it
    is) are appended to stderr before the whole process group is killed: a hang names
    the line it hangs on."""
    import signal

    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, start_new_session=True)
        try:
            code: int | None = proc.wait(timeout=timeout)
            dumps = ""
        except subprocess.TimeoutExpired:
            code, spy = None, _py_spy()
            dumps = f"\n[timed out after {timeout:.0f} s]\n"
            for pid in _tree(proc.pid):
                if spy is None:
                    dumps += "[no py-spy here: no stacks]\n"
                    break
                try:
                    dump = subprocess.run(
                        [spy, "dump", "--pid", str(pid)], capture_output=True, text=True,
                        timeout=30,
                    )  # fmt: skip
                    dumps += f"[py-spy dump --pid {pid}]\n{dump.stdout}{dump.stderr}\n"
                except (OSError, subprocess.TimeoutExpired) as exc:
                    dumps += f"[py-spy dump --pid {pid}: {exc}]\n"
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        out.seek(0)
        err.seek(0)
        text = err.read().decode("utf-8", "replace") + dumps
        return code, out.read().decode("utf-8", "replace"), text


# each load in a child: a segfault ends the child, not the report; argv: MODEL LAYERS
# MMAP (None/True/False) EXTRA_BUFFERS (True/False)
_LOADERS = {
    "llama_cpp": "import llama_cpp, sys; from warmstart.runtime.bench import _lcp; "
    "sys.argv[4] == 'True' or _lcp._without_extra_buffers(); "
    "llama_cpp.Llama(sys.argv[1], n_gpu_layers=int(sys.argv[2]), "
    "use_mmap=sys.argv[3] != 'False', n_ctx=512, verbose=True)",
    "warmstart": "import sys; from pathlib import Path; from warmstart.runtime.engine._llama import"
    " LlamaModel; LlamaModel(Path(sys.argv[1]), int(sys.argv[2]), extra_buffers=sys.argv[4] == "
    "'True', mmap={'None': None, 'True': True, 'False': False}[sys.argv[3]])",
}


def verdicts_section(model: Path, data_dir: Path, n_gpu_layers: int = -1) -> dict[str, Any]:
    """The product's own verdicts for ``model``, cached in ``data_dir`` for the rest."""
    from warmstart.runtime.engine._loader import choose_loader, gpu_offload_supported
    from warmstart.runtime.engine._smoke import choose_extra_buffers
    from warmstart.runtime.models._manager import DigestCache

    data_dir.mkdir(parents=True, exist_ok=True)
    digest = DigestCache(data_dir / "digests.json").digest(model)
    extra = choose_extra_buffers("auto", model, digest, data_dir / "extra_buffers.json")
    loader = choose_loader(
        mmap="auto",
        pinned="auto",
        n_gpu_layers=n_gpu_layers,
        model=model,
        digest=digest,
        extra_buffers=extra.enabled,
        cache_file=data_dir / "loader.json",
        gpu_offload=gpu_offload_supported(),
    )
    return {"extra_buffers": extra.to_dict(), "loader": loader.to_dict()}


def loads_section(
    model: Path, verdicts: dict[str, Any] | None, timeout: float = 120.0
) -> dict[str, Any]:
    from warmstart.runtime.engine._loader import AS_SET, LoaderChoice

    loader = LoaderChoice.from_dict(verdicts["loader"]) if verdicts else AS_SET
    extra = bool(verdicts and verdicts["extra_buffers"]["enabled"])
    out: dict[str, Any] = {}
    for name, code in _LOADERS.items():
        for layers in (loader.n_gpu_layers, 0):
            cmd = [sys.executable, "-X", "faulthandler", "-c", code, str(model), str(layers)]
            cmd += [str(loader.mmap), str(extra)]
            t0 = time.perf_counter()
            proc = subprocess.run(
                cmd, capture_output=True, text=True, timeout=timeout, env=loader.child_env()
            )
            out[f"{name}_gpu_layers_{layers}"] = {
                "returncode": proc.returncode,
                "seconds": round(time.perf_counter() - t0, 3),
                "stderr_tail": proc.stderr[-4000:],
            }
    return out


def _runtime(model: Path, data_dir: Path, **settings: Any) -> Any:
    from warmstart.runtime.serving._factory import open_runtime
    from warmstart.runtime.settings import load_settings

    s = load_settings(model=str(model), data_dir=data_dir, prewarm_sessions=0, **settings)
    return open_runtime(s, prewarm=False)


def sweep_section(model: Path, data_dir: Path, lengths: tuple[int, ...]) -> dict[str, Any]:
    """Restore and recompute timed at each prefix length, fully offloaded."""
    from warmstart.runtime.bench import _ours as bench

    rt = _runtime(model, data_dir, n_ctx=max(lengths) + 256, resident_sequences=2)
    try:
        check = bench.threshold_check(rt, lengths)
        policy = rt.tuning.report()["swap_in_threshold_tokens"]
    finally:
        rt.close()
    rows = sorted((int(n), r["restore_ms"] < r["recompute_ms"]) for n, r in check["sweep"].items())
    measured = None
    for i, (n, _) in enumerate(rows):  # the shortest length from which restoring always wins
        if all(wins for _, wins in rows[i:]):
            measured = n
            break
    return {
        **check,
        "policy_threshold_tokens": policy["value"],
        "policy_reason": policy["reason"],
        "measured_threshold_tokens": measured,
        # restoring already won at the shortest length timed: the true one is lower
        "measured_below_sweep": measured is not None and measured == rows[0][0],
    }


EQUIVALENCE_SET = (
    ("What is the capital of France? Tell me one fact about it.",),
    ("Name three primary colors and say why they are called primary.",),
    ("Hello.", "Hello! How can I help?", "Count from one to five."),
)


def equivalence_section(model: Path, data_dir: Path, max_tokens: int = 24) -> dict[str, Any]:
    """Greedy replies cold, live and from the RAM pool against no cache at all."""
    from dataclasses import replace

    from warmstart.runtime.types import Message, Request, Sampling

    rt = _runtime(model, data_dir)
    rows: dict[str, dict[str, str]] = {}
    try:
        for turns in EQUIVALENCE_SET:
            roles = ("user", "assistant")
            messages = tuple(Message(roles[i % 2], t) for i, t in enumerate(turns))
            req = Request(messages=messages, sampling=Sampling(max_tokens=max_tokens))
            row = {"no_cache": rt.generate(replace(req, use_cache=False)).text()[0]}
            row["cold"] = rt.generate(req).text()[0]
            rt.wait_idle()
            row["live"] = rt.generate(req).text()[0]
            rt.wait_idle()
            rt.evict_live()
            row["ram"] = rt.generate(req).text()[0]
            rt.wait_idle()
            rows[turns[-1]] = row
    finally:
        rt.close()
    same = all(len(set(row.values())) == 1 for row in rows.values())
    return {"all_equal": same, "replies": rows}


def batched_decode_section(model: Path, steps: int = 64) -> dict[str, Any]:
    """The decode probe with every layer on the GPU: per batch size, identical or
    where it first differs, and the most replies proven exact (0: none)."""
    from warmstart.runtime.engine._decode_probe import probe_decode, proven
    from warmstart.runtime.engine._llama import ContextConfig, LlamaModel

    loaded = LlamaModel(model, n_gpu_layers=-1)
    try:
        config = ContextConfig(n_ctx=0, n_seq_max=1, swa_full=loaded.n_swa > 0)
        checks = probe_decode(loaded, config, steps=steps)
    finally:
        loaded.close()
    most, note = proven(checks)
    return {"proven": most, "note": note, "checks": [c.describe() for c in checks]}


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _get(url: str, timeout: float) -> bool:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def serve_section(model: Path, data_dir: Path, timeout: float = 180.0) -> dict[str, Any]:
    """``warmstart serve --n-gpu-layers -1`` answers a chat completion over HTTP."""
    import urllib.request

    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-X", "faulthandler", "-m", "warmstart.runtime.cli", "serve"]
    cmd += ["--model", str(model), "--data-dir", str(data_dir), "--n-gpu-layers", "-1"]
    cmd += ["--port", str(port), "--prewarm-sessions", "0"]
    log = data_dir / "serve.log"
    data_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with log.open("wb") as sink:
        proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT)
    try:
        while not _get(f"{base}/health", 2.0):
            if proc.poll() is not None or time.perf_counter() - t0 > timeout:
                tail = log.read_text(errors="replace")[-3000:]
                raise RuntimeError(f"warmstart serve not ready ({proc.poll()}): {tail}")
            time.sleep(0.5)
        ready = time.perf_counter() - t0
        body = {"model": model.stem, "max_tokens": 8, "temperature": 0}
        body["messages"] = [{"role": "user", "content": "Say hello."}]
        req = urllib.request.Request(
            f"{base}/v1/chat/completions",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        t1 = time.perf_counter()
        with urllib.request.urlopen(req, timeout=120) as resp:
            answer = json.loads(resp.read())
            status = resp.status
        return {
            "status": status,
            "reply": answer["choices"][0]["message"]["content"],
            "usage": answer.get("usage"),
            "ready_s": round(ready, 3),
            "request_s": round(time.perf_counter() - t1, 3),
        }
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def run(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(args.work or tempfile.mkdtemp(prefix="warmstart-gpu-check-"))
    report: dict[str, Any] = {
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "seconds": {} if args.install_seconds is None else {"install": args.install_seconds},
        "errors": {},
    }

    def section(name: str, fn: Callable[[], Any]) -> Any:
        t0 = time.perf_counter()
        try:
            report[name] = fn()
        except Exception as exc:  # one failed section must not lose the others
            report[name] = None
            report["errors"][name] = "".join(traceback.format_exception_only(exc)).strip()
        report["seconds"][name] = round(time.perf_counter() - t0, 3)
        write_report(args.out, report)  # a crash in a later section keeps this one
        return report[name]

    section("llama_cpp", llama_cpp_section)
    gpu = section("gpu", lambda: gpu_section(work / "data" / "cache"))
    section("copies", lambda: copies_section(gpu))
    name = args.model.stem if args.model else args.geometry
    model = args.model or work / f"synthetic-{args.geometry}.gguf"
    if args.model:
        report["model"] = {"path": str(model), "bytes": model.stat().st_size, "geometry": None}
    else:
        section("model", lambda: model_section(model, args.geometry))
    data = work / f"data-{name}"
    have_model = report["model"] is not None
    verdicts = section("verdicts", lambda: verdicts_section(model, data)) if have_model else None
    # the equivalence first (short, and it calibrates the data dir that bench and the
    # sweep then reuse), the figures next, the checks last: a timeout loses the least
    for key, wanted, fn in (
        ("equivalence", args.equivalence, lambda: equivalence_section(model, data)),
        ("batched_decode", args.batched_decode, lambda: batched_decode_section(model)),
        ("ours", args.ours, lambda: ours_section(model, data, args)),
        ("bench", args.bench, lambda: bench_section(model, data, args)),
        ("sweep", args.sweep, lambda: sweep_section(model, data, tuple(args.sweep))),
        ("serve", args.serve, lambda: serve_section(model, data / "serve")),
        ("loads", args.loads, lambda: loads_section(model, verdicts)),
    ):
        if wanted and have_model:
            section(key, fn)
        else:
            report[key] = None
    write_report(args.out, report)
    return report


def write_report(out: Path, report: dict[str, Any]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, out)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="where the JSON report goes")
    p.add_argument("--work", type=Path, default=None, help="model and data dir (default: temp)")
    p.add_argument("--geometry", choices=sorted(GEOMETRIES), default="llama-8b")
    p.add_argument("--model", type=Path, default=None, help="a GGUF instead of a synthetic one")
    p.add_argument(
        "--sweep",
        type=lambda v: [int(n) for n in v.split(",")],
        default=None,
        help="prefix lengths to time restore against recompute at (comma-separated)",
    )
    p.add_argument("--equivalence", action="store_true", help="greedy replies vs no cache")
    p.add_argument("--serve", action="store_true", help="warmstart serve answers over HTTP")
    p.add_argument(
        "--batched-decode", action="store_true", help="replies decoded together vs each alone"
    )
    p.add_argument("--no-bench", dest="bench", action="store_false")
    p.add_argument("--ours", action="store_true", help="bench's own figures, child by child")
    p.add_argument("--ours-timeout", type=float, default=150.0, help="for each of its children")
    p.add_argument("--quick", action="store_true", help="bench's small workload")
    p.add_argument("--no-loads", dest="loads", action="store_false", help="skip the load children")
    p.add_argument("--conversations", type=int, default=6)
    p.add_argument("--system-tokens", type=int, default=2000)
    p.add_argument("--bench-timeout", type=float, default=420.0)
    p.add_argument("--install-seconds", type=float, default=None, help="(from check.sh)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    report = run(args)
    print(json.dumps(report, indent=2))
    return 1 if report["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
