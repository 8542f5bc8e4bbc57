"""warmstart's own figures in `warmstart bench`, in this process: TTFT cold, live and
from RAM, decode speed, one decode step, the raw set-data rate and the swap-in
threshold's check; and the one timed reply of the fresh-process disk child."""

from __future__ import annotations

import statistics
import time
from typing import Any

from .._progress import Bar
from ..settings import Settings
from ..types import Message, Request, Sampling, Token
from ._workload import conversation


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
        out["anchor_tokens"] = (rt.prompter.prompt_ids(Request(messages=first))[1] or (0,))[0]
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
