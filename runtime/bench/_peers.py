"""The client side of `bench_peers`: prompts, one streamed OpenAI request, the session
scenario and its table (the multi-client trace is `_trace`). No server is started here;
everything talks to a base URL, so the same code times warmstart, llama-server and
hearth-llm, and a test runs it against warmstart alone.
"""

from __future__ import annotations

import json
import math
import random
import statistics
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..errors import PeerError

Messages = list[dict[str, str]]

# A generated staff handbook: the benchmark's prompts are the same on every machine and
# in every run without a text file outside the repository.
_SUBJECTS = [
    "a customer",
    "a supplier",
    "a colleague",
    "the night shift",
    "a new hire",
    "the auditor",
    "a delivery driver",
    "the help desk",
    "a team lead",
    "a visitor",
]
_EVENTS = [
    "reports a damaged parcel",
    "asks for a refund",
    "misses a deadline",
    "loses a badge",
    "finds an error in an invoice",
    "requests overtime",
    "sends an angry email",
    "needs a spare key",
    "changes a shipping address",
    "forgets a password",
]
_ACTIONS = [
    "write it in the log",
    "call the duty manager",
    "confirm it by email",
    "open a ticket",
    "check the previous order",
    "ask for a photo",
    "lock the cabinet",
    "inform the finance team",
    "update the spreadsheet",
    "file the form in the blue folder",
]
_UNITS = ["minutes", "hours", "working days"]
QUESTIONS = [
    "What is KV cache?",
    "Explain pinned memory.",
    "Which rule covers refunds?",
    "Summarise rule 3 in one line.",
    "What should I do about a lost badge?",
    "Which rule is the strictest?",
]
FOLLOW_UP = "Say that again in one sentence."
# turn 2 is sent three times, each right after the same first reply, with another
# follow-up (a cached one would be another case): the row is their median
FOLLOW_UPS = (FOLLOW_UP, "Which rule did you use?", "Now in five words.")
# asked on A's system prompt after the restart, none of them asked before it
LATER_QUESTIONS = [
    "Who signs the overtime form?",
    "What goes in the blue folder?",
    "When is the duty manager called?",
]


def document(seed: int, chars: int) -> str:
    """A deterministic handbook of about `chars` characters (about 4 per token here)."""
    rng = random.Random(seed)
    rules: list[str] = [f"Handbook {seed}. Answer from these rules only."]
    size = len(rules[0])
    while size < chars:
        n = len(rules)
        rule = (
            f"Rule {n}. When {rng.choice(_SUBJECTS)} {rng.choice(_EVENTS)}, "
            f"{rng.choice(_ACTIONS)} within {rng.randint(2, 90)} {rng.choice(_UNITS)} "
            f"and then {rng.choice(_ACTIONS)}."
        )
        rules.append(rule)
        size += len(rule) + 1
    return "\n".join(rules)


def conversation(system: str, question: str, history: Sequence[tuple[str, str]] = ()) -> Messages:
    msgs = [{"role": "system", "content": system}]
    for q, a in history:
        msgs += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
    return [*msgs, {"role": "user", "content": question}]


@dataclass(frozen=True)
class Reply:
    ttft: float  # seconds from sending the request to the first streamed content
    decode_tps: float  # tokens/s after the first, first text to last (nan if under two)
    completion_tokens: int
    prompt_tokens: int
    cached_tokens: int | None
    text: str
    # the longest wait between two pieces of its text (nan if under two): how long a
    # reader watching it stream saw it stand still, other clients' prompts included
    longest_pause: float = math.nan


