"""Sentence embeddings for /v1/embeddings and /api/embed.

From the chat model's own pooled token states, or from the GGUF the
``embedding_model`` setting names. Either way a small context of its own, created
on the first request (no memory is spent by servers nobody asks for embeddings):
the chat context and the conversations' KV are never touched. The vectors are
computed on the thread that asked, one request at a time (see _embed_queue.py), while
the runtime's worker goes on serving replies in its own context: llama.cpp allows
contexts of one model on different threads.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from .._embed_queue import check_texts, check_tokens, embeddings_of
from ..engine import LlamaEmbedder, LlamaModel
from ..models import ModelManager
from ..settings import Settings
from ..types import Embeddings

log = logging.getLogger(__name__)

# Tokens one input may have. The context's KV costs a few megabytes on small models
# (and ~256 MB on an 8B one); a longer input is refused (400), never cut silently.
EMBED_CTX_TOKENS = 2048


class Embedder(Protocol):
    """What the runtime calls for embeddings: ``EmbeddingService`` on a model, or the
    fake engine's bags of words (runtime/engine/_fake.py)."""

    model_id: str

    def prepare(self, texts: Sequence[str]) -> list[list[int]]: ...

    def vector(
        self, tokens: list[int], stop: threading.Event | None = None
    ) -> tuple[float, ...]: ...

    def result(
        self, tokenized: Sequence[list[int]], vectors: Sequence[tuple[float, ...]]
    ) -> Embeddings: ...

    def close(self) -> None: ...


class EmbeddingService:
    def __init__(
        self,
        chat_model: LlamaModel,
        chat_model_id: str,
        path: Path | None = None,
        n_gpu_layers: int = -1,
        n_threads: int = 0,
    ) -> None:
        """``path``: a separate embedding GGUF (loaded on first use); None: the chat model."""
        self._chat_model = chat_model
        self._path = path
        self.model_id = path.stem if path is not None else chat_model_id
        self._n_gpu_layers = n_gpu_layers
        self._n_threads = n_threads
        self._own_model: LlamaModel | None = None
        self._embedder: LlamaEmbedder | None = None
        self._opening = threading.Lock()  # two first requests must not open two contexts

    @classmethod
    def for_settings(
        cls, settings: Settings, chat_model: LlamaModel, chat_model_id: str
    ) -> EmbeddingService:
        """The embedding model is resolved now (a bad setting fails at start), loaded
        on first use."""
        path = None
        if settings.embedding_model:
            path = ModelManager(settings.models_dir).resolve(settings.embedding_model)
        return cls(chat_model, chat_model_id, path, settings.n_gpu_layers, embed_threads(settings))

    def _open(self) -> LlamaEmbedder:
        with self._opening:
            if self._embedder is None:
                model = self._chat_model
                if self._path is not None:
                    log.info("loading the embedding model %s", self._path)
                    self._own_model = model = LlamaModel(self._path, self._n_gpu_layers)
                n_ctx = min(EMBED_CTX_TOKENS, max(model.n_ctx_train, 256))
                self._embedder = LlamaEmbedder(model, n_ctx, self._n_threads)
            return self._embedder

    def prepare(self, texts: Sequence[str]) -> list[list[int]]:
        """Each text's token ids, checked against the limits of _embed_queue.py before
        any vector is computed (RequestError, param ``input``). Any thread: only the
        vocabulary is read."""
        check_texts(texts)
        embedder = self._open()
        # parse_special off: text from a client is never read as control tokens
        tokenized = [
            embedder.model.tokenize(t, add_special=True, parse_special=False) if t else []
            for t in texts
        ]
        check_tokens(tokenized, embedder.n_ctx)
        return tokenized

    def vector(self, tokens: list[int], stop: threading.Event | None = None) -> tuple[float, ...]:
        """The normalised vector of one prepared text; one caller at a time (the
        request whose turn it is). Cancelled as soon as ``stop`` is set, even halfway
        through the text."""
        return tuple(float(x) for x in self._open().embed(tokens, stop))

    def result(
        self, tokenized: Sequence[list[int]], vectors: Sequence[tuple[float, ...]]
    ) -> Embeddings:
        return embeddings_of(self.model_id, tokenized, vectors)

    def close(self) -> None:
        """Frees the context (and the embedding model): no request may be running."""
        if self._embedder is not None:
            self._embedder.close()
            self._embedder = None
        if self._own_model is not None:
            self._own_model.close()
            self._own_model = None


def embed_threads(settings: Settings) -> int:
    """Threads of the embedding context: half of what replies use, so that an
    embedding computed beside them leaves them cores (llama.cpp's threads spin at
    their barriers: more threads than cores slows both down many times)."""
    return max(1, (settings.n_threads or os.cpu_count() or 2) // 2)
