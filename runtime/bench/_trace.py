"""The trace of `bench_peers`: several clients, each with chats of its own, sending their
turns back to back against one server; percentiles, tokens/s over the trace, and, from
warmstart's own endpoints, how many decode steps several replies shared."""

from __future__ import annotations

import json
import math
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ..errors import PeerError
from ._peers import CHARS_PER_TOKEN, QUESTIONS, _cell, _markdown, ask, conversation, document

CLIENTS = 4  # the trace; --clients sets another count


@dataclass(frozen=True)
class TracePlan:
    clients: int
    chats: int  # per client, each with a system prompt of its own
    turns: int
    system_chars: int
    max_tokens: int
    # the questions' share of their length kept: a byte-level tokenizer (a synthetic
    # model's) makes about five times the tokens of a real one of the same text, so its
    # questions are cut as its system prompts are (a real model's new message is a
    # handful of tokens, and the scheduler treats a short prompt otherwise)
    question_scale: float = 1.0

    @classmethod
    def make(
        cls, quick: bool, chars_per_token: float = CHARS_PER_TOKEN, clients: int = CLIENTS
    ) -> TracePlan:
        # N clients x 3 chats: 3N conversations of ~400-token system prompts, more than
        # the N that each server keeps live in the same total context
        if clients < 1:
            raise PeerError(f"the trace needs at least one client, not {clients}")
        scale = chars_per_token / CHARS_PER_TOKEN
        if quick:
            return cls(clients, 2, 2, round(400 * scale), max_tokens=8, question_scale=scale)
        return cls(clients, 3, 3, round(1_600 * scale), max_tokens=16, question_scale=scale)

    def question(self, i: int) -> str:
        """The i-th question (in turn), cut to ``question_scale`` of its length."""
        text = QUESTIONS[i % len(QUESTIONS)]
        return (
            text
            if self.question_scale >= 1
            else text[: max(3, round(len(text) * self.question_scale))]
        )

    @property
    def requests(self) -> int:
        return self.clients * self.chats * self.turns


@dataclass
class Batching:
    """What a warmstart server says of its decode batching after a trace: decode steps
    that held several replies' tokens, those tokens, and its ``decode_batch`` setting
    with the reason it was chosen (the calibration's probe, or why not)."""

    steps: int = 0
    tokens: int = 0
    most: int = 1
    reason: str = ""
    # a decode step's mean ms by the replies it held, each run's mean pooled unweighted
    step_ms: dict[int, float] = field(default_factory=dict)
    runs: int = 1

    def pool(self, other: Batching) -> None:
        """Adds another run's (or pooled runs') figures to these."""
        self.steps += other.steps
        self.tokens += other.tokens
        self.reason = other.reason
        for n, ms in other.step_ms.items():
            had, runs = self.step_ms.get(n), self.runs
            self.step_ms[n] = (
                ms if had is None else (had * runs + ms * other.runs) / (runs + other.runs)
            )
        self.runs += other.runs


@dataclass(frozen=True)
class Request:
    """One request of a trace as its client saw it (``--trace-log``): who sent it, when
    (seconds after the trace began), and what came back."""

    client: int
    chat: int
    turn: int
    sent_s: float
    ttft: float
    decode_tps: float
    longest_pause: float
    completion_tokens: int
    prompt_tokens: int
    cached_tokens: int | None


@dataclass
class TraceResult:
    """A trace's requests (in the order they ended) and the figures drawn from them."""

    requests: list[Request] = field(default_factory=list)
    wall_s: float = 0.0
    errors: list[str] = field(default_factory=list)
    batching: Batching | None = None  # None: the server has no such figures

    @property
    def ttfts(self) -> list[float]:
        return [r.ttft for r in self.requests]

    @property
    def decode_tps(self) -> list[float]:
        """Each reply's decode rate, of replies long enough to have one (4 tokens)."""
        return [r.decode_tps for r in self.requests if r.completion_tokens >= 4]

    @property
    def pauses(self) -> list[float]:
        """Each reply's longest pause between two pieces of its text (where it had two)."""
        return [r.longest_pause for r in self.requests if not math.isnan(r.longest_pause)]

    @property
    def completion_tokens(self) -> int:
        return sum(r.completion_tokens for r in self.requests)

    def add(self, other: TraceResult) -> None:
        """Pools another run of the same trace into this one."""
        self.requests += other.requests
        self.wall_s += other.wall_s
        self.errors += other.errors
        if other.batching is not None:
            if self.batching is None:
                self.batching = Batching(most=other.batching.most, runs=0)
            self.batching.pool(other.batching)


def _client(
    base_url: str,
    plan: TracePlan,
    index: int,
    out: TraceResult,
    lock: threading.Lock,
    start: threading.Barrier,
    began: list[float],
) -> None:
    """One user: turn 1 of each chat, then back to the oldest for turn 2, and so on."""
    systems = [document(100 + index * plan.chats + c, plan.system_chars) for c in range(plan.chats)]
    history: list[list[tuple[str, str]]] = [[] for _ in systems]
    start.wait()
    for turn in range(plan.turns):
        for chat, system in enumerate(systems):
            question = plan.question(turn + chat + index)
            sent = time.perf_counter()
            try:
                reply = ask(
                    base_url, conversation(system, question, history[chat]), plan.max_tokens
                )
            except PeerError as exc:
                with lock:
                    out.errors.append(str(exc))
                return
            history[chat].append((question, reply.text))
            with lock:
                out.requests.append(
                    Request(
                        index, chat, turn, sent - began[0], reply.ttft, reply.decode_tps,
                        reply.longest_pause, reply.completion_tokens, reply.prompt_tokens,
                        reply.cached_tokens,
                    )
                )  # fmt: skip


