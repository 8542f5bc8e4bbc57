"""`warmstart bench`: time to first token cold, from RAM and from disk in a fresh
process, side by side with llama-cpp-python's own LlamaRAMCache and LlamaDiskCache
on the same model, prompts and machine, in one run. Prints figures; asserts nothing.

Each measurement that needs a fresh process runs in one (``python -m runtime.bench
--child ...``), printing one JSON line.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .._progress import Bar
from ..engine import LoaderChoice
from ..settings import Settings, load_settings
from ..types import Message, Request, Sampling, Token

# the runtime package (warmstart.runtime): its command line runs in the timed child processes
_RUNTIME = str(__package__).rpartition(".")[0]

QUESTIONS = [
    "Which rule covers late deliveries?",
    "Summarise rule 7 in one line.",
    "What should I do when a customer is angry?",
    "Which rules mention refunds?",
    "How many rules are there about safety?",
    "What is the first rule?",
    "Explain rule 12 to a new colleague.",
    "Which rule is the strictest?",
    "Is overtime covered anywhere?",
    "What do the rules say about email?",
    "Give me a checklist for Monday mornings.",
    "Which rule would you change?",
    "What does rule 3 protect against?",
    "Which rules apply to visitors?",
    "What is said about passwords?",
    "How are holidays handled?",
    "Which rule talks about the kitchen?",
    "What happens after an accident?",
    "Who approves purchases?",
    "What is the last rule about?",
]
FOLLOW_UP = "Thanks. And in one word?"
TOPICS = [
    "deliveries",
    "refunds",
    "safety",
    "visitors",
    "passwords",
    "holidays",
    "email",
    "purchases",
    "the kitchen",
    "accidents",
    "overtime",
    "customers",
    "meetings",
]


def system_prompt(n_rules: int) -> str:
    rules = [
        f"Rule {i + 1}: every question about {TOPICS[i % len(TOPICS)]} goes to team "
        f"{chr(65 + i % 26)}, is answered within {i % 5 + 1} working days, and is "
        f"logged with reference {1000 + 7 * i}."
        for i in range(n_rules)
    ]
    return "You are the office assistant of a small company. Company rules:\n" + "\n".join(rules)


def conversation(system: str, i: int, follow_up: str | None = None) -> tuple[Message, ...]:
    msgs = [
        Message("system", system),
        Message("user", QUESTIONS[i % len(QUESTIONS)] + ("" if i < len(QUESTIONS) else f" ({i})")),
    ]
    if follow_up is not None:
        msgs += [Message("assistant", follow_up), Message("user", FOLLOW_UP)]
    return tuple(msgs)


def timed(rt: Any, messages: tuple[Message, ...], max_tokens: int = 16) -> dict[str, Any]:
    """Wall-clock TTFT (submit to first token) and the reply's report."""
    t0 = time.perf_counter()
    stream = rt.generate(Request(messages=messages, sampling=Sampling(max_tokens=max_tokens)))
    ttft, parts = None, []
    for event in stream:
        if isinstance(event, Token):
            ttft = ttft if ttft is not None else time.perf_counter() - t0
            parts.append(event.text)
        else:
            report = event.report
    return {
        "ttft_s": ttft if ttft is not None else time.perf_counter() - t0,
        "text": "".join(parts),
        "report": report.as_dict(),
    }


def du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


# ours --------------------------------------------------------------------------------------
def _open(settings: Settings) -> Any:
    from ..serving import open_runtime

    return open_runtime(settings, prewarm=False)


def settle(rt: Any) -> None:
    """Lets the last reply's capture and write-through finish: each case is timed in a
    steady state, not while the previous one's bytes are still going to disk."""
    rt.wait_idle()
    rt.store.flush()


def set_data_gbps(rt: Any) -> float:
    """The raw llama_state_seq_set_data rate on a whole-sequence blob of the live prompt."""

    def measure() -> float:
        eng = rt.engine
        held = max(eng.residents, key=lambda r: len(r.tokens))
        dest = min((r for r in eng.residents if r is not held), key=lambda r: len(r.tokens))
        n, seconds = eng.time_state_set(held, dest)
        return n / seconds / 1e9

    return float(rt.on_worker(measure))


def one_step_s(rt: Any) -> float:
    """One two-token decode at the end of the longest live conversation: what every RAM
    or disk hit costs at least (the prompt's last two tokens are decoded again; a live
    repeat draws from the logits its sequence kept)."""

    def measure() -> float:
        eng = rt.engine
        res = max(eng.residents, key=lambda r: len(r.tokens))
        n, times = len(res.tokens), []
        for _ in range(5):
            t = time.perf_counter()
            eng.prefill(res, res.tokens[-2:], want_logits=True)
            times.append(time.perf_counter() - t)
            eng.trim(res, n)
        return statistics.median(times)

    return float(rt.on_worker(measure))