def ask(
    base_url: str,
    messages: Messages,
    max_tokens: int,
    timeout: float = 900,
    headers: dict[str, str] | None = None,
) -> Reply:
    """One greedy streamed chat completion, timed on the client side."""
    body = json.dumps(
        {
            "model": "default",
            "messages": messages,
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    ).encode()
    req = urllib.request.Request(
        f"{base_url}/v1/chat/completions",
        body,
        {"Content-Type": "application/json", **(headers or {})},
    )
    started = time.perf_counter()
    first: float | None = None
    last: float | None = None
    pause = 0.0  # the longest between two pieces so far
    usage: dict[str, object] = {}
    text: list[str] = []
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            for raw in resp:
                line = raw.decode().strip()
                if not line.startswith("data:") or line.endswith("[DONE]"):
                    continue
                chunk = json.loads(line[5:])
                piece = (chunk.get("choices") or [{}])[0].get("delta", {}).get("content")
                if piece:
                    now = time.perf_counter() - started
                    pause = pause if last is None else max(pause, now - last)
                    last = now
                    first = first if first is not None else last
                    text.append(piece)
                usage = chunk.get("usage") or usage
    except OSError as exc:  # urllib's HTTPError and URLError are OSErrors
        raise PeerError(f"{base_url}: the request failed: {exc}") from exc
    return _reply(started, first, last, usage, text, pause)


def _reply(
    started: float,
    first: float | None,
    last: float | None,
    usage: dict[str, object],
    pieces: list[str],
    longest_pause: float = 0.0,
) -> Reply:
    """Decode tok/s is timed from the first piece of text to the last: the end of a
    stream adds what a reply of its length does not decode (the end-of-turn token's
    step, the last chunks), and two builds' greedy replies differ in length. The
    tokens timed are those whose text came in ``pieces``: each piece carries one at
    least, and a token that shows no text is not among them. llama-server counts the
    end-of-turn token in ``completion_tokens`` (warmstart does not); it is decoded
    after the last piece, so counting it put one token too many over the same time
    (a 25-token reply read 4% faster than it streamed)."""
    total = time.perf_counter() - started
    n = int(usage.get("completion_tokens", 0))  # type: ignore[call-overload]
    timed = min(n, len(pieces))
    ttft = first if first is not None else total
    end = last if last is not None else total
    tps = (timed - 1) / (end - ttft) if timed > 1 and end > ttft else math.nan
    details = usage.get("prompt_tokens_details") or {}
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    prompt = int(usage.get("prompt_tokens", 0))  # type: ignore[call-overload]
    pause = longest_pause if len(pieces) > 1 else math.nan
    return Reply(ttft, tps, n, prompt, cached, "".join(pieces), pause)


# the session scenario --------------------------------------------------------------------
# the handbook's characters a token, as the default model (SmolLM2) tokenizes it; a
# synthetic model's byte vocabulary takes each byte as a token, and a space as three
CHARS_PER_TOKEN = 4.1
SYNTHETIC_CHARS_PER_TOKEN = 0.73
PROMPT_TOKENS = 1_800  # the case; --quick: a few hundred
QUICK_TOKENS = 300
LONG_TOKENS = 6_000  # the long-document variant


@dataclass(frozen=True)
class Prompts:
    a: str
    b: str
    max_tokens: int
    turns: int = 2  # A's turns sent back to back, each the moment the last reply ends

    @classmethod
    def make(
        cls,
        quick: bool,
        tokens: int | None = None,
        chars_per_token: float = CHARS_PER_TOKEN,
        long: bool = False,
    ) -> Prompts:
        """System prompts A and B of about ``tokens`` tokens each (by default the issue's
        case; ``long``: a long document, and three turns of A sent at once)."""
        tokens = tokens or (QUICK_TOKENS if quick else LONG_TOKENS if long else PROMPT_TOKENS)
        chars = round(tokens * chars_per_token)
        turns = 3 if long else 2
        return cls(document(1, chars), document(2, chars), 16 if quick else 64, turns)


Step = tuple[str, Callable[[dict[str, Reply]], Messages]]


def first_process_steps(p: Prompts) -> list[Step]:
    """In order: each label's request, given the replies so far. Turn 2 goes out the
    moment "A after B" ends, whose greedy reply is A's first one."""
    q1 = QUESTIONS[0]
    return [
        ("A cold", lambda r: conversation(p.a, q1)),
        ("A repeat", lambda r: conversation(p.a, q1)),
        ("B cold", lambda r: conversation(p.b, "Summarise the handbook.")),
        ("A after B", lambda r: conversation(p.a, q1)),
        ("A turn 2", _following(p.a, q1, FOLLOW_UPS[0])),
        *((("A turn 3", _third(p.a, q1, FOLLOW_UPS[0], QUESTIONS[2])),) if p.turns > 2 else ()),
        # turn 2 again, each time right after the same first reply (a live repeat)
        *(
            step
            for i, follow_up in enumerate(FOLLOW_UPS[1:], 2)
            for step in (
                (f"A again {i}", lambda r: conversation(p.a, q1)),
                (f"A turn 2 #{i}", _following(p.a, q1, follow_up)),
            )
        ),
        # five other questions, each a run of its own (a different system goes first
        # each time): the row is their median, not one draw of a case at parity
        *((label, _asking(p.a, q)) for label, q in zip(OTHER_Q, QUESTIONS[1:], strict=True)),
        *_decode_rounds(p, DECODE_ROUNDS),
    ]


# the decode rows: chat A's first request again, a live repeat on every system, in runs
# of one reply each (the systems alternate reply by reply, a different one first each
# time). This machine's speed moves by up to 10% from one minute to the next (the same
# server's 64-token replies read 63-75 tok/s within a run), more than the gap the row
# is there to show; two replies seconds apart see the same speed, so the row's ratio is
# the median of the rounds' ratios
DECODE_ROUNDS = tuple(f"decode round {i}" for i in range(1, 11))
DECODE_ROUNDS_RESTART = tuple(f"{label} after restart" for label in DECODE_ROUNDS)


def _decode_rounds(p: Prompts, labels: Sequence[str]) -> list[Step]:
    return [(label, _asking(p.a, QUESTIONS[0])) for label in labels]


COLD = ("A cold", "B cold")
OTHER_Q = ("A other q", *(f"A other q {i}" for i in range(2, len(QUESTIONS))))
TURN_2 = ("A turn 2", *(f"A turn 2 #{i}" for i in range(2, len(FOLLOW_UPS) + 1)))


def _following(
    system: str, question: str, follow_up: str
) -> Callable[[dict[str, Reply]], Messages]:
    """Turn 2: the first reply to ``question`` (A cold's) and a follow-up."""
    return lambda r: conversation(system, follow_up, [(question, r["A cold"].text)])


def _third(
    system: str, question: str, follow_up: str, third: str
) -> Callable[[dict[str, Reply]], Messages]:
    """Turn 3: the first two turns as they were answered, and another question."""
    return lambda r: conversation(
        system, third, [(question, r["A cold"].text), (follow_up, r["A turn 2"].text)]
    )


LATER_Q = tuple(f"{label} after restart" for label in OTHER_Q[: len(LATER_QUESTIONS)])


def _asking(system: str, question: str) -> Callable[[dict[str, Reply]], Messages]:
    return lambda r: conversation(system, question)


def restart_steps(p: Prompts) -> list[Step]:
    q1 = QUESTIONS[0]
    return [
        ("A after restart", lambda r: conversation(p.a, q1)),
        ("A turn 2 after restart", _following(p.a, q1, FOLLOW_UP)),
        # a third reply after the restart, and new questions on A's system prompt: the
        # after-restart decode row is a median of six replies, not of three
        ("B after restart", lambda r: conversation(p.b, "Summarise the handbook.")),
        *((label, _asking(p.a, q)) for label, q in zip(LATER_Q, LATER_QUESTIONS, strict=True)),
        *_decode_rounds(p, DECODE_ROUNDS_RESTART),
    ]


# steps sent the moment the one before them ends, on the same server
AT_ONCE = frozenset((*TURN_2, "A turn 3"))


def blocks(steps: list[Step]) -> list[list[Step]]:
    """The steps in runs that go out back to back: a step of AT_ONCE joins the one
    before it; every other step starts a run of its own."""
    out: list[list[Step]] = []
    for step in steps:
        if out and step[0] in AT_ONCE:
            out[-1].append(step)
        else:
            out.append([step])
    return out


def run_steps(base_url: str, steps: list[Step], max_tokens: int, replies: dict[str, Reply]) -> None:
    """Send each step in turn, adding its reply to `replies` under its label."""
    for label, build in steps:
        replies[label] = ask(base_url, build(replies), max_tokens)


# a reply shorter than this is not timed for decode: one pause would be its whole rate
TIMED_TOKENS = 8


def decode_rate(replies: dict[str, Reply], labels: Sequence[str]) -> float:
    """The median decode tok/s over the replies long enough to time (nan if none)."""
    rates = [
        replies[x].decode_tps
        for x in labels
        if x in replies and replies[x].completion_tokens >= TIMED_TOKENS
    ]
    return statistics.median(rates) if rates else math.nan


# the tables ------------------------------------------------------------------------------
SCENARIO_ROWS: list[tuple[str, str | tuple[str, ...]]] = [
    # two chats' cold prompts: one is a draw of a 7 to 10 s prefill that this machine's
    # drift moves by 10% from one system's turn to the next (A cold read 1.11, B 1.03)
    ("cold (mean of chats A and B)", COLD),
    ("live repeat of the same request", "A repeat"),
    ("the same chat after another chat", "A after B"),
    (
        f"turn 2 (whole history + follow-up) sent right after the reply (median of {len(TURN_2)})",
        TURN_2,
    ),
    ("turn 3 sent right after turn 2's reply (the long document)", "A turn 3"),
    (f"same system prompt, another question (median of {len(OTHER_Q)})", OTHER_Q),
    ("after a restart: the same request", "A after restart"),
    ("after a restart: turn 2", "A turn 2 after restart"),
    ("after a restart: the other chat", "B after restart"),
    (f"after a restart: another question (median of {len(LATER_Q)})", LATER_Q),
]
FIRST_LABELS = [label for label, _ in first_process_steps(Prompts("", "", 0))]
LONG_LABELS = [label for label, _ in first_process_steps(Prompts("", "", 0, turns=3))]
RESTART_LABELS = [label for label, _ in restart_steps(Prompts("", "", 0))]
# the session's own replies, cold prompts, hits and turns alike, without the decode rounds
SESSION_LABELS = [x for x in LONG_LABELS if x not in DECODE_ROUNDS]
SESSION_RESTART_LABELS = [x for x in RESTART_LABELS if x not in DECODE_ROUNDS_RESTART]
DECODE_ROWS = [
    ("decode, tok/s, the session's replies (first process)", SESSION_LABELS, False),
    ("decode, tok/s, the session's replies (after restart)", SESSION_RESTART_LABELS, False),
    (
        f"decode, tok/s, {len(DECODE_ROUNDS)} alternating live repeats (first process; "
        "ratio: the rounds' median)",
        DECODE_ROUNDS,
        True,
    ),
    (
        f"decode, tok/s, {len(DECODE_ROUNDS)} alternating live repeats (after restart; "
        "ratio: the rounds' median)",
        DECODE_ROUNDS_RESTART,
        True,
    ),
]


def _ttft(replies: dict[str, Reply], labels: str | Sequence[str]) -> float | None:
    """A case's TTFT: its reply's, or the median of its replies' (None if none ran)."""
    ttfts = [
        replies[x].ttft for x in ([labels] if isinstance(labels, str) else labels) if x in replies
    ]
    return statistics.median(ttfts) if ttfts else None


def _cell(value: float | None, unit: str = "s") -> str:
    if value is None or math.isnan(value):
        return "-"
    return f"{value:.3f} {unit}" if unit == "s" else f"{value:.1f}"


def _ratio(num: float | None, den: float | None) -> str:
    if num is None or den is None or math.isnan(num) or math.isnan(den) or den == 0:
        return "-"
    return f"{num / den:.2f}"


def _markdown(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    return "\n".join([*lines, *("| " + " | ".join(r) + " |" for r in rows)])


def scenario_table(
    results: dict[str, dict[str, Reply]],
    systems: Sequence[str],
    ratio: tuple[str, str] = ("warmstart", "llama-server"),
) -> str:
    """Markdown: TTFT per case and system, decode tok/s, and warmstart / llama-server."""
    shown = [s for s in systems if s in results]
    with_ratio = all(s in results for s in ratio)
    header = ["case (TTFT, client side)", *shown]
    header += [f"{ratio[0]} / {ratio[1]}"] if with_ratio else []
    rows = []
    for name, case in SCENARIO_ROWS:
        vals = {s: _ttft(results[s], case) for s in shown}
        if all(v is None for v in vals.values()):
            continue  # a case of another variant (turn 3 is the long document's)
        row = [name, *(_cell(vals[s]) for s in shown)]
        rows.append(row + ([_ratio(vals[ratio[0]], vals[ratio[1]])] if with_ratio else []))
    for name, labels, paired in DECODE_ROWS:
        vals_d = {s: decode_rate(results[s], labels) for s in shown}
        row = [name, *(_cell(vals_d[s], "tok/s") for s in shown)]
        if with_ratio:
            num, den = results[ratio[0]], results[ratio[1]]
            cell = (
                _paired(num, den, labels) if paired else _ratio(vals_d[ratio[0]], vals_d[ratio[1]])
            )
            row.append(cell)
        rows.append(row)
    return _markdown(header, rows)


def _paired(num: dict[str, Reply], den: dict[str, Reply], labels: Sequence[str]) -> str:
    """The median over ``labels`` of one system's decode rate over the other's, each
    pair of replies timed seconds apart ("-" if no pair is long enough to time)."""
    ratios = [
        num[x].decode_tps / den[x].decode_tps
        for x in labels
        if x in num
        and x in den
        and min(num[x].completion_tokens, den[x].completion_tokens) >= TIMED_TOKENS
        and den[x].decode_tps > 0
        and not math.isnan(num[x].decode_tps / den[x].decode_tps)
    ]
    return f"{statistics.median(ratios):.2f}" if ratios else "-"
