"""An engine without a model: the real runtime (queue, sessions, store, stats, rules)
over deterministic text, so tests and demos run it in milliseconds.

What it pretends, behind the ``Engine`` protocol (_protocol.py):

- Its model is _fake_words.py's: words as tokens, a chat template, and the reply to
  each prompt, fixed when its ids are made (its ``prompter``, the real prompt work
  over that template). The logits put that reply's next word first, so the real
  sampling, stop strings, max_tokens and logprobs apply to it.
- Each token's "KV" is a cell of ``CELL_BYTES`` bytes holding its id and position, so
  chunks are real bytes the RAM pool and the disk tier keep, and a restore checks that
  what comes back is the KV of the very tokens asked for.
- ``prefill_delay`` seconds a prompt token and ``token_delay`` a generated one (tests of
  slow work); embeddings are bags of words computed at ``prefill_delay`` a word.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from .._embed_queue import check_texts, check_tokens, embeddings_of
from ..errors import Cancelled, EngineError
from ..types import Embeddings, Sampling
from ._fake_words import FakePrompter, FakeVocabulary, tokenize
from ._residents import KvCells, Resident, Residents

if TYPE_CHECKING:
    from ._protocol import Engine

CELL_BYTES = 16  # a pretend KV cell: the token id and its position
EMBED_DIM = 64


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
        self.prompter = FakePrompter(self.model, self.fingerprint, options.reply_words)
        self._stop = threading.Event()

    def _cells(self) -> KvCells:
        return self.ctx

    def blob_bytes(self, n_tokens: int) -> int:
        return n_tokens * CELL_BYTES

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
        res.computed(tokens, ends)

    def _decoded(self, res: Resident, start: int) -> None:
        """The next-token logits after ``res``'s tokens, a reply to ``res.tokens[:start]``
        so far: its next word first."""
        script = self.prompter.script(res.tokens[:start])
        k = len(res.tokens) - start
        token = script[k] if k < len(script) else self.model.end
        logits = np.full(max(self.model.n_vocab, token + 1), -10.0, dtype=np.float32)
        logits[token] = 0.0
        self.ctx.last = logits

    def keep_logits(self, res: Resident) -> np.ndarray:
        return res.keep_logits(self.ctx.logits())

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
            res.reset()
            return False
        self.ctx.cells[res.seq] = [(int(t), int(p)) for t, p in cells]
        res.reset(ids[:n], bounds)
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
