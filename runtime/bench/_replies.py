"""`warmstart bench --replies 1,2,4,8`: decode speed with several replies at once.

For each count N, N conversations (a short shared system prompt, a question each) are
made live first; then all N are asked again at once, and each reply decodes a fixed
number of tokens (its end-of-turn tokens banned, so that every reply is as long as the
others). Figures: tokens/s of all N together (every reply's tokens after its first,
over the time from the first reply's first token to the last one's end) and the median
reply's own rate, with decode batching as the calibration allows (``decode_batch``)
and, side by side in the same run, one reply at a time (the worker's serial decode).
Rounds alternate which of the two goes first, and the figures are their medians.
Prints figures; asserts nothing.
"""

from __future__ import annotations

import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from ..settings import Settings
from ..types import Done, Message, Request, Sampling
from ._workload import QUESTIONS, system_prompt

COUNTS = (1, 2, 4, 8)


def _requests(rt: Any, n: int, max_tokens: int) -> list[Request]:
    """N conversations on one system prompt, each reply ``max_tokens`` long."""
    model = rt.engine.model
    banned = tuple((t, float("-inf")) for t in range(model.n_vocab) if model.is_eog(t))
    sampling = Sampling(max_tokens=max_tokens, logit_bias=banned)
    system = Message("system", system_prompt(4))
    return [
        Request(messages=(system, Message("user", QUESTIONS[i % len(QUESTIONS)] + f" ({i})")),
                sampling=sampling)
        for i in range(n)
    ]  # fmt: skip


def _at_once(rt: Any, requests: list[Request]) -> dict[str, float]:
    """All ``requests`` sent at the same moment: the figures of their replies."""
    spans: list[tuple[float, float, int]] = []  # (first token, end, tokens after the first)
    start = threading.Barrier(len(requests))

    def one(request: Request) -> None:
        start.wait()
        sent = time.perf_counter()
        report = next(e.report for e in rt.generate(request) if isinstance(e, Done))
        first = sent + report.ttft_ms / 1000
        spans.append((first, sent + report.total_ms / 1000, report.completion_tokens - 1))

    before = rt.counters["batched_steps"]
    threads = [threading.Thread(target=one, args=(r,), daemon=True) for r in requests]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    rt.wait_idle()  # the replies' re-prefill and capture: not in the next figures
    window = max(end for _, end, _ in spans) - min(first for first, _, _ in spans)
    rates = [n / (end - first) for first, end, n in spans if end > first and n > 0]
    return {
        "together_tok_s": sum(n for *_, n in spans) / max(window, 1e-9),
        "per_reply_tok_s": statistics.median(rates) if rates else 0.0,
        "shared_steps": float(rt.counters["batched_steps"] - before),
    }


def _medians(runs: list[dict[str, float]]) -> dict[str, float]:
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def measure_replies(
    rt: Any, counts: tuple[int, ...], max_tokens: int, rounds: int
) -> list[dict[str, Any]]:
    """One row per count: batched (as the runtime's tuning allows) and serial, side by
    side, ``rounds`` times each in alternating order."""
    proven = rt.tuning.decode_batch
    rows = []
    for n in counts:
        requests = _requests(rt, n, max_tokens)
        for r in requests:  # each conversation live: the rows time decode, not prefill
            rt.generate(Request(messages=r.messages, sampling=Sampling(max_tokens=1))).text()
        rt.wait_idle()
        modes = {"batched": proven, "serial": 1} if n > 1 and proven > 1 else {"batched": proven}
        runs: dict[str, list[dict[str, float]]] = {mode: [] for mode in modes}
        for i in range(rounds):
            for mode in list(modes)[:: 1 if i % 2 == 0 else -1]:
                rt.worker.set_decode_batch(modes[mode])
                runs[mode].append(_at_once(rt, requests))
        rt.worker.set_decode_batch(proven)
        rows.append({"replies": n, **{mode: _medians(r) for mode, r in runs.items()}})
    return rows


def run_replies(
    settings: Settings, counts: tuple[int, ...], max_tokens: int, rounds: int
) -> dict[str, Any]:
    """The rows on a runtime of this machine's calibration (measured first where there
    is none) in a work directory of its own, with at least ``max(counts)``
    conversations resident."""
    from ..models import ModelManager
    from ..serving import open_runtime
    from ._bench import bench_settings

    model = ModelManager(settings.models_dir).resolve(settings.model)
    with tempfile.TemporaryDirectory(prefix="warmstart-bench-") as work:
        ours = bench_settings(settings, Path(work), model)
        if (ours.resident_sequences or 0) < max(counts):
            ours = ours.model_copy(update={"resident_sequences": max(counts)})
        with open_runtime(ours, prewarm=False) as rt:
            return {
                "decode_batch": rt.tuning.decode_batch,
                "decode_batch_reason": rt.tuning.reasons["decode_batch"],
                "reply_tokens": max_tokens,
                "rounds": rounds,
                "rows": measure_replies(rt, counts, max_tokens, rounds),
            }


def render_replies(result: dict[str, Any]) -> str:
    lines = [
        f"decode with several replies at once: {result['reply_tokens']}-token replies, "
        f"median of {result['rounds']} rounds; decode_batch {result['decode_batch']} "
        f"({result['decode_batch_reason']})",
        "replies | together tok/s | per reply tok/s | shared steps"
        " | one at a time: together | per reply | together, batched / one at a time",
    ]
    for row in result["rows"]:
        b, s = row["batched"], row.get("serial")
        cells = [
            f"{row['replies']:>7}",
            f"{b['together_tok_s']:14.1f}",
            f"{b['per_reply_tok_s']:15.1f}",
            f"{b['shared_steps']:12.0f}",
        ]
        if s is not None:
            cells += [
                f"{s['together_tok_s']:23.1f}",
                f"{s['per_reply_tok_s']:9.1f}",
                f"{b['together_tok_s'] / max(s['together_tok_s'], 1e-9):.2f}",
            ]
        lines.append(" | ".join(cells))
    return "\n".join(lines)