def run_trace(base_url: str, plan: TracePlan) -> TraceResult:
    """Every client's requests, the clients at once; then the server's batching figures
    (counted over this server's life: a trace runs on a fresh one)."""
    out, lock = TraceResult(), threading.Lock()
    began = [0.0]  # set as the clients start
    start = threading.Barrier(
        plan.clients + 1, action=lambda: began.__setitem__(0, time.perf_counter())
    )
    threads = [
        threading.Thread(
            target=_client, args=(base_url, plan, i, out, lock, start, began), daemon=True
        )
        for i in range(plan.clients)
    ]
    for t in threads:
        t.start()
    start.wait()
    for t in threads:
        t.join()
    out.wall_s = time.perf_counter() - began[0]
    if out.errors:
        raise PeerError(f"{base_url}: {len(out.errors)} trace requests failed: {out.errors[0]}")
    out.batching = batching(base_url)
    return out


def _get(url: str) -> dict[str, object]:
    with urllib.request.urlopen(url, timeout=30) as resp:
        return dict(json.loads(resp.read()))


def batching(base_url: str) -> Batching | None:
    """warmstart's batching figures (its stats and its decode_batch setting); None from
    a server without them (llama-server answers 404)."""
    try:
        stats = _get(f"{base_url}/v1/warmstart/stats")
        setting = _get(f"{base_url}/v1/warmstart/settings").get("decode_batch")
    except (OSError, ValueError):  # urllib's HTTPError and URLError are OSErrors
        return None
    most = setting if isinstance(setting, dict) else {}
    step_ms = stats.get("decode_step_ms")
    return Batching(
        steps=int(stats.get("batched_steps", 0)),  # type: ignore[call-overload]
        tokens=int(stats.get("batched_tokens", 0)),  # type: ignore[call-overload]
        most=int(most.get("value", 1)),
        reason=str(most.get("reason", "")),
        step_ms={int(n): float(ms) for n, ms in step_ms.items()}
        if isinstance(step_ms, dict)
        else {},
    )


def percentile(values: Sequence[float], p: float) -> float:
    """The nearest-rank percentile (P99 of 36 samples is the largest): nan when empty."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def _shared(r: TraceResult) -> str:
    """Decode steps several replies shared, their tokens, and those tokens as a share of
    the replies' tokens: a reply that ends at its end-of-turn token decodes its last one
    too (its logits give that end), so the share of those after the first read 101%."""
    if r.batching is None:
        return "-"
    tokens = r.completion_tokens
    share = f", {100 * r.batching.tokens / tokens:.0f}% of the replies' tokens" if tokens else ""
    return f"{r.batching.steps} steps ({r.batching.tokens} tokens{share})"


def _steps(b: Batching) -> str:
    """A decode step's mean time by the replies it held (what sharing a step costs)."""
    if not b.step_ms:
        return ""
    parts = ", ".join(f"{n}: {ms:.0f} ms" for n, ms in sorted(b.step_ms.items()))
    return f"; a decode step by the replies it held, mean: {parts}"


def trace_table(results: dict[str, TraceResult], plan: TracePlan) -> str:
    header = ["trace", *results]
    stats: list[tuple[str, Callable[[TraceResult], float], str]] = [
        ("P50 TTFT", lambda r: percentile(r.ttfts, 50), "s"),
        ("P99 TTFT", lambda r: percentile(r.ttfts, 99), "s"),
        ("decode, tok/s (median request)", lambda r: percentile(r.decode_tps, 50), "tok/s"),
        # what the tail of first tokens is traded against: a reply being read stands
        # still while other clients' prompts are computed
        ("P99 of a reply's longest pause", lambda r: percentile(r.pauses, 99), "s"),
        ("tokens/s over the trace", lambda r: r.completion_tokens / r.wall_s, "tok/s"),
        ("wall time (all runs)", lambda r: r.wall_s, "s"),
    ]
    rows = [[name, *(_cell(fn(r), unit) for r in results.values())] for name, fn, unit in stats]
    rounds = max((len(r.ttfts) // plan.requests for r in results.values()), default=1)
    rows.append(
        [
            "decode steps shared by several replies",
            *(_shared(r) for r in results.values()),
        ]
    )
    title = (
        f"{plan.clients} clients x {plan.chats} chats x {plan.turns} turns "
        f"({plan.requests} requests, {plan.max_tokens}-token replies)"
    )
    if rounds > 1:
        title += (
            f", run {rounds} times on each system, interleaved (one then the other, then "
            "the other way round); the figures pool every run"
        )
    notes = [
        f"{name}: decode_batch {r.batching.most} ({r.batching.reason})" + _steps(r.batching)
        for name, r in results.items()
        if r.batching is not None
    ]
    return "\n\n".join([title, _markdown(header, rows), *notes])
