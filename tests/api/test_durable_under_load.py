"""Durability under load (issue 43): captures and disk writes yield to waiting
clients, but a chat answered more than ``durable_after_s`` before a crash is on disk
whatever the load. A burst of new chats from two clients, the server SIGKILLed right
after a reply, a restart: every chat answered more than the interval before the kill
has its prompt cached."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import httpx

from tests.api.conftest import Server

INTERVAL_S = 2.0
CLIENTS = 4  # more than the fake's sequences: a client always waits
CHATS_EACH = 5


# The fake engine numbers words as it first meets them, per process: every prompt is
# made of these words, which the first request of each server process (VOCABULARY)
# numbers in the same order, so that a prompt has the same ids after the restart.
WORDS = [f"w{n}" for n in range(200)]
VOCABULARY = " ".join(WORDS)


def _prompt(client: int, i: int) -> str:
    first = WORDS[client * 10 + i]  # a chat of its own from its first chunk on
    return " ".join([first, *(WORDS[(k * (client + 3) + i) % len(WORDS)] for k in range(120))])


def _ask(srv: Server, text: str, max_tokens: int) -> dict[str, Any]:
    body = {"messages": [{"role": "user", "content": text}], "max_tokens": max_tokens}
    reply = httpx.post(srv.v1 + "/chat/completions", json=body, timeout=120)
    reply.raise_for_status()
    return reply.json()


def test_chats_answered_before_the_interval_survive_a_kill(start: Any, tmp_path: Path) -> None:
    data = tmp_path / "data"
    env = {"WARMSTART_DURABLE_AFTER_S": str(INTERVAL_S)}
    fake = ("--token-delay", "0.02", "--slots", "2", "--prefill-delay", "0.002")
    answered: list[tuple[float, str]] = []
    lock = threading.Lock()
    with start("--data-dir", str(data), fake_args=fake, env=env) as srv:
        _ask(srv, VOCABULARY, 1)
        killed_at: list[float] = []

        def client(n: int) -> None:
            for i in range(CHATS_EACH):
                text = _prompt(n, i)
                try:
                    _ask(srv, text, 24)
                except httpx.HTTPError:
                    return  # the server was killed meanwhile
                with lock:
                    if killed_at:
                        return
                    answered.append((time.monotonic(), text))
                    if len(answered) == CLIENTS * CHATS_EACH - 4:  # right after a reply
                        srv.process.kill()
                        killed_at.append(time.monotonic())
                        return

        clients = [threading.Thread(target=client, args=(n,)) for n in range(CLIENTS)]
        for thread in clients:
            thread.start()
        for thread in clients:
            thread.join()
        srv.process.wait()
    assert killed_at, "the burst ended before the kill"
    early = [text for when, text in answered if killed_at[0] - when > INTERVAL_S]
    assert len(early) >= 4, "the burst was too short to test anything"
    with start("--data-dir", str(data), fake_args=fake, env=env) as again:
        _ask(again, VOCABULARY, 1)
        lost = [text for text in early if _cached(_ask(again, text, 1)) == 0]
    assert not lost, f"{len(lost)} of {len(early)} chats answered before the interval were lost"


def _cached(reply: dict[str, Any]) -> int:
    return int(reply["usage"]["prompt_tokens_details"]["cached_tokens"])
