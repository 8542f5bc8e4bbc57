"""Why does llama.cpp die loading a model on this GPU machine? One run, one table.

Loads a synthetic model (installers/gpu/synth_gguf.py) once per case, each in a child
process with llama.cpp's log on, under its own timeout, and records how each child
ended (exit status or signal), how far it got (import, backend, load, context,
decode), its wall time and the last lines of its log. The cases vary one thing at a
time against the crash seen on the H200 (a SIGSEGV inside
``llama_model_load_from_file`` with the Llama-3-8B geometry fully offloaded): the
geometry, offload, the loader's mode (``load_mode``, ``lazy_mode``), ``vocab_only``,
``no_alloc``, extra buffer types at a decode, pinned staging
(``GGML_CUDA_NO_PINNED``), and no visible GPU. A field this llama-cpp-python lacks
makes its case "n/a". Beside them: the kernel (gVisor reports 4.4.0), the
library path, ``ldd`` of llama.cpp's libraries, the libraries mapped in the child,
and, for a death by a signal, a backtrace by ``cuda-gdb -batch`` when it is on PATH.

``diagnosis.json`` and ``diagnosis.md`` are rewritten after every case, so a timeout
or a kill later keeps everything before it.

    python installers/gpu/diagnose.py --out DIR [--work DIR] [--big llama-8b|tiny]
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # installers.gpu, run as a script

from installers.gpu.synth_gguf import GEOMETRIES, write

LOG_LINES = 30
MAX_BACKTRACES = 2


@dataclass(frozen=True)
class Case:
    name: str
    why: str
    model: str = "big"  # "tiny" or "big" (the 8B geometry on a real run)
    n_gpu_layers: int = -1
    params: dict[str, Any] = field(default_factory=dict)  # llama_model_params fields
    env: dict[str, str] = field(default_factory=dict)
    decode: int = 0  # single-token decode steps after a prompt batch


# cheap and telling first: a crash later must not cost the answers before it
CASES = (
    Case("big_vocab_only", "no tensors loaded: the CUDA start alone", params={"vocab_only": True}),
    Case("big_no_alloc", "metadata and simulated allocations only", params={"no_alloc": True}),
    Case("tiny_gpu_all", "a small model fully offloaded: size-dependent?", model="tiny"),
    Case("big_gpu_0", "nothing offloaded (CUDA still starts)", n_gpu_layers=0),
    Case("big_gpu_all", "the crash as seen: every layer offloaded"),
    Case("big_gpu_all_no_mmap", "read() instead of mmap (load_mode 0)", params={"load_mode": 0}),
    Case("big_gpu_all_lazy_off", "the new lazy loader off (lazy_mode 0)", params={"lazy_mode": 0}),
    Case(
        "big_gpu_all_no_pinned",
        "no pinned staging buffers",
        env={"GGML_CUDA_NO_PINNED": "1"},
    ),
    Case("big_no_cuda_devices", "no GPU visible to CUDA", env={"CUDA_VISIBLE_DEVICES": ""}),
    Case(
        "big_cpu_decode16_extra_off",
        "CPU decode without extra buffer types",
        n_gpu_layers=0,
        params={"use_extra_bufts": False},
        decode=16,
    ),
    Case(
        "big_cpu_decode16_extra_on",
        "CPU decode with extra buffer types (AMX repacking)",
        n_gpu_layers=0,
        params={"use_extra_bufts": True},
        decode=16,
    ),
    Case(
        "big_gpu_all_decode16",
        "a fully offloaded decode (extra buffer types off: the AMX case apart)",
        params={"use_extra_bufts": False},
        decode=16,
    ),
)


# the child ----------------------------------------------------------------------------------
def _stage(fd: int, **what: Any) -> None:
    """One JSON line, written at once: the parent learns how far a dead child got."""
    os.write(fd, (json.dumps({**what, "t": time.time()}) + "\n").encode())


def mapped_libraries(maps: Path = Path("/proc/self/maps")) -> list[str]:
    """The shared objects mapped into this process, each once, in load order."""
    try:
        lines = maps.read_text().splitlines()
    except OSError:
        return []
    seen: dict[str, None] = {}
    for line in lines:
        path = line.split(maxsplit=5)[-1] if len(line.split()) >= 6 else ""
        # Python's own extension modules are noise here; llama.cpp's, CUDA's and libc's not
        if ".so" in Path(path).name and "lib-dynload" not in path:
            seen.setdefault(path, None)
    return list(seen)


def child(spec: dict[str, Any], stages_path: Path) -> int:
    """Loads ``spec["model"]`` as ``spec`` says, logging each stage to ``stages_path``."""
    import resource

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a death is an answer, not a core
    fd = os.open(stages_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    _stage(fd, stage="start")
    import llama_cpp.llama_cpp as ll

    @ll.llama_log_callback
    def to_stderr(_level: int, text: bytes, _user: ctypes.c_void_p) -> None:
        os.write(2, text)  # unbuffered: a crash right after keeps the line

    ll.llama_log_set(to_stderr, ctypes.c_void_p(0))
    ll.llama_backend_init()
    _stage(fd, stage="backend", libraries=mapped_libraries())
    params = ll.llama_model_default_params()
    params.n_gpu_layers = 10**6 if spec["n_gpu_layers"] < 0 else spec["n_gpu_layers"]
    for name, value in spec["params"].items():
        setattr(params, name, value)
    _stage(fd, stage="loading")
    model = ll.llama_model_load_from_file(spec["model"].encode(), params)
    if not model:
        _stage(fd, stage="load failed")
        return 3
    _stage(fd, stage="loaded", libraries=mapped_libraries())
    if spec["decode"] and not spec["params"].get("vocab_only"):
        code = _decode(ll, model, spec["decode"])
        if code:
            return code
        _stage(fd, stage="decoded")
    ll.llama_model_free(model)
    _stage(fd, stage="done")
    return 0


def _decode(ll: Any, model: Any, steps: int) -> int:
    cparams = ll.llama_context_default_params()
    cparams.n_ctx = cparams.n_batch = cparams.n_ubatch = 64
    cparams.n_threads = cparams.n_threads_batch = os.cpu_count() or 1
    ctx = ll.llama_init_from_model(model, cparams)
    if not ctx:
        return 4
    vocab = ll.llama_model_get_vocab(model)
    n_vocab = int(ll.llama_vocab_n_tokens(vocab))
    ids = [int(ll.llama_vocab_bos(vocab))] + [3 + i % (n_vocab - 3) for i in range(7)]
    for step in range(1 + steps):
        part = ids if step == 0 else [ids[1 + step % 7]]
        arr = (ll.llama_token * len(part))(*part)
        if ll.llama_decode(ctx, ll.llama_batch_get_one(arr, len(part))) != 0:
            return 5
    ll.llama_free(ctx)
    return 0


# the parent ---------------------------------------------------------------------------------
_FIELDS_CODE = (
    "import json, llama_cpp.llama_cpp as ll; "
    "print(json.dumps([f[0] for f in ll.llama_model_params._fields_]))"
)


def param_fields() -> list[str] | str:
    """``llama_model_params``' fields, read in a child (importing llama.cpp's libraries
    here could kill the report itself); a string says why they are unknown."""
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _FIELDS_CODE], capture_output=True, text=True, timeout=120
        )
        return list(json.loads(proc.stdout.strip().splitlines()[-1]))
    except (OSError, ValueError, IndexError, subprocess.TimeoutExpired) as exc:
        return f"unknown: {exc!r}"


def missing_params(names: list[str], fields: list[str] | str) -> list[str]:
    """The fields among ``names`` that this llama-cpp-python lacks (none when unknown)."""
    return [] if isinstance(fields, str) else [n for n in names if n not in fields]


def child_command(spec: dict[str, Any], stages: Path) -> list[str]:
    return [
        sys.executable,
        "-X",
        "faulthandler",
        __file__,
        "--child",
        json.dumps(spec),
        str(stages),
    ]


def run_case(
    case: Case, model: Path, out: Path, timeout_s: float, fields: list[str] | str
) -> dict[str, Any]:
    """One child for ``case``: how it ended, how far it got, the end of its log."""
    result: dict[str, Any] = {"case": case.name, "why": case.why, **_case_facts(case)}
    missing = missing_params(list(case.params), fields)
    if missing:
        return {**result, "outcome": "n/a", "note": f"llama_model_params has no {missing}"}
    spec = {"model": str(model), "n_gpu_layers": case.n_gpu_layers, "params": case.params}
    spec["decode"] = case.decode
    stages = out / "children" / f"{case.name}.stages.jsonl"
    stages.parent.mkdir(parents=True, exist_ok=True)
    stages.unlink(missing_ok=True)
    env = {**os.environ, **case.env}
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(
            child_command(spec, stages), capture_output=True, timeout=timeout_s, env=env
        )
        code, log = proc.returncode, proc.stderr
    except subprocess.TimeoutExpired as exc:
        code, log = None, exc.stderr or b""
    result["seconds"] = round(time.perf_counter() - t0, 3)
    result.update(_ending(code, timeout_s))
    text = log.decode("utf-8", "replace") if isinstance(log, bytes) else str(log)
    (out / "children" / f"{case.name}.log").write_text(text)
    result.update(split_log(text))
    result.update(_stages(stages))
    return result


def split_log(text: str) -> dict[str, Any]:
    """llama.cpp's last lines, Python's fault report apart (faulthandler prints it after
    a fatal signal), and the one line that tells most: an assertion, an error, or the
    last thing llama.cpp said."""
    lines = text.strip().splitlines()
    cut = next((i for i, ln in enumerate(lines) if ln.startswith("Fatal Python error")), None)
    log, fault = (lines, []) if cut is None else (lines[:cut], lines[cut:])
    telling = [ln for ln in log if "GGML_ASSERT" in ln or "error" in ln.lower()]
    key = (telling or log or fault or [""])[-1]
    return {"log_tail": log[-LOG_LINES:], "python_fault": fault[:20], "key_line": key.strip()}


def _case_facts(case: Case) -> dict[str, Any]:
    facts = asdict(case)
    del facts["name"], facts["why"]
    return facts


def _ending(code: int | None, timeout_s: float) -> dict[str, Any]:
    if code is None:
        return {"outcome": f"timeout ({timeout_s:.0f} s)", "returncode": None, "signal": None}
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return {"outcome": f"died by {name}", "returncode": code, "signal": name}
    return {"outcome": "ok" if code == 0 else f"exit {code}", "returncode": code, "signal": None}


def _stages(path: Path) -> dict[str, Any]:
    try:
        rows = [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]
    except (OSError, ValueError):
        rows = []
    libraries: list[str] = []
    for row in rows:
        libraries = row.get("libraries", libraries)
    return {"reached": rows[-1]["stage"] if rows else "not started", "libraries": libraries}


def backtrace(case: Case, model: Path, out: Path, timeout_s: float) -> dict[str, Any]:
    """The crash again under ``cuda-gdb -batch`` (it catches host crashes too)."""
    gdb = shutil.which("cuda-gdb")
    if gdb is None:
        return {"skipped": "cuda-gdb is not on PATH"}
    spec = {"model": str(model), "n_gpu_layers": case.n_gpu_layers, "params": case.params}
    spec["decode"] = case.decode
    stages = out / "children" / f"{case.name}.gdb.stages.jsonl"
    cmd = [gdb, "-batch", "-ex", "run", "-ex", "bt", "--args", *child_command(spec, stages)]
    try:
        proc = subprocess.run(
            cmd, capture_output=True, timeout=timeout_s, env={**os.environ, **case.env}
        )
        text = (proc.stdout + proc.stderr).decode("utf-8", "replace")
    except subprocess.TimeoutExpired as exc:
        text = (exc.stdout or b"").decode("utf-8", "replace") + "\n[cuda-gdb timed out]"
    (out / "children" / f"{case.name}.gdb.txt").write_text(text)
    return {"tail": text.strip().splitlines()[-60:]}


def environment() -> dict[str, Any]:
    """The facts around the crash, gathered without loading llama.cpp in this process."""
    spec = importlib.util.find_spec("llama_cpp")
    locations = list(spec.submodule_search_locations or []) if spec else []
    pkg = Path(locations[0]) if locations else None
    lib_dirs = [d for d in (pkg / "lib", pkg.parent / "lib") if d.is_dir()] if pkg else []
    libs = {str(d): sorted(p.name for p in d.iterdir()) for d in lib_dirs}
    ldd = {}
    for d in lib_dirs[:1]:
        for name in ("libggml-cuda.so", "libllama.so"):
            # a slim wheel (installers/gpu/slim_wheel.py) has libggml-cuda.so.0 alone
            found = sorted(d.glob(name + "*"))
            if found:
                ldd[name] = _run(["ldd", str(found[0])])
    try:
        cpu_flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        cpu_flags = ""
    return {
        "uname_r": platform.release(),
        "uname_v": platform.version(),
        "gvisor_suspected": platform.release().startswith("4.4.0"),
        "amx": "amx_tile" in cpu_flags,
        "python": sys.version.split()[0],
        "LD_LIBRARY_PATH": os.environ.get("LD_LIBRARY_PATH"),
        "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "llama_cpp_package": str(pkg) if pkg else None,
        "library_dirs": libs,
        "ldd": ldd,
        "nvidia_smi": _run(["nvidia-smi", "-L"]),
        "cuda_gdb": shutil.which("cuda-gdb"),
    }


def _run(cmd: list[str]) -> str:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"({cmd[0]}: {exc})"
    return (proc.stdout + proc.stderr).strip()[-6000:]


def conclude(cases: list[dict[str, Any]]) -> list[str]:
    """What the outcomes say, in the terms of the issue's hypotheses."""
    ok = {c["case"]: c["outcome"] == "ok" for c in cases if c["outcome"] != "n/a"}
    said = []

    def both(a: str, b: str) -> bool:
        return a in ok and b in ok

    if both("big_gpu_all", "big_gpu_0") and not ok["big_gpu_all"] and ok["big_gpu_0"]:
        said.append("the offloaded load dies, the CPU one lives: a GPU path of the loader")
    if ok.get("big_gpu_all") is False and ok.get("big_no_cuda_devices"):
        said.append("with no GPU visible it lives: CUDA (or the sandbox under it) is involved")
    if ok.get("big_vocab_only") is False:
        said.append("dies without loading a tensor: CUDA's start or the libraries, not the data")
    for case, what in (
        ("big_gpu_all_no_mmap", "mmap"),
        ("big_gpu_all_lazy_off", "the lazy loader"),
        ("big_gpu_all_no_pinned", "pinned staging"),
    ):
        if ok.get("big_gpu_all") is False and ok.get(case):
            said.append(f"{case} lives where big_gpu_all dies: {what} is the path that kills")
    if ok.get("tiny_gpu_all") and ok.get("big_gpu_all") is False:
        said.append("the tiny model lives fully offloaded: size-dependent")
    if ok.get("big_cpu_decode16_extra_off") and ok.get("big_cpu_decode16_extra_on") is False:
        said.append("extra buffer types kill the CPU decode (AMX?): keep them off here")
    if ok and all(ok.values()):
        said.append("every case lived")
    return said


