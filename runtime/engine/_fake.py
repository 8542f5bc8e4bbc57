"""An engine without a model: the real runtime (queue, sessions, store, stats, rules)
over deterministic text, so tests and demos run it in milliseconds.

What it pretends, behind the ``Engine`` protocol (_protocol.py):

- Tokens are whitespace-led words (``tokenize``); each word gets an id the first time
  it is met. The chat template is ``<|role|> : content <|end|>`` per message, then
  ``<|assistant|> :`` (an opening of two tokens, as ChatML's); ``<|end|>`` ends a reply.
- The reply to a prompt is fixed when its ids are made (``prompt_ids``): a function
  of the last user message (or of the raw prompt) and of the sampling (``reply_text``:
  greedy is deterministic, ``temperature > 0`` varies with the seed). A grammar makes
  it the JSON object ``{"text": ...}``; a forced tool choice makes it the generic
  format's call of that tool with no arguments. The logits put that reply's next word
  first, so the real sampling, stop strings, max_tokens and logprobs apply to it.
- Each token's "KV" is a cell of ``CELL_BYTES`` bytes holding its id and position, so
  chunks are real bytes the RAM pool and the disk tier keep, and a restore checks that
  what comes back is the KV of the very tokens asked for.
- ``prefill_delay`` seconds a prompt token and ``token_delay`` a generated one (tests of
  slow work); embeddings are bags of words computed at ``prefill_delay`` a word.
"""

from __future__ import annotations

import collections
import hashlib
import json
import os
import random
import re
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from .._embed_queue import check_texts, check_tokens, embeddings_of
from ..errors import Cancelled, EngineError, RequestError
from ..types import Embeddings, Message, Request, Sampling
from . import _tools
from ._grammars import check_grammar_text
from ._residents import KvCells, Resident, Residents

if TYPE_CHECKING:
    from ._protocol import Engine

CELL_BYTES = 16  # a pretend KV cell: the token id and its position
EMBED_DIM = 64
_TOKEN = re.compile(r"\s*\S+")
_VOCABULARY = (
    "the cache keeps every prefix warm so a repeat question costs almost nothing "
    "while new words are computed once and stored in ram or on disk for later "
    "a local model answers quickly when its context is restored instead of rebuilt"
)
WORDS = tuple(_VOCABULARY.split())
END, OPENER = " <|end|>", "<|assistant|>"
ROLES = frozenset(f"<|{role}|>" for role in ("system", "user", "assistant", "tool"))
_SCRIPTS_KEPT = 1024  # replies remembered by prompt (the prompts in flight, and more)


def tokenize(text: str) -> list[str]:
    """The fake tokenizer: each token is a word with its leading whitespace."""
    return _TOKEN.findall(text)


def render(messages: Sequence[Message], generation: bool = True) -> str:
    """The fake chat template."""
    parts = [f"<|{m.role}|> : {m.content.strip()} <|end|>" for m in messages]
    return " ".join([*parts, "<|assistant|> :"] if generation else parts)


def _anchors(words: Sequence[str]) -> list[int]:
    """Where prefill batches end, as ``kvstore.turn_anchors`` puts them: where each
    turn but the assistant's opens; where the assistant's opening ends (two tokens, so
    the prompt's own tail batch is a batch of the next turn too) and the two before
    it; every token of a reply, up to its end."""
    out: list[int] = []
    for i, w in enumerate(words):
        if w.strip() not in ROLES:
            continue
        if w.strip() != OPENER:
            out += [i] if i else []
            continue
        c = i + 2
        end = next((p for p in range(c, len(words)) if words[p] == END), len(words))
        out += [x for x in (c - 2, c) if x > 0] + list(range(c + 1, end + 1))
    return out


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


@dataclass(frozen=True)
class FakeOptions:
    """How the fake engine behaves beyond the settings (the ``--fake`` server's flags)."""

    model_id: str = "warmstart-fake"
    # tokens a conversation may hold; None: the settings' (a fake may hold more than a
    # model could: tests of megabyte prompts)
    n_ctx: int | None = None
    token_delay: float = 0.0  # seconds a generated token costs
    prefill_delay: float = 2e-4  # seconds a prompt token (or an embedded word) costs
    reply_words: int | None = None  # every reply this long (tests of slow readers)


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


class _Cells:
    """The fake context: each sequence's cells, and the last decode's logits."""

    def __init__(self, n_seq: int) -> None:
        self.cells: list[list[tuple[int, int]]] = [[] for _ in range(n_seq)]
        self.last = np.zeros(1, dtype=np.float32)

    def seq_rm(self, seq: int, p0: int = -1, p1: int = -1) -> None:
        del self.cells[seq][max(p0, 0) :]  # the engine only ever cuts a tail

    def seq_cp_all(self, src: int, dst: int) -> None:
        self.cells[dst] = list(self.cells[src])

    def logits(self) -> np.ndarray:
        return self.last.copy()


