"""Two llama.cpp builds side by side: single-stream decode and a cold prefill.

What a build's patches cost a lone conversation (issue 46: exact batched decode must
not slow single-stream decode or a cold prefill by more than 2%). Each sample runs in
a fresh child process of this module on one build: it loads the model, prefills a
prompt of ``--context`` tokens into an empty sequence (timed: the cold prefill), then
decodes ``--decode`` tokens greedily one at a time after it (timed: decode tok/s at
that context, where the flash-attention patch acts). Builds alternate A B B A ... for
``--rounds`` rounds, so that the machine's drift falls on both; the medians and their
ratios print at the end. Prints figures; asserts nothing.

Build A is the llama_cpp this Python imports; build B is ``--other``: a wheel, a
folder holding one (the wheel cache, ~/.cache/warmstart/llama-wheels/<build>/), or a
folder where one is installed (``pip install --no-deps --target DIR WHEEL``). B's
children import it first (PYTHONPATH), the rest of warmstart from here.

    python -m warmstart.runtime.bench._ab_builds --other DIR [--context 1500]
        [--decode 128] [--rounds 6] [--model default]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ..errors import PeerError

_PROMPT = "The office keeps a log of every delivery, refund and visitor. " * 400


def measure_child(model: Path, context: int, decode: int, extra_buffers: bool) -> dict[str, Any]:
    """In a child: this build's cold prefill of ``context`` tokens and its decode rate
    over ``decode`` tokens after them, through warmstart's engine on one conversation
    (flash attention as llama.cpp chooses, every core)."""
    import importlib.metadata

    import numpy as np

    from ..engine import EngineConfig, LlamaEngine, LlamaModel

    lm = LlamaModel(model, 0, extra_buffers=extra_buffers)
    config = EngineConfig(model, "ab-builds", context + decode + 256, 1, n_gpu_layers=0)
    engine = LlamaEngine(config, model=lm)
    try:
        ids = lm.tokenize(_PROMPT, add_special=False)[:context]
        if len(ids) < context:
            raise PeerError(f"the prompt has {len(ids)} tokens, fewer than --context {context}")
        res = engine.residents[0]
        engine.prefill(res, ids[:8], want_logits=True)  # the first decode allocates, loads
        engine.evict(res, counted=False)
        t0 = time.perf_counter()
        engine.prefill(res, ids, want_logits=True)
        prefill_s = time.perf_counter() - t0
        t1 = time.perf_counter()
        for _ in range(decode):
            engine.step(res, int(np.argmax(engine.ctx.logits())))
        decode_s = time.perf_counter() - t1
    finally:
        engine.close()
    return {
        "build": importlib.metadata.version("llama_cpp_python"),
        "prefill_s": prefill_s,
        "decode_tok_s": decode / decode_s,
    }


def other_build(path: Path, work: Path) -> Path:
    """The folder B's children import llama_cpp from (a wheel is installed into
    ``work`` first, offline)."""
    if path.is_dir() and (path / "llama_cpp").is_dir():
        return path
    wheels = sorted(path.glob("llama_cpp_python-*.whl")) if path.is_dir() else [path]
    if len(wheels) != 1 or wheels[0].suffix != ".whl" or not wheels[0].is_file():
        raise PeerError(f"--other {path}: not a llama_cpp install, one wheel, or its folder")
    target = work / "other"
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index"]
    proc = subprocess.run([*cmd, "--target", str(target), str(wheels[0])], capture_output=True)
    if proc.returncode != 0:
        raise PeerError(f"cannot install {wheels[0]}: {proc.stderr.decode()[-2000:]}")
    return target


def _sample(build: Path | None, args: argparse.Namespace, model: Path) -> dict[str, Any]:
    """One child process on build A (None) or B."""
    here = str(Path(__file__).resolve().parents[2])
    paths = [str(build) if build else "", here, os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
    payload = [str(model), args.context, args.decode, args.extra_buffers]
    # run as ``python -m``, this module's __name__ is "__main__"; its spec has its name
    module = __spec__.name if __spec__ is not None else __name__
    cmd = [sys.executable, "-m", module, "--child", json.dumps(payload)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise PeerError(f"a child failed:\n{proc.stderr[-3000:]}")
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def run(args: argparse.Namespace, model: Path) -> dict[str, list[dict[str, Any]]]:
    """``args.rounds`` samples of each build, in the order A B, B A, A B, ..."""
    samples: dict[str, list[dict[str, Any]]] = {"A": [], "B": []}
    with tempfile.TemporaryDirectory(prefix="warmstart-ab-") as work:
        builds = {"A": None, "B": other_build(args.other, Path(work))}
        for r in range(args.rounds):
            for name in ("A", "B") if r % 2 == 0 else ("B", "A"):
                sample = _sample(builds[name], args, model)
                line = (
                    f"round {r + 1} {name} ({sample['build']}): prefill "
                    f"{sample['prefill_s']:.3f} s, decode {sample['decode_tok_s']:.2f} tok/s"
                )
                print(line, file=sys.stderr, flush=True)  # progress: the CLI's own output
                samples[name].append(sample)
    return samples


def render(samples: dict[str, list[dict[str, Any]]], args: argparse.Namespace) -> str:
    med = {
        name: {k: statistics.median(s[k] for s in runs) for k in ("prefill_s", "decode_tok_s")}
        for name, runs in samples.items()
    }
    a, b = med["A"], med["B"]
    names = {name: runs[0]["build"] for name, runs in samples.items()}
    return "\n".join(
        [
            f"A: {names['A']} (this environment); B: {names['B']} ({args.other}); "
            f"{args.rounds} rounds, alternating; medians",
            f"cold prefill of {args.context} tokens: A {a['prefill_s']:.3f} s, "
            f"B {b['prefill_s']:.3f} s, A / B {a['prefill_s'] / b['prefill_s']:.3f} "
            "(above 1: A is slower)",
            f"decode of {args.decode} tokens after them: A {a['decode_tok_s']:.2f} tok/s, "
            f"B {b['decode_tok_s']:.2f} tok/s, A / B {a['decode_tok_s'] / b['decode_tok_s']:.3f} "
            "(below 1: A is slower)",
        ]
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m warmstart.runtime.bench._ab_builds")
    p.add_argument("--other", type=Path, required=True, help="build B (see above)")
    p.add_argument("--model", default="default", help="a GGUF file or a catalogue name")
    p.add_argument("--context", type=int, default=1500, help="prompt tokens (default 1500)")
    p.add_argument("--decode", type=int, default=128, help="tokens decoded (default 128)")
    p.add_argument("--rounds", type=int, default=6, help="samples of each build (default 6)")
    p.add_argument("--extra-buffers", action="store_true", help="llama.cpp's repacked weights")
    args = p.parse_args(argv)
    if args.context < 16 or args.decode < 1 or args.rounds < 1:
        p.error("--context is at least 16, --decode and --rounds at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    from ._bench_peers import resolve_model

    args = parse_args(argv)
    try:
        samples = run(args, resolve_model(args.model))
    except PeerError as exc:
        print(f"ab-builds: {exc}", file=sys.stderr)
        return 1
    print(render(samples, args))
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        model, context, decode, extra = json.loads(sys.argv[2])
        print(json.dumps(measure_child(Path(model), context, decode, extra)))
    else:
        sys.exit(main())