def decode_tok_s(rt: Any, messages: tuple[Message, ...], threads: int | None = None) -> float:
    """Tokens a second of a 64-token greedy reply (after its first token), with the
    decode threads the runtime chose or ``threads``."""
    eng = rt.engine
    if threads is not None:
        rt.on_worker(lambda: eng.set_decode_threads(threads))
    try:
        report = timed(rt, messages, max_tokens=64)["report"]
    finally:
        if threads is not None:
            rt.on_worker(lambda: eng.set_decode_threads(None))
    steps = max(report["completion_tokens"] - 1, 1)
    return steps / max((report["total_ms"] - report["ttft_ms"]) / 1000, 1e-9)


def threshold_check(rt: Any, lengths: tuple[int, ...] = (4, 16, 64, 256)) -> dict[str, Any]:
    """Restore vs recompute at the chosen swap-in threshold and at ``lengths`` (each
    must fit a sequence's context), and what the runtime decides just below it."""
    from ..policy import decide_restore

    eng, t = rt.engine, rt.tuning

    def restore_ms(n: int) -> float:
        """Assembling one chunk of ``n`` tokens and loading it, as a hit does."""
        import numpy as np

        dest = min(eng.residents, key=lambda r: len(r.tokens))
        eng.evict(dest)
        ids = eng.model.tokenize("Restore timing text. " * (n // 3 + 2), add_special=False)[:n]
        eng.prefill(dest, ids, want_logits=False)
        chunk = np.empty(eng.blob_bytes(n), dtype=np.uint8)
        eng.cut(eng.snapshot(dest.seq), 0, n, chunk)
        times = []
        for _ in range(5):
            eng.evict(dest)
            s = time.perf_counter()
            assert eng.restore(dest, [chunk], ids, [n])
            times.append(time.perf_counter() - s)
        eng.evict(dest)
        return 1000 * statistics.median(times)

    def recompute_ms(n: int) -> float:  # into an emptied idle sequence
        return 1000 * statistics.median(eng.time_prefill(n) for _ in range(3))

    def run() -> dict[str, Any]:
        threshold = max(1, t.swap_in_threshold_tokens)
        sweep = sorted({threshold, *lengths})
        rows = {n: (restore_ms(n), recompute_ms(n)) for n in sweep}
        kvb = eng.kv_bytes_per_token
        below = decide_restore(threshold - 1, (threshold - 1) * kvb, "ram", threshold, rt.rates)
        at = decide_restore(threshold, threshold * kvb, "ram", threshold, rt.rates)
        return {
            "threshold_tokens": threshold,
            "restore_ms_at_threshold": rows[threshold][0],
            "recompute_ms_at_threshold": rows[threshold][1],
            "decision_at_threshold": at.reason,
            "restores_at_threshold": at.restore,
            "decision_below": below.reason,
            "restores_below": below.restore,
            "sweep": {str(n): {"restore_ms": r, "recompute_ms": c} for n, (r, c) in rows.items()},
        }

    return dict(rt.on_worker(run))


def run_ours(settings: Settings, system: str, n_conv: int, bar: Bar) -> dict[str, Any]:
    bar.update(0, "loading the model")
    rt = _open(settings)
    try:
        first = conversation(system, 0)
        bar.update(1, "cold prompt")
        cold = timed(rt, first)
        settle(rt)
        live = timed(rt, first)
        rt.evict_live()
        ram = timed(rt, first)
        bar.update(2, "live and RAM hits")
        out: dict[str, Any] = {
            "cold": cold,
            "live": live,
            "ram": ram,
            "set_data_gbps": set_data_gbps(rt),
            "kv_bytes_per_token": rt.engine.kv_bytes_per_token,
            "extra_buffers": rt.engine.model.extra_buffers,
            "loader": rt.loader.to_dict(),
            "tuning": rt.tuning.report(),
        }
        own_tokens = []
        for i in range(n_conv):
            bar.update(3 + i, f"conversation {i + 1} of {n_conv}")
            turn1 = timed(rt, conversation(system, i))
            turn2 = timed(rt, conversation(system, i, turn1["text"]))
            r = turn2["report"]
            own_tokens.append(r["prompt_tokens"] + r["completion_tokens"])
        rt.wait_idle()  # the last reply's chunks are captured after its Done
        rt.store.flush()
        bar.update(3 + n_conv, "decode speed and thresholds")
        out.update(_decode_figures(rt, system, n_conv))
        out["anchor_tokens"] = (rt.engine.prompt_ids(Request(messages=first))[1] or (0,))[0]
        out["final_tokens"] = own_tokens
        out["threshold"] = threshold_check(rt)
        return out
    finally:
        rt.close()


def _decode_figures(rt: Any, system: str, n_conv: int) -> dict[str, Any]:
    """Decode speed alone, with one thread, and with four long conversations resident;
    a new question on the same long prompt; one decode step at that length."""
    rt.evict_live()
    alone = conversation(system, n_conv + 1)
    timed(rt, alone)  # cold: stored for the next ones
    rt.wait_idle()
    rt.evict_live()
    out: dict[str, Any] = {"decode_tok_s": decode_tok_s(rt, alone)}
    rt.wait_idle()
    out["decode_tok_s_1_thread"] = decode_tok_s(rt, alone, threads=1)
    rt.wait_idle()
    for i in range(min(4, rt.tuning.resident_sequences) - 1):
        timed(rt, conversation(system, i), max_tokens=1)  # resident again, from RAM
    rt.wait_idle()
    out["resident_during_4_resident"] = rt.view.resident + 1
    out["decode_tok_s_4_resident"] = decode_tok_s(rt, alone)
    rt.wait_idle()  # as when a user reads a reply before asking the next question
    out["other_question"] = timed(rt, conversation(system, n_conv + 2))
    rt.wait_idle()
    out["one_step_s"] = one_step_s(rt)
    return out


def child_disk(settings: Settings, system: str) -> dict[str, Any]:
    rt = _open(settings)
    try:
        return timed(rt, conversation(system, 0))
    finally:
        rt.close()


# llama-cpp-python's own caches ----------------------------------------------------------------
def _llama(
    model: Path, n_ctx: int, extra_buffers: bool, n_gpu_layers: int, mmap: bool | None = None
) -> Any:
    """llama-cpp-python's ``Llama`` loaded as ours was (the loader verdict's mmap and
    offload; its pinned staging comes with the child's environment, see _child)."""
    from llama_cpp import Llama

    if not extra_buffers:
        _without_extra_buffers()
    return Llama(
        model_path=str(model),
        n_ctx=n_ctx,
        n_gpu_layers=n_gpu_layers,  # the same offload as ours (-1: every layer)
        flash_attn=True,
        verbose=False,
        use_mmap=mmap is not False,  # Llama has no "auto": mmap, as llama.cpp's auto maps
    )


def _without_extra_buffers() -> None:
    """The high-level ``Llama`` builds its own model params and has no option for
    llama.cpp's extra buffer types: make its defaults say off. Only ever called in
    the comparison's child process, which exists for this one model."""
    import llama_cpp.llama_cpp as ll

    default_params = ll.llama_model_default_params

    def without() -> Any:
        params = default_params()
        params.use_extra_bufts = False
        return params

    ll.llama_model_default_params = without


def _lcp_ttft(llm: Any, prompt: str) -> float:
    t0 = time.perf_counter()
    it = llm.create_completion(prompt, max_tokens=16, temperature=0.0, stream=True)
    next(it)
    ttft = time.perf_counter() - t0
    for _ in it:
        pass
    return ttft


def child_lcp(
    model: Path,
    cache_dir: Path,
    prompts: list[str],
    n_ctx: int,
    populate: bool,
    extra_buffers: bool = False,
    n_gpu_layers: int = 0,
    mmap: bool | None = None,
) -> dict[str, Any]:
    from llama_cpp import LlamaDiskCache, LlamaRAMCache

    llm = _llama(model, n_ctx, extra_buffers, n_gpu_layers, mmap)
    llm.set_cache(LlamaDiskCache(cache_dir=str(cache_dir), capacity_bytes=8 << 30))
    first = _lcp_ttft(llm, prompts[0])
    if populate:
        return {"cold_ttft_s": first}
    llm.set_cache(LlamaRAMCache(capacity_bytes=8 << 30))
    _lcp_ttft(llm, prompts[0])  # saved to the RAM cache
    _lcp_ttft(llm, prompts[1])  # another chat takes the context
    return {"disk_ttft_s": first, "ram_ttft_s": _lcp_ttft(llm, prompts[0])}


# a fresh `warmstart ask` ------------------------------------------------------------------------
START_QUESTION = "Why is the sky blue? Answer in two sentences."


def _cli_args(settings: Settings) -> tuple[list[str], dict[str, str]]:
    """The settings that differ from the defaults, as `warmstart` flags, and as
    environment variables for the booleans a flag cannot turn off."""
    flags, env = [], {}
    for name, value in settings.model_dump(exclude_defaults=True).items():
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            if value:
                flags.append(flag)
            else:
                env[f"WARMSTART_{name.upper()}"] = "false"
        elif isinstance(value, tuple | list):
            flags += [flag, ",".join(str(v) for v in value)]
        else:
            flags += [flag, str(value)]
    return flags, env


def ask_start_to_first_token(settings: Settings, question: str = START_QUESTION) -> dict[str, Any]:
    """Runs `warmstart ask QUESTION` as a new process and times it from before the
    process starts to the first byte of its reply (the CLI writes each token as it
    comes): interpreter start, imports, model load and the request, as a user waits."""
    cmd = [sys.executable, "-m", _RUNTIME + ".cli", "ask", question, "--max-tokens", "8"]
    flags, env = _cli_args(settings)
    cmd += flags
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, **env}
    )
    assert proc.stdout is not None
    first = proc.stdout.read(1)
    first_s = time.perf_counter() - t0
    _, err = proc.communicate()
    if proc.returncode != 0 or not first:
        raise RuntimeError(f"warmstart ask failed ({proc.returncode}):\n{err.decode()[-3000:]}")
    summary = [ln for ln in err.decode().splitlines() if ln.startswith("[prompt")]
    return {
        "process_start_to_first_token_s": first_s,
        "process_wall_s": time.perf_counter() - t0,
        "summary": summary[-1] if summary else "",
    }