class FakeSampler:
    """Greedy over the fake logits (the reply's variation is in its script)."""

    def sample(self, ctx: Any, logits: np.ndarray | None = None) -> int:
        return int(np.argmax(ctx.logits() if logits is None else logits))

    def close(self) -> None:
        """Nothing to free."""


class FakeEngine(Residents):
    """The ``Engine`` protocol without a model; see the module docstring."""

    kv_bytes_per_token = CELL_BYTES
    chunkable = True

    def __init__(self, n_ctx: int, resident_sequences: int, options: FakeOptions) -> None:
        self.n_ctx = n_ctx
        self.options = options
        self.model = FakeVocabulary()
        self.ctx = _Cells(resident_sequences)
        self.residents = [Resident(seq) for seq in range(resident_sequences)]
        self.evictions = 0
        self.fingerprint = hashlib.sha256(f"fake|{options.model_id}".encode()).hexdigest()
        self._stop = threading.Event()
        self._scripts: collections.OrderedDict[tuple[int, ...], list[int]] = (
            collections.OrderedDict()
        )
        self._lock = threading.Lock()  # the scripts: written by any thread's prompt_ids

    def _cells(self) -> KvCells:
        return self.ctx

    def blob_bytes(self, n_tokens: int) -> int:
        return n_tokens * CELL_BYTES

    # prompts ----------------------------------------------------------------------------
    def prompt_ids(
        self,
        request: Request,
        generation: bool = True,
        plan: _tools.ToolPlan | Literal["plan it"] | None = "plan it",
    ) -> tuple[list[int], tuple[int, ...]]:
        """The prompt's ids and its anchors (where each turn opens, and where the
        assistant's opening ends); a generation prompt's reply is fixed here."""
        if isinstance(plan, str):  # "plan it"
            plan = self.tool_plan(request)
        if request.prompt is not None:
            ids, anchors = self.model.tokenize(request.prompt, False), []
        else:
            messages = plan.messages if plan else request.messages
            words = tokenize(render(messages, generation))
            ids = self.model.ids(words)
            anchors = _anchors(words)
        if generation:
            self._remember(ids, self._script(request, plan))
        return ids, tuple(sorted(set(anchors)))

    def _script(self, request: Request, plan: _tools.ToolPlan | None) -> list[int]:
        if plan is not None and plan.forced():
            name = request.tool_choice
            name = request.tools[0].name if name == "required" else name
            text = json.dumps({"tool_calls": [{"name": name, "arguments": {}}]})
        else:
            text = reply_text(request)
            if self.options.reply_words:
                repeats = self.options.reply_words // max(len(text.split()), 1) + 1
                text = " " + " ".join([text.strip()] * repeats)
            if request.sampling.grammar is not None:
                text = json.dumps({"text": text.strip()})
        return [*self.model.tokenize(text, False), self.model.end]

    def _remember(self, ids: list[int], script: list[int]) -> None:
        with self._lock:
            self._scripts[tuple(ids)] = script
            self._scripts.move_to_end(tuple(ids))
            while len(self._scripts) > _SCRIPTS_KEPT:
                self._scripts.popitem(last=False)

    def least_tokens(self, request: Request, reach: int) -> int:
        """Each word of a text is a token of its own (``tokenize``)."""
        texts = [request.prompt or "", *(m.content for m in request.messages)]
        return sum(len(text.split()) for text in texts)

    def tool_plan(self, request: Request) -> _tools.ToolPlan | None:
        return _tools.plan(request, "generic")  # the fake template knows no tools

    def check_sampling(self, sampling: Sampling) -> None:
        """A logit bias must name a token met so far; a grammar must be within the
        limits every grammar is held to (the fake cannot follow one)."""
        for token, _ in sampling.logit_bias:
            if not 0 <= token < self.model.n_vocab:
                last = self.model.n_vocab - 1
                message = f"logit_bias: token id {token} is not in the vocabulary (0 to {last})"
                raise RequestError(message, param="logit_bias")
        if sampling.grammar is not None:
            check_grammar_text(sampling.grammar, None)

    # computing ----------------------------------------------------------------------------
    def prefill(
        self,
        res: Resident,
        tokens: Sequence[int],
        want_logits: bool,
        ends: Sequence[int] | None = None,
    ) -> bool:
        if self._stop.is_set():
            return False
        if self._stop.wait(len(tokens) * self.options.prefill_delay):
            return False  # a request arrived for the worker: nothing of it is kept
        self._append(res, tokens, ends)
        if want_logits:
            self._decoded(res, len(res.tokens))
        return True

    def _append(self, res: Resident, tokens: Sequence[int], ends: Sequence[int] | None) -> None:
        cells, n = self.ctx.cells[res.seq], len(res.tokens)
        if n + len(tokens) > self.n_ctx:
            raise EngineError("the conversation's KV stream is full")
        cells.extend((t, n + i) for i, t in enumerate(tokens))
        res.copy_pending = False
        res.tokens.extend(tokens)
        res.bounds.extend((len(res.tokens),) if ends is None else ends)

    def _decoded(self, res: Resident, start: int) -> None:
        """The next-token logits after ``res``'s tokens, a reply to ``res.tokens[:start]``
        so far: its next word first."""
        with self._lock:
            script = self._scripts.get(tuple(res.tokens[:start]), [])
        k = len(res.tokens) - start
        token = script[k] if k < len(script) else self.model.end
        logits = np.full(max(self.model.n_vocab, token + 1), -10.0, dtype=np.float32)
        logits[token] = 0.0
        self.ctx.last = logits

    def keep_logits(self, res: Resident) -> np.ndarray:
        res.logits, res.logits_at = self.ctx.logits(), len(res.tokens)
        return res.logits

    def interrupt(self, stop: bool) -> None:
        if stop:
            self._stop.set()
        else:
            self._stop.clear()

    def step(self, res: Resident, token: int) -> None:
        time.sleep(self.options.token_delay)
        self._append(res, (token,), None)
        # the reply started where the prompt's logits were kept (see keep_logits)
        self._decoded(res, res.logits_at if res.logits is not None else len(res.tokens) - 1)

    def step_many(self, steps: Sequence[tuple[Resident, int]]) -> list[np.ndarray]:
        time.sleep(self.options.token_delay)  # one decode for them all
        out = []
        for res, token in steps:
            self._append(res, (token,), None)
            self._decoded(res, res.logits_at if res.logits is not None else len(res.tokens) - 1)
            out.append(self.ctx.logits())
        return out

    def sampler(self, sampling: Sampling) -> FakeSampler:
        return FakeSampler()

    # chunk copies ---------------------------------------------------------------------------
    def snapshot(self, seq: int, c0: int = 0, c1: int = -1) -> list[Any]:
        return [None, list(self.ctx.cells[seq])]  # the whole sequence: cut indexes it

    def cut(self, snapshot: list[Any], c0: int, c1: int, out: np.ndarray) -> int:
        n = (c1 - c0) * CELL_BYTES
        cells = np.array(snapshot[1][c0:c1], dtype="<i8").reshape(-1, 2)
        out[:n] = cells.view(np.uint8).reshape(-1)
        return n

    def restore(
        self, res: Resident, chunks: Sequence[np.ndarray], ids: Sequence[int], bounds: list[int]
    ) -> bool:
        """Loads the chunks' cells; refused (``res`` empty) unless they hold exactly
        ``ids[:bounds[-1]]`` at their positions."""
        n = bounds[-1]
        if res.copy_pending:
            return False
        res.forget_logits()
        raw = b"".join(np.asarray(c, dtype=np.uint8).tobytes() for c in chunks)
        cells = np.frombuffer(raw, dtype="<i8").reshape(-1, 2)
        expected = np.array([(t, p) for p, t in enumerate(ids[:n])], dtype="<i8").reshape(-1, 2)
        if not np.array_equal(cells, expected):
            self.ctx.cells[res.seq] = []
            res.tokens, res.bounds = [], []
            return False
        self.ctx.cells[res.seq] = [(int(t), int(p)) for t, p in cells]
        res.tokens, res.bounds = list(ids[:n]), list(bounds)
        return True

    def close(self) -> None:
        """Nothing to free."""


