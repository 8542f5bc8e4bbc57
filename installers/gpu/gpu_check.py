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
- ``loads``: the model loaded in a child each way, all layers offloaded or none, by
  llama-cpp-python's own ``Llama`` and by warmstart's loader: exit status and the
  end of stderr (llama.cpp's log on), so a crash is placed on one side or the other;
- ``bench``: ``warmstart bench --json`` on it with every layer offloaded
  (cold, RAM-hit and disk-hit TTFT, restore GB/s, start to first token);
- ``seconds``: each phase; ``errors``: any section that failed, by name (the
  report is written whatever fails, so one run says as much as it can).

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
    write(path, g)
    return {
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
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.bench_timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"warmstart bench failed ({proc.returncode}): {proc.stderr[-8000:]}")
    return dict(json.loads(proc.stdout))


# each load in a child: a segfault ends the child, not the report
_LOADERS = {
    "llama_cpp": "import llama_cpp, sys; llama_cpp.Llama(sys.argv[1],"
    " n_gpu_layers=int(sys.argv[2]), n_ctx=512, verbose=True)",
    "warmstart": "import sys; from pathlib import Path; from warmstart.runtime.engine._llama import"
    " LlamaModel; LlamaModel(Path(sys.argv[1]), int(sys.argv[2]))",
}


def loads_section(model: Path, timeout: float = 120.0) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, code in _LOADERS.items():
        for layers in (-1, 0):
            cmd = [sys.executable, "-X", "faulthandler", "-c", code, str(model), str(layers)]
            t0 = time.perf_counter()
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
            out[f"{name}_gpu_layers_{layers}"] = {
                "returncode": proc.returncode,
                "seconds": round(time.perf_counter() - t0, 3),
                "stderr_tail": proc.stderr[-4000:],
            }
    return out


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
        return report[name]

    section("llama_cpp", llama_cpp_section)
    gpu = section("gpu", lambda: gpu_section(work / "data" / "cache"))
    section("copies", lambda: copies_section(gpu))
    model = work / f"synthetic-{args.geometry}.gguf"
    section("model", lambda: model_section(model, args.geometry))
    if args.loads and report["model"] is not None:
        section("loads", lambda: loads_section(model))
    if args.bench and report["model"] is not None:
        section("bench", lambda: bench_section(model, work / "data", args))
    else:
        report["bench"] = None
    return report


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="where the JSON report goes")
    p.add_argument("--work", type=Path, default=None, help="model and data dir (default: temp)")
    p.add_argument("--geometry", choices=sorted(GEOMETRIES), default="llama-8b")
    p.add_argument("--no-bench", dest="bench", action="store_false")
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
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(report, indent=2))
    return 1 if report["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
