"""The fake engine's model (_fake.py): words as tokens, a chat template, the replies
it gives, and its prompt work: the real ``ChatPrompter`` (_prompter.py) over that
template and those words, so the fake's prompts get their anchors from the same rule
as a real model's (``kvstore.turn_anchors``) and cannot drift from it.

- Tokens are whitespace-led words (``tokenize``); each word gets an id the first time
  it is met. The chat template is ``<|turn|> role : content <|end|>`` per message,
  then ``<|turn|> assistant :`` (an opening of three tokens that starts with the
  control token every turn opens with, as ChatML's); ``<|end|>`` ends a reply.
- The reply to a prompt is fixed when its ids are made (``FakePrompter.prompt_ids``):
  a function of the last user message (or of the raw prompt) and of the sampling
  (``reply_text``: greedy is deterministic, ``temperature > 0`` varies with the seed).
  A grammar makes it the JSON object ``{"text": ...}``; a forced tool choice makes
  it the generic format's call of that tool with no arguments.
"""

from __future__ import annotations

import collections
import functools
import hashlib
import json
import os
import random
import re
import threading
from collections.abc import Sequence
from typing import Any

from ..errors import RequestError
from ..types import Message, Request, Sampling
from . import _tools
from ._grammars import check_grammar_text
from ._prompter import ChatPrompter, Part

_TOKEN = re.compile(r"\s*\S+")
_VOCABULARY = (
    "the cache keeps every prefix warm so a repeat question costs almost nothing "
    "while new words are computed once and stored in ram or on disk for later "
    "a local model answers quickly when its context is restored instead of rebuilt"
)
WORDS = tuple(_VOCABULARY.split())
TURN, END = " <|turn|>", " <|end|>"
CONTROL = frozenset(w.strip() for w in (TURN, END))
_SCRIPTS_KEPT = 1024  # replies remembered by prompt (the prompts in flight, and more)


def tokenize(text: str) -> list[str]:
    """The fake tokenizer: each token is a word with its leading whitespace."""
    return _TOKEN.findall(text)


def render_parts(messages: Sequence[Message], generation: bool = True) -> list[Part]:
    """The fake chat template, as (text, trusted) parts: markup and contents. Each
    turn, the first too, starts with ``TURN``, so that token has one id wherever a
    turn opens."""
    parts: list[Part] = []
    for m in messages:
        content = m.content.strip()
        parts += [(f"{TURN} {m.role} :", True), *([(f" {content}", False)] if content else [])]
        parts.append((END, True))
    return [*parts, (f"{TURN} assistant :", True)] if generation else parts


def reply_text(request: Request) -> str:
    """The whole reply before max_tokens and stop apply: deterministic when greedy."""
    last_user = [m.content for m in request.messages if m.role == "user"]
    basis = request.prompt if request.prompt is not None else (last_user or [""])[-1]
    sampling = request.sampling
    material = basis.encode()
    if sampling.temperature > 0:
        salt = os.urandom(8).hex() if sampling.seed is None else str(sampling.seed)
        material += f"|{sampling.temperature}|{sampling.top_p}|{salt}".encode()
    rng = random.Random(hashlib.sha256(material).digest())
    words = [rng.choice(WORDS) for _ in range(6 + rng.randrange(12))]
    return " " + " ".join(words).capitalize() + "."


class FakeVocabulary:
    """Words as tokens, numbered as they are met (any thread: one lock)."""

    n_swa = 0  # a full cache: any chunk can be cut at any time

    def __init__(self) -> None:
        self._words: list[str] = []
        self._ids: dict[str, int] = {}
        self._lock = threading.Lock()
        self.end = self.ids([END])[0]

    @property
    def n_vocab(self) -> int:
        """The words met so far: the ids a client may name (logit_bias, pieces)."""
        return len(self._words)

    def ids(self, words: Sequence[str]) -> list[int]:
        with self._lock:
            out = []
            for word in words:
                if word not in self._ids:
                    self._ids[word] = len(self._words)
                    self._words.append(word)
                out.append(self._ids[word])
            return out

    def tokenize(self, text: str, add_special: bool, parse_special: bool = True) -> list[int]:
        return self.ids(tokenize(text))  # no special tokens to add or to parse

    def token_text(self, token: int) -> str:
        with self._lock:
            return self._words[token] if 0 <= token < len(self._words) else ""

    def piece(self, token: int, special: bool = False) -> bytes:
        return self.token_text(token).encode()

    def is_eog(self, token: int) -> bool:
        return token == self.end


