"""`make bench-peers PEERS_ARGS=--paste`: the paste scenario (`_paste.py`) over HTTP,
warmstart beside llama-server on the same model, prompts and machine, in one run.

Both servers are up at once; each case runs on one, then the other (who goes first
rotates), a quiet pause between. The cases, time to first token after Enter:

- cold: a paste and the question, nothing cached, no drafts ("without drafts");
- live hit: that conversation live, another question of the same length: llama-server
  reuses its slot's prompt (cache_prompt), warmstart its live sequence;
- exact repeat: the live hit's request again (computes nothing);
- after Enter: another paste, the question typed at a person's speed, then Enter.
  warmstart gets the drafts the app sends (``POST /v1/warmstart/prefill``) while the
  question is typed; llama-server has no such route, so Enter finds nothing of the
  paste and prefills it all.

Prints a Markdown table and the ratios; asserts nothing.
"""

from __future__ import annotations

import contextlib
import json
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import PeerError
from . import _peers
from ._paste import (
    OTHER_QUESTION,
    QUESTION,
    SYSTEM,
    Typing,
    paste_text,
    type_question,
    typing_line,
    user_text,
)
from ._servers import Server, running, server_env, wait_quiet

SESSION_HEADER = "X-Warmstart-Session"  # the app's; llama-server ignores it
SYSTEMS = ("llama-server", "warmstart")
QUIET_S = 3.0  # between two systems' cases: warmstart's disk writes wait up to 2 s
MAX_TOKENS = 16
CASES = (
    ("cold", "cold: the paste and the question, nothing cached, no drafts"),
    ("live", "live hit: the paste live, another question of the same length"),
    ("repeat", "exact repeat of the live hit's request (computes nothing)"),
    ("enter", "after Enter: another paste, typed with drafts (llama-server: none)"),
)
Case = Callable[[str, str], _peers.Reply]  # (base URL, system) -> the reply after Enter


def conversation(paste: str, typed: str) -> _peers.Messages:
    return [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": user_text(paste, typed)},
    ]


def send_draft(base_url: str, messages: _peers.Messages, session: str) -> dict[str, Any]:
    """One draft as the app sends it; its answer when the server stops computing it."""
    body = json.dumps({"model": "default", "messages": messages}).encode()
    headers = {"Content-Type": "application/json", SESSION_HEADER: session}
    req = urllib.request.Request(f"{base_url}/v1/warmstart/prefill", body, headers)
    try:
        with urllib.request.urlopen(req, timeout=900) as resp:
            got = json.loads(resp.read())
    except OSError as exc:  # urllib's HTTPError and URLError are OSErrors
        raise PeerError(f"{base_url}: a draft failed: {exc}") from exc
    return {"state": got["state"], "ready": got["ready_tokens"], "certain": got["certain_tokens"]}


class PasteRun:
    """The cases for one paste size and typing time; what the typing did on warmstart."""

    def __init__(self, tokens: int, type_s: float) -> None:
        self.a, self.b = paste_text(tokens, "A"), paste_text(tokens, "B")
        self.type_s = type_s
        self.typing: Typing | None = None

    def cases(self) -> list[tuple[str, Case]]:
        return [
            ("cold", lambda url, _: self._ask(url, self.a, QUESTION, "paste-live")),
            ("live", lambda url, _: self._ask(url, self.a, OTHER_QUESTION, "paste-live")),
            ("repeat", lambda url, _: self._ask(url, self.a, OTHER_QUESTION, "paste-live")),
            ("enter", self._enter),
        ]

    def _ask(self, url: str, paste: str, question: str, session: str) -> _peers.Reply:
        messages = conversation(paste, question)
        return _peers.ask(url, messages, MAX_TOKENS, headers={SESSION_HEADER: session})

    def _enter(self, url: str, system: str) -> _peers.Reply:
        if system != "warmstart":  # no draft route: Enter is where its prefill starts
            return self._ask(url, self.b, QUESTION, "paste-drafts")
        self.typing = type_question(
            lambda typed: send_draft(url, conversation(self.b, typed), "paste-drafts"), self.type_s
        )
        reply = self._ask(url, self.b, QUESTION, "paste-drafts")
        self.typing.join()
        return reply


def run_paste_peers(
    servers: list[Server], homes: list[Path], run: PasteRun
) -> dict[str, dict[str, _peers.Reply]]:
    """Every case on every system, all of them up at once (see the module docstring)."""
    systems = [(s, home, server_env(s, home)) for s, home in zip(servers, homes, strict=True)]
    for server, home, env in systems:
        if server.prepare is not None:
            server.prepare(home, env)
    replies: dict[str, dict[str, _peers.Reply]] = {s.name: {} for s in servers}
    with contextlib.ExitStack() as stack:
        urls = [stack.enter_context(running(s, home, "paste", env)) for s, home, env in systems]
        for i, (label, case) in enumerate(run.cases()):
            for k in range(len(systems)):
                j = (i + k) % len(systems)
                time.sleep(QUIET_S)  # the one before has stored what it computed
                wait_quiet(urls)
                name = systems[j][0].name
                replies[name][label] = case(urls[j], name)
    return replies


def render_paste_peers(replies: dict[str, dict[str, _peers.Reply]], run: PasteRun) -> str:
    """The cases' table (TTFT and cached tokens on each system), then the ratios the
    issue asks about and whether the drafts had the paste ready before Enter."""
    shown = [s for s in SYSTEMS if s in replies]
    both = len(shown) == len(SYSTEMS)
    ttft = {(s, label): _peers._ttft(replies[s], label) for s in shown for label, _ in CASES}
    header = ["TTFT after Enter, client side (cached tokens)", *shown]
    rows = [[name, *(_cell(replies[s].get(label)) for s in shown)] for label, name in CASES]
    if both:
        header.append("warmstart / llama-server")
        for row, (label, _) in zip(rows, CASES, strict=True):
            row.append(_peers._ratio(ttft["warmstart", label], ttft["llama-server", label]))
    out = [_peers._markdown(header, rows), ""]
    enter = replies.get("warmstart", {}).get("enter")
    if enter is not None:
        out.append(
            f"warmstart's prompt after Enter: {enter.prompt_tokens:,} tokens, the "
            f"{len(QUESTION)}-character question typed over {run.type_s:.1f} s"
        )
    # (what, the other case's system and label, whether the drafted case is on top)
    ratios = [
        ("warmstart with drafts / its live hit (issue 40: at most 3)", "warmstart", "live", True),
        (
            "warmstart without drafts / with drafts (issue 40: at least 20)",
            "warmstart",
            "cold",
            False,
        ),
        ("llama-server after Enter / warmstart with drafts", "llama-server", "enter", False),
        ("warmstart with drafts / llama-server's live hit", "llama-server", "live", True),
    ]
    for name, system, label, on_top in ratios:
        if system in shown and "warmstart" in shown:
            other, drafted = ttft[system, label], ttft["warmstart", "enter"]
            out.append(
                f"{name}: {_peers._ratio(*((drafted, other) if on_top else (other, drafted)))}"
            )
    if run.typing is not None:
        out.append("warmstart: " + typing_line(run.typing.as_dict()))
    return "\n".join(out)


def _cell(reply: _peers.Reply | None) -> str:
    if reply is None:
        return "-"
    cached = "?" if reply.cached_tokens is None else f"{reply.cached_tokens:,}"
    return f"{reply.ttft:.3f} s ({cached})"
