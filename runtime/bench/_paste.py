"""`warmstart bench --paste`: a long text pasted into the message box, a question
typed over some seconds with drafts sent as the app sends them, then Enter. Time to
first token after Enter with drafts, without them (the same scenario on another
paste: nothing of it cached), and a live hit's (the same prompt again), side by side
in one run, with the ratios. Prints figures; asserts nothing."""

from __future__ import annotations

import threading
import time
from typing import Any

from ..settings import Settings
from ..types import Message, Request, Sampling, Token

SYSTEM = "You are a helpful assistant. Answer briefly and precisely."
QUESTION = "Which station reported the most litres in the afternoon, and at what time?"
TYPING_CHARS = 12  # a draft after every few characters typed (the app: a pause)


def paste_text(tokens: int, tag: str) -> str:
    """A report of about ``tokens`` tokens (about 16 a line), distinct per ``tag``."""
    lines = [f"Report {tag}, pump stations, one reading a line."]
    for i in range(max(1, tokens // 16)):
        lines.append(f"{i % 24:02d}:{i * 7 % 60:02d} station {i % 9} pumped {i * 37 % 1000} litres")
    return "\n".join(lines)


def _request(paste: str, typed: str, session: str) -> Request:
    messages = (Message("system", SYSTEM), Message("user", f"{paste}\n\n{typed}"))
    return Request(messages=messages, sampling=Sampling(max_tokens=16), session_id=session)


def _ttft(rt: Any, request: Request) -> dict[str, Any]:
    t0 = time.perf_counter()
    ttft, report = None, None
    for event in rt.generate(request):
        if isinstance(event, Token):
            ttft = ttft if ttft is not None else time.perf_counter() - t0
        else:
            report = event.report
    assert report is not None
    return {"ttft_s": ttft if ttft is not None else time.perf_counter() - t0, **report.as_dict()}


def _typed_with_drafts(rt: Any, paste: str, session: str, type_s: float) -> list[dict[str, Any]]:
    """The paste goes out as a draft at once; then one every TYPING_CHARS characters
    of the question, spread over ``type_s`` seconds (each in a thread of its own, as
    the app's requests are: a newer one supersedes the one in progress)."""
    outcomes: list[dict[str, Any]] = []
    threads = []
    steps = list(range(0, len(QUESTION), TYPING_CHARS))

    def send(typed: str) -> None:
        d = rt.prefill_draft(_request(paste, typed, session))
        outcomes.append({"state": d.state, "ready": d.ready, "certain": d.certain})

    for i, chars in enumerate(steps):
        thread = threading.Thread(target=send, args=(QUESTION[:chars],), daemon=True)
        thread.start()
        threads.append(thread)
        time.sleep(type_s / len(steps) if i < len(steps) - 1 else 0.4)  # the last pause
    return outcomes


def run_paste(settings: Settings, tokens: int, type_s: float) -> dict[str, Any]:
    from ..serving import open_runtime

    rt = open_runtime(settings, prewarm=False)
    try:
        cold = _ttft(rt, _request(paste_text(tokens, "A"), QUESTION, "bench-cold"))
        rt.wait_idle()
        live = _ttft(rt, _request(paste_text(tokens, "A"), QUESTION, "bench-cold"))
        rt.wait_idle()
        paste = paste_text(tokens, "B")
        drafts = _typed_with_drafts(rt, paste, "bench-drafts", type_s)
        drafted = _ttft(rt, _request(paste, QUESTION, "bench-drafts"))
    finally:
        rt.close()
    return {
        "paste_tokens": drafted["prompt_tokens"],
        "type_s": type_s,
        "cold": cold,
        "live": live,
        "drafted": drafted,
        "drafts": drafts,
        "drafted_vs_live": drafted["ttft_s"] / live["ttft_s"],
        "cold_vs_drafted": cold["ttft_s"] / drafted["ttft_s"],
    }


def render_paste(r: dict[str, Any]) -> str:
    d = r["drafted"]
    return "\n".join(
        [
            f"paste of {r['paste_tokens']:,} prompt tokens, typed over {r['type_s']:.0f} s",
            f"  without drafts (cold)  TTFT {r['cold']['ttft_s']:8.3f} s",
            f"  with drafts            TTFT {d['ttft_s']:8.3f} s"
            f"  ({d['cached_tokens']:,} tokens cached, {d['prefilled_tokens']:,} prefilled)",
            f"  live hit (same again)  TTFT {r['live']['ttft_s']:8.3f} s",
            f"  with drafts / live hit {r['drafted_vs_live']:6.2f}x   (issue 40: at most 3x)",
            f"  cold / with drafts     {r['cold_vs_drafted']:6.1f}x   (issue 40: at least 20x)",
        ]
    )
