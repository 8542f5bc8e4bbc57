"""The soak run's load: a household's clients against one server (`_soak`).

Each client belongs to a user and, until told to stop, does what a household does:
opens a chat, asks a follow-up, runs a tool loop (a call forced by ``tool_choice``,
its result sent back, the answer), pastes a long document, or goes back to an old
chat of its user. Every request is greedy (temperature 0) and recorded with what it
was sent, so a sample can be asked again of a ``--no-cache`` server; every failure
is recorded by kind. While the server is down (killed and restarting) clients wait.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from ._peers import FOLLOW_UPS, QUESTIONS, document

Body = dict[str, Any]
# the weather tool of the API's tool tests, the same in every tool loop of a user, so
# that its definition is a prefix the user's chats share
WEATHER: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather forecast for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city", "days"],
            "additionalProperties": False,
        },
    },
}
CITIES = ["Lyon", "Porto", "Turku", "Graz", "Ghent", "Bergen", "Cork", "Brno"]
DOC_TOKENS = (300, 600, 1000, 1400)  # a pasted document, about this many tokens
CHARS_PER_TOKEN = 4.1  # the handbook's, as the default model tokenizes it


@dataclass
class Exchange:
    """One request and what became of it."""

    user: str
    kind: str  # chat, follow-up, tool-call, tool-answer, document, return, durable
    body: Body
    phase: str  # "first" (before the kill), "restart" (after it)
    started: float  # time.monotonic()
    ended: float = 0.0
    status: int | None = None  # the HTTP status; None: no answer (a connection error)
    error: str = ""
    text: str = ""  # the reply's content, or its tool calls as JSON
    prompt_tokens: int = 0
    cached_tokens: int = 0
    restored: dict[str, int] = field(default_factory=dict)
    message: dict[str, Any] = field(default_factory=dict)  # the assistant message

    @property
    def ok(self) -> bool:
        return self.status == 200


@dataclass
class Chat:
    """One conversation of a user, as its client keeps it."""

    user: str
    messages: list[dict[str, Any]]
    tools: bool = False
    prompt_tokens: int = 0  # of its last answered request
    answered_at: float = 0.0  # when its last reply came (monotonic); 0: never
    history: list[dict[str, Any]] = field(default_factory=list)  # up to that reply
    busy: bool = False  # a client is sending its next request

    def body(self, max_tokens: int, **extra: Any) -> Body:
        body: Body = {"messages": list(self.messages), "max_tokens": max_tokens, "temperature": 0}
        if self.tools:
            body["tools"] = [WEATHER]
        return {**body, **extra}

    def going_on(self) -> list[dict[str, Any]]:
        """Its history and a next message: another question, or after a tool call the
        results its client added."""
        if self.history and self.history[-1].get("tool_calls"):
            results = [m for m in self.messages[len(self.history) :] if m["role"] == "tool"]
            if results:
                return [*self.history, *results]
        return [*self.history, {"role": "user", "content": "And in one word?"}]


def reply_text(message: dict[str, Any]) -> str:
    """What greedy decoding produced: the content, or the tool calls (their ids are
    random, so only names and arguments)."""
    calls = message.get("tool_calls") or []
    if calls:
        return json.dumps([[c["function"]["name"], c["function"]["arguments"]] for c in calls])
    return str(message.get("content") or "")


def post(client: httpx.Client, url: str, key: str, ex: Exchange) -> Exchange:
    """Sends ``ex.body``, filling in what came back (never raises for the server's sake)."""
    headers = {"Authorization": f"Bearer {key}"}
    try:
        resp = client.post(f"{url}/v1/chat/completions", json=ex.body, headers=headers)
    except httpx.HTTPError as exc:
        ex.ended, ex.error = time.monotonic(), f"{type(exc).__name__}: {exc}"
        return ex
    ex.ended, ex.status = time.monotonic(), resp.status_code
    if resp.status_code != 200:
        ex.error = resp.text[:300]
        return ex
    data = resp.json()
    ex.message = data["choices"][0]["message"]
    ex.text = reply_text(ex.message)
    ex.prompt_tokens = int(data["usage"]["prompt_tokens"])
    ex.cached_tokens = int(data["usage"]["prompt_tokens_details"]["cached_tokens"])
    ex.restored = dict(data.get("x_warmstart", {}).get("restored", {}))
    return ex


class Household:
    """What the clients share: the server's address, whether it is up, the chats of
    each user, every exchange. ``up`` is cleared while the server is down."""

    def __init__(self, keys: dict[str, str], context_tokens: int) -> None:
        self.keys = keys
        self.url = ""
        self.phase = "first"
        self.up = threading.Event()
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.chats: list[Chat] = []
        self.exchanges: list[Exchange] = []
        # a chat stops growing here, so that a turn after it still fits the context
        # (a trimmed chat would no longer extend its previous prompt)
        self.longest = context_tokens // 2

    def send(self, client: httpx.Client, user: str, kind: str, body: Body) -> Exchange:
        """A client's request, once the server is up."""
        self.up.wait()
        return self.record(client, user, kind, body)

    def record(self, client: httpx.Client, user: str, kind: str, body: Body) -> Exchange:
        ex = Exchange(user, kind, body, self.phase, time.monotonic())
        post(client, self.url, self.keys[user], ex)
        with self.lock:
            self.exchanges.append(ex)
        return ex

    def take_chat(self, user: str, rng: random.Random, old: bool) -> Chat | None:
        """A chat of ``user`` no client is using, short enough to go on: the one it
        answered last, or (``old``) any answered a minute ago or more."""
        now = time.monotonic()
        with self.lock:
            free = [c for c in self.chats if c.user == user and not c.busy and c.answered_at]
            free = [c for c in free if c.prompt_tokens < self.longest]
            if old:
                free = [c for c in free if now - c.answered_at > 60]
            if not free:
                return None
            chat = rng.choice(free) if old else max(free, key=lambda c: c.answered_at)
            chat.busy = True
            return chat

    def add_chat(self, chat: Chat) -> None:
        with self.lock:
            chat.busy = True
            self.chats.append(chat)

    def release(self, chat: Chat) -> None:
        with self.lock:
            chat.busy = False


def _turn(house: Household, client: httpx.Client, chat: Chat, kind: str, **extra: Any) -> bool:
    """One request of ``chat``; on a reply the chat grows by it. False: no reply."""
    ex = house.send(client, chat.user, kind, chat.body(extra.pop("max_tokens", 32), **extra))
    if not ex.ok:
        if ex.status == 429:  # the user's queue is full: what a client then does
            time.sleep(1.0)
        return False
    chat.messages.append({k: v for k, v in ex.message.items() if v is not None})
    chat.prompt_tokens, chat.answered_at = ex.prompt_tokens, ex.ended
    chat.history = list(chat.messages)
    return True


def _ask(house: Household, client: httpx.Client, chat: Chat, text: str, kind: str) -> None:
    chat.messages.append({"role": "user", "content": text})
    if not _turn(house, client, chat, kind):
        chat.messages.pop()


def _new_chat(house: Household, user: str, tools: bool = False) -> Chat:
    system = f"You are the assistant of {user}'s household. Answer briefly."
    chat = Chat(user, [{"role": "system", "content": system}], tools=tools)
    house.add_chat(chat)
    return chat


def _chat(house: Household, client: httpx.Client, user: str, rng: random.Random) -> None:
    question = f"{rng.choice(QUESTIONS)} (note {rng.randrange(10**6)})"
    chat = _new_chat(house, user)
    _ask(house, client, chat, question, "chat")
    house.release(chat)


def _document(house: Household, client: httpx.Client, user: str, rng: random.Random) -> None:
    tokens = rng.choice(DOC_TOKENS)
    doc = document(rng.randrange(10**6), int(tokens * CHARS_PER_TOKEN))
    chat = _new_chat(house, user)
    _ask(house, client, chat, f"{doc}\n\n{rng.choice(QUESTIONS)}", "document")
    house.release(chat)


def _tool_loop(house: Household, client: httpx.Client, user: str, rng: random.Random) -> None:
    """The call (forced, so that the small model makes one), its result, the answer."""
    city = rng.choice(CITIES)
    chat = _new_chat(house, user, tools=True)
    chat.messages.append({"role": "user", "content": f"Will it rain in {city} this week?"})
    if _turn(house, client, chat, "tool-call", tool_choice="required", max_tokens=64):
        calls = chat.messages[-1].get("tool_calls") or []
        for call in calls:
            result = {"city": city, "rain_mm": [rng.randrange(12) for _ in range(3)]}
            chat.messages.append(
                {"role": "tool", "tool_call_id": call["id"], "content": json.dumps(result)}
            )
        if calls:
            _turn(house, client, chat, "tool-answer", tool_choice="none")
    house.release(chat)


def _go_on(house: Household, client: httpx.Client, user: str, rng: random.Random) -> None:
    old = rng.random() < 0.5
    chat = house.take_chat(user, rng, old)
    if chat is None:
        _chat(house, client, user, rng)
        return
    try:
        _ask(house, client, chat, rng.choice(FOLLOW_UPS), "return" if old else "follow-up")
    finally:
        house.release(chat)


# what a client does next, and how often
ACTIONS: list[tuple[float, Callable[[Household, httpx.Client, str, random.Random], None]]] = [
    (0.30, _chat),
    (0.40, _go_on),
    (0.15, _tool_loop),
    (0.15, _document),
]


def run_client(house: Household, user: str, seed: int) -> None:
    """One client of ``user`` until ``house.stop``."""
    rng = random.Random(seed)
    weights = [w for w, _ in ACTIONS]
    with httpx.Client(timeout=httpx.Timeout(900, connect=10)) as client:
        while not house.stop.is_set():
            (action,) = rng.choices([a for _, a in ACTIONS], weights)
            action(house, client, user, rng)