class FakeEmbedder:
    """Bag-of-words vectors: each word adds a signed unit at a place its hash picks,
    so equal texts get equal vectors and different words different ones."""

    def __init__(self, options: FakeOptions, n_ctx: int) -> None:
        self.model_id = options.model_id
        self._delay, self._n_ctx = options.prefill_delay, n_ctx

    def prepare(self, texts: Sequence[str]) -> list[list[int]]:
        check_texts(texts)
        tokenized = [self._ids(tokenize(t)) for t in texts]
        check_tokens(tokenized, self._n_ctx)
        return tokenized

    @staticmethod
    def _ids(words: list[str]) -> list[int]:
        """A word's "id" is its hash: the vector needs nothing else."""
        return [
            int.from_bytes(hashlib.sha256(w.strip().lower().encode()).digest()[:8]) for w in words
        ]

    def vector(self, tokens: list[int], stop: threading.Event | None = None) -> tuple[float, ...]:
        if (stop or threading.Event()).wait(len(tokens) * self._delay):
            raise Cancelled("the embedding was stopped")
        vector = [0.0] * EMBED_DIM
        for key in tokens:
            digest = key.to_bytes(8, "big")
            vector[digest[0] % EMBED_DIM] += 1.0 if digest[1] & 1 else -1.0
        norm = sum(x * x for x in vector) ** 0.5 or 1.0
        return tuple(x / norm for x in vector)

    def result(
        self, tokenized: Sequence[list[int]], vectors: Sequence[tuple[float, ...]]
    ) -> Embeddings:
        return embeddings_of(self.model_id, tokenized, vectors)

    def close(self) -> None:
        """Nothing to free."""


if TYPE_CHECKING:  # mypy checks that the fake keeps the protocol
    _IS_AN_ENGINE: type[Engine] = FakeEngine