def write_report(out: Path, report: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    report["conclusions"] = conclude(report["cases"])
    tmp = out / "diagnosis.json.tmp"
    tmp.write_text(json.dumps(report, indent=2) + "\n")
    os.replace(tmp, out / "diagnosis.json")
    (out / "diagnosis.md").write_text(render(report))


def render(report: dict[str, Any]) -> str:
    env = report["environment"]
    lines = [
        f"kernel {env['uname_r']} (gVisor suspected: {env['gvisor_suspected']}), "
        f"AMX: {env['amx']}, big model: {report['big_geometry']}",
        "",
        "| case | outcome | reached | s | telling log line |",
        "|---|---|---|---|---|",
    ]
    for c in report["cases"]:
        last = (c.get("key_line") or c.get("note", "")).replace("|", "/")[-110:]
        lines.append(
            f"| {c['case']} | {c['outcome']} | {c.get('reached', '')} "
            f"| {c.get('seconds', '')} | {last} |"
        )
    lines += ["", *[f"- {s}" for s in report["conclusions"]]]
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> dict[str, Any]:
    out, work = args.out, args.work
    work.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"big_geometry": args.big, "environment": environment()}
    fields = report["environment"]["model_params_fields"] = param_fields()
    report["cases"] = []
    write_report(out, report)
    # named as gpu_check names them: a later step reuses the file
    models = {"tiny": work / "synthetic-tiny.gguf", "big": work / f"synthetic-{args.big}.gguf"}
    t0 = time.perf_counter()
    for kind, path in models.items():
        if not path.is_file():
            write(path, GEOMETRIES["tiny" if kind == "tiny" else args.big])
    report["model_seconds"] = round(time.perf_counter() - t0, 3)
    traced = 0
    selected = [c for c in CASES if not args.cases or c.name in args.cases]
    for case in selected:
        if time.perf_counter() - t0 > args.budget_s:
            report["cases"].append({"case": case.name, "outcome": "skipped (budget spent)"})
            continue
        result = run_case(case, models[case.model], out, args.timeout_s, fields)
        if result.get("signal") and traced < MAX_BACKTRACES:
            traced += 1
            result["backtrace"] = backtrace(case, models[case.model], out, args.timeout_s)
        report["cases"].append(result)
        write_report(out, report)
    write_report(out, report)
    return report


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="diagnosis.json and .md go here")
    p.add_argument("--work", type=Path, default=Path("/tmp/warmstart-diagnose"))
    p.add_argument("--big", choices=sorted(GEOMETRIES), default="llama-8b")
    p.add_argument("--timeout-s", type=float, default=180.0, help="for each case")
    p.add_argument("--budget-s", type=float, default=480.0, help="for all cases together")
    p.add_argument("--cases", nargs="*", default=None, help="only these (default: all)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        return child(json.loads(argv[1]), Path(argv[2]))
    report = run(parse_args(argv))
    print(render(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
