"""`warmstart bench --paste`: a long text pasted into the message box, a question
typed at a person's speed with drafts sent as the app sends them, then Enter.

Side by side in one run, time to first token after Enter:

- cold: a paste and the question, nothing of it cached, no drafts;
- live hit: that conversation live (its system prompt and paste) and another
  question of the same length asked in it: the paste is cached, the new words are
  computed after Enter, as they are with drafts (what a user calls a hit);
- exact repeat: the last request again, live: nothing is computed, its first token
  comes from the logits kept (a floor, not what a user meets after typing);
- with drafts: another paste, the question typed with drafts, then Enter.

And whether the drafts had finished the paste before Enter. Prints figures; asserts
nothing. ``make bench-peers --paste`` runs the same over HTTP beside llama-server.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..settings import Settings
from ..types import Message, Request, Sampling, Token

SYSTEM = "You are a helpful assistant. Answer briefly and precisely."
QUESTION = "Which station reported the most litres in the afternoon, and at what time?"
# the live hit's question: as long as QUESTION, another text from its first word on
OTHER_QUESTION = "Where did pumps report the fewest litres in the morning, and on which day?"
TYPING_CHARS_PER_S = 4.5  # a person typing a question (about 50 words a minute)
TYPE_SECONDS = len(QUESTION) / TYPING_CHARS_PER_S  # the default: about 16 s
TYPING_CHARS = 12  # a draft after every few characters typed (the app: a pause)
LAST_PAUSE_S = 0.4  # from the last draft to Enter (the app's debounce)


def paste_text(tokens: int, tag: str) -> str:
    """A report of about ``tokens`` tokens (about 16 a line), distinct per ``tag``."""
    lines = [f"Report {tag}, pump stations, one reading a line."]
    for i in range(max(1, tokens // 16)):
        lines.append(f"{i % 24:02d}:{i * 7 % 60:02d} station {i % 9} pumped {i * 37 % 1000} litres")
    return "\n".join(lines)


def user_text(paste: str, typed: str) -> str:
    """The message box: the paste, a blank line, the question typed so far."""
    return f"{paste}\n\n{typed}"


@dataclass
class Typing:
    """What the drafts sent while the question was typed did: each one's answer and
    when it came, and when Enter was pressed (seconds after the paste)."""

    enter_s: float = 0.0
    drafts: list[dict[str, Any]] = field(default_factory=list)
    threads: list[threading.Thread] = field(default_factory=list)

    def join(self) -> None:
        """Waits for every draft's answer (the last ones end at Enter's request)."""
        for thread in self.threads:
            thread.join()

    @property
    def first_ready_s(self) -> float | None:
        """When a draft first had all its certain tokens computed: the paste (and the
        question as typed then) was ready from that moment."""
        ready = [d["after_s"] for d in self.drafts if d["state"] == "ready"]
        return min(ready) if ready else None

    def as_dict(self) -> dict[str, Any]:
        first = self.first_ready_s
        return {
            "enter_s": self.enter_s,
            "paste_ready_s": first,
            "paste_ready_before_enter": first is not None and first <= self.enter_s,
            "drafts": self.drafts,
        }


def type_question(send: Callable[[str], dict[str, Any]], type_s: float) -> Typing:
    """The paste goes out as a draft at once; then one every TYPING_CHARS characters
    of QUESTION, spread over ``type_s`` seconds, each in a thread of its own as the
    app's requests are (a newer one supersedes the one in progress). ``send(typed)``
    sends the draft with the question typed so far and returns its answer. Returns
    at Enter, a pause after the last draft sent; ``join()`` it after Enter's request."""
    typing = Typing()
    lock = threading.Lock()
    t0 = time.perf_counter()

    def draft(typed: str) -> None:
        answer = {**send(typed), "typed": len(typed), "after_s": _since(t0)}
        with lock:
            typing.drafts.append(answer)

    steps = list(range(0, len(QUESTION), TYPING_CHARS))
    for i, chars in enumerate(steps):
        thread = threading.Thread(target=draft, args=(QUESTION[:chars],), daemon=True)
        thread.start()
        typing.threads.append(thread)
        time.sleep(type_s / len(steps) if i < len(steps) - 1 else LAST_PAUSE_S)
    typing.enter_s = _since(t0)
    return typing