def repeated_ask(settings: Settings) -> dict[str, Any]:
    """A question asked once in a fresh process, then again in another: the second is
    the one timed (its prompt comes from the disk tier)."""
    first = ask_start_to_first_token(settings)
    return {"first": first, "repeat": ask_start_to_first_token(settings)}


# orchestration -------------------------------------------------------------------------------
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


def _bench_settings(settings: Settings, work: Path, model: Path) -> Settings:
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
        ours_settings = _bench_settings(settings, work, model)
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


def summarize(
    ours: dict[str, Any],
    disk: dict[str, Any],
    lcp_cold: dict[str, Any],
    lcp: dict[str, Any],
    disk_bytes: int,
    lcp_bytes: int,
    asks: dict[str, Any],
) -> dict[str, Any]:
    kvb = ours["kv_bytes_per_token"]
    anchor = ours["anchor_tokens"]
    ideal = kvb * (anchor + sum(n - anchor for n in ours["final_tokens"]))
    ram = ours["ram"]["report"]
    restored = ram["restored"]["ram"]
    return {
        "prompt_tokens": ours["cold"]["report"]["prompt_tokens"],
        "decode_tok_s": ours["decode_tok_s"],
        "decode_tok_s_1_thread": ours["decode_tok_s_1_thread"],
        "decode_tok_s_4_resident": ours["decode_tok_s_4_resident"],
        "resident_during_4_resident": ours["resident_during_4_resident"],
        "other_question_ttft_s": ours["other_question"]["ttft_s"],
        "other_question_cached_tokens": sum(ours["other_question"]["report"]["restored"].values()),
        "one_step_s": ours["one_step_s"],
        "cold_ttft_s": ours["cold"]["ttft_s"],
        "live_ttft_s": ours["live"]["ttft_s"],
        "ram_ttft_s": ours["ram"]["ttft_s"],
        "disk_ttft_s": disk["ttft_s"],
        "disk_restored_tokens": disk["report"]["restored"]["disk"],
        "disk_restore_ms": disk["report"]["restore_ms"],
        "disk_decode_ms": disk["report"]["prefill_ms"],
        "ram_restored_tokens": restored,
        "lcp_cold_ttft_s": lcp_cold["cold_ttft_s"],
        "lcp_ram_ttft_s": lcp["ram_ttft_s"],
        "lcp_disk_ttft_s": lcp["disk_ttft_s"],
        "set_data_gbps": ours["set_data_gbps"],
        "restore_gbps": restored * kvb / max(ram["restore_ms"], 1e-6) / 1e6,
        "restore_ms": ram["restore_ms"],
        "disk_bytes": disk_bytes,
        "ideal_bytes": ideal,
        "lcp_disk_bytes": lcp_bytes,
        "conversations": len(ours["final_tokens"]),
        "greedy_same_reply": ours["cold"]["text"] == ours["ram"]["text"] == disk["text"],
        "threshold": ours["threshold"],
        "tuning": {k: v["value"] for k, v in ours["tuning"].items()},
        "extra_buffers": ours["extra_buffers"],
        "loader": ours["loader"],
        "process_start_to_first_token_s": asks["repeat"]["process_start_to_first_token_s"],
        "ask": asks,
    }