class _Template:
    """The fake chat template as ``ChatPrompter`` reads it (no tools of its own)."""

    source: str | None = None

    def render_parts(
        self,
        messages: Sequence[Message],
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
    ) -> list[Part]:
        return render_parts(messages, add_generation_prompt)


class _Words:
    """The fake's words as ``ChatPrompter``'s tokens."""

    longest_piece = 1  # (a word is a token: its count bounds nothing by bytes)

    def __init__(self, vocabulary: FakeVocabulary) -> None:
        self._vocabulary = vocabulary

    def ids(self, parts: Sequence[Part]) -> list[int]:
        return self._vocabulary.ids(tokenize("".join(text for text, _ in parts)))

    def chat_ids(self, parts: Sequence[Part], messages: Sequence[Message]) -> list[int]:
        return self.ids(parts)

    def least_tokens(self, parts: Sequence[Part]) -> int:
        """As ``PromptTokenizer.least_tokens`` bounds it: the words of the parts that
        hold no control-token text (counted without numbering new words)."""
        plain = (t for t, trusted in parts if not (trusted and self.has_control_text(t)))
        return sum(len(tokenize(text)) for text in plain)

    def is_control(self, token: int) -> bool:
        return self._vocabulary.token_text(token).strip() in CONTROL

    def has_control_text(self, text: str) -> bool:
        return any(word in text for word in CONTROL)


def _check_sampling(vocabulary: FakeVocabulary, sampling: Sampling) -> None:
    """A logit bias must name a token met so far; a grammar must be within the limits
    every grammar is held to (the fake cannot follow one)."""
    for token, _ in sampling.logit_bias:
        if not 0 <= token < vocabulary.n_vocab:
            last = vocabulary.n_vocab - 1
            message = f"logit_bias: token id {token} is not in the vocabulary (0 to {last})"
            raise RequestError(message, param="logit_bias")
    if sampling.grammar is not None:
        check_grammar_text(sampling.grammar, None)


class FakePrompter(ChatPrompter):
    """The fake model's prompt work (see the module docstring); a generation prompt's
    reply is fixed with its ids, and ``script`` gives it to the engine."""

    def __init__(
        self, vocabulary: FakeVocabulary, fingerprint: str, reply_words: int | None = None
    ) -> None:
        rules = functools.partial(_check_sampling, vocabulary)
        super().__init__(_Words(vocabulary), _Template(), fingerprint, rules)
        self._end = vocabulary.end
        self._vocabulary = vocabulary
        self._reply_words = reply_words
        self._scripts: collections.OrderedDict[tuple[int, ...], list[int]] = (
            collections.OrderedDict()
        )
        self._lock = threading.Lock()  # the scripts: written by any thread's prompt_ids

    def _made(self, request: Request, plan: _tools.ToolPlan | None, ids: list[int]) -> None:
        self._remember(ids, self._script(request, plan))

    def script(self, prompt: Sequence[int]) -> list[int]:
        """The reply fixed for the prompt ``prompt`` ([] for one never made here)."""
        with self._lock:
            return self._scripts.get(tuple(prompt), [])

    def _script(self, request: Request, plan: _tools.ToolPlan | None) -> list[int]:
        if plan is not None and plan.forced():
            name = request.tool_choice
            name = request.tools[0].name if name == "required" else name
            text = json.dumps({"tool_calls": [{"name": name, "arguments": {}}]})
        else:
            text = reply_text(request)
            if self._reply_words:
                repeats = self._reply_words // max(len(text.split()), 1) + 1
                text = " " + " ".join([text.strip()] * repeats)
            if request.sampling.grammar is not None:
                text = json.dumps({"text": text.strip()})
        return [*self._vocabulary.tokenize(text, False), self._end]

    def _remember(self, ids: list[int], script: list[int]) -> None:
        with self._lock:
            self._scripts[tuple(ids)] = script
            self._scripts.move_to_end(tuple(ids))
            while len(self._scripts) > _SCRIPTS_KEPT:
                self._scripts.popitem(last=False)