def _since(t0: float) -> float:
    return time.perf_counter() - t0


def _request(paste: str, typed: str, session: str) -> Request:
    messages = (Message("system", SYSTEM), Message("user", user_text(paste, typed)))
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


def run_paste(settings: Settings, tokens: int, type_s: float | None = None) -> dict[str, Any]:
    """The four rows in one process (see the module docstring); ``type_s``: how long
    the question takes to type (default TYPE_SECONDS)."""
    from ..serving import open_runtime

    type_s = TYPE_SECONDS if type_s is None else type_s

    rt = open_runtime(settings, prewarm=False)
    try:
        rows: dict[str, dict[str, Any]] = {}
        pasted = paste_text(tokens, "A")
        for row, question in (
            ("cold", QUESTION),
            ("live", OTHER_QUESTION),
            ("repeat", OTHER_QUESTION),
        ):
            rows[row] = _ttft(rt, _request(pasted, question, "bench-live"))
            rt.wait_idle()
        paste = paste_text(tokens, "B")

        def send(typed: str) -> dict[str, Any]:
            d = rt.prefill_draft(_request(paste, typed, "bench-drafts"))
            return {"state": d.state, "ready": d.ready, "certain": d.certain}

        typing = type_question(send, type_s)
        rows["drafted"] = _ttft(rt, _request(paste, QUESTION, "bench-drafts"))
        typing.join()
    finally:
        rt.close()
    return paste_result(rows, typing, type_s)


def paste_result(rows: dict[str, dict[str, Any]], typing: Typing, type_s: float) -> dict[str, Any]:
    """The rows (each with ``ttft_s`` and its usage), the typing, and the ratios."""
    ttft = {row: r["ttft_s"] for row, r in rows.items()}
    return {
        "paste_tokens": rows["drafted"]["prompt_tokens"],
        "type_s": type_s,
        "question_chars": len(QUESTION),
        **rows,
        "typing": typing.as_dict(),
        "drafted_vs_live": ttft["drafted"] / ttft["live"],
        "drafted_vs_repeat": ttft["drafted"] / ttft["repeat"],
        "cold_vs_drafted": ttft["cold"] / ttft["drafted"],
    }


ROWS = (
    ("cold", "without drafts: the paste and question, nothing cached"),
    ("live", "live hit: the paste live, another question of the same length"),
    ("repeat", "exact repeat of the live hit's request (computes nothing)"),
    ("drafted", "with drafts: another paste, drafts while typing, then Enter"),
)


def render_paste(r: dict[str, Any]) -> str:
    lines = [
        f"paste of {r['paste_tokens']:,} prompt tokens; a {r['question_chars']}-character "
        f"question typed over {r['type_s']:.1f} s with drafts, then Enter",
        f"  {'TTFT after Enter':<64} {'TTFT':>9}  cached  computed",
    ]
    for row, label in ROWS:
        x = r[row]
        lines.append(
            f"  {label:<64} {x['ttft_s']:7.3f} s {x['cached_tokens']:7,} {x['prefilled_tokens']:9,}"
        )
    lines += [
        f"  with drafts / live hit      {r['drafted_vs_live']:7.2f}x  (issue 40: at most 3x)",
        f"  cold / with drafts          {r['cold_vs_drafted']:7.1f}x  (issue 40: at least 20x)",
        f"  with drafts / exact repeat  {r['drafted_vs_repeat']:7.1f}x",
        "  " + typing_line(r["typing"]),
    ]
    return "\n".join(lines)


def typing_line(t: dict[str, Any]) -> str:
    """Whether the drafts had the paste ready before Enter."""
    if t["paste_ready_before_enter"]:
        return (
            f"the drafts had the paste ready {t['paste_ready_s']:.1f} s after it was pasted, "
            f"before Enter at {t['enter_s']:.1f} s"
        )
    late = "never" if t["paste_ready_s"] is None else f"only at {t['paste_ready_s']:.1f} s"
    return (
        f"the drafts had NOT finished the paste when Enter was pressed at {t['enter_s']:.1f} s "
        f"(ready {late}): typing was shorter than the paste's prefill"
    )