def render(r: dict[str, Any]) -> str:
    cold = r["cold_ttft_s"]
    th = r["threshold"]

    def vs_cold(key: str) -> str:
        return f"TTFT {r[key]:8.3f} s   cold/{cold / r[key]:.0f}"

    lines = [
        f"workload: a {r['prompt_tokens']}-token prompt (shared system prompt), "
        f"{r['conversations']} conversations x 2 turns",
        f"  cold                  TTFT {cold:8.3f} s",
        f"  live hit              {vs_cold('live_ttft_s')}",
        f"  RAM hit               {vs_cold('ram_ttft_s')}"
        f"   ({r['ram_restored_tokens']} tokens restored in {r['restore_ms']:.1f} ms)",
        f"  disk, fresh process   {vs_cold('disk_ttft_s')}"
        f"   ({r['disk_restored_tokens']} tokens from disk in {r['disk_restore_ms']:.1f} ms, "
        f"last token {r['disk_decode_ms']:.1f} ms)",
        f"  other question        {vs_cold('other_question_ttft_s')}"
        f"   ({r['other_question_cached_tokens']} tokens cached)",
        f"  one decode step       {r['one_step_s']:8.3f} s  (two tokens at that length: "
        f"the floor of a RAM or disk hit; hits / step: "
        f"live {r['live_ttft_s'] / r['one_step_s']:.2f}, "
        f"RAM {r['ram_ttft_s'] / r['one_step_s']:.2f}, "
        f"disk {r['disk_ttft_s'] / r['one_step_s']:.2f})",
        f"decode {r['decode_tok_s']:.1f} tok/s; one thread {r['decode_tok_s_1_thread']:.1f} "
        f"tok/s ({r['decode_tok_s'] / r['decode_tok_s_1_thread']:.2f}x); with "
        f"{r['resident_during_4_resident']} long conversations resident "
        f"{r['decode_tok_s_4_resident']:.1f} tok/s",
        "llama-cpp-python, same prompts:",
        f"  cold                  TTFT {r['lcp_cold_ttft_s']:8.3f} s",
        f"  LlamaRAMCache hit     TTFT {r['lcp_ram_ttft_s']:8.3f} s   "
        f"warmstart RAM is {r['lcp_ram_ttft_s'] / r['ram_ttft_s']:.1f}x faster",
        f"  LlamaDiskCache, fresh TTFT {r['lcp_disk_ttft_s']:8.3f} s   "
        f"warmstart disk is {r['lcp_disk_ttft_s'] / r['disk_ttft_s']:.1f}x faster",
        f"restore {r['restore_gbps']:.2f} GB/s vs raw llama_state_seq_set_data "
        f"{r['set_data_gbps']:.2f} GB/s (same run)",
        f"disk: {r['disk_bytes'] / 1e6:.1f} MB for {r['conversations']} conversations; "
        f"ideal (system prompt once + own turns) {r['ideal_bytes'] / 1e6:.1f} MB "
        f"= {r['disk_bytes'] / r['ideal_bytes']:.2f}x; "
        f"LlamaDiskCache {r['lcp_disk_bytes'] / 1e6:.1f} MB for ONE conversation",
        f"greedy reply identical cold / RAM / disk: {r['greedy_same_reply']}",
        f"`warmstart ask`, a repeated question: process start to first token "
        f"{r['process_start_to_first_token_s']:.2f} s ({r['ask']['repeat']['summary']})",
        f"swap-in threshold {th['threshold_tokens']} tokens: restore "
        f"{th['restore_ms_at_threshold']:.2f} ms vs recompute "
        f"{th['recompute_ms_at_threshold']:.2f} ms; below it: "
        + ("restores (!)" if th["restores_below"] else "recomputes"),
    ]
    for n, row in th["sweep"].items():
        lines.append(
            f"    {n:>5} tokens: restore {row['restore_ms']:7.2f} ms, "
            f"recompute {row['recompute_ms']:8.2f} ms"
        )
    return "\n".join(lines)


def run_bench(
    settings: Settings, as_json: bool, quick: bool, system_tokens: int, conversations: int
) -> int:
    n_rules = max(2, (300 if quick else system_tokens) // 40)
    n_conv = 3 if quick else conversations
    result = measure(settings, n_rules, n_conv)
    print(json.dumps(result, indent=2) if as_json else render(result))
    return 0


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


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        _main_child(sys.argv[2], json.loads(sys.argv[3]))
    else:
        sys.exit(
            "usage: python -m warmstart.runtime.bench._bench --child KIND JSON "
            "(use `warmstart bench`)"
        )
