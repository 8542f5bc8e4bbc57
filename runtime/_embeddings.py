"""Sentence embeddings for /v1/embeddings and /api/embed.

From the chat model's own pooled token states, or from the GGUF the
``embedding_model`` setting names. Either way a small context of its own, created
on the first request (no memory is spent by servers nobody asks for embeddings):
the chat context and the conversations' KV are never touched. Every call runs on
the runtime's worker thread, which owns the model.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from .engine._llama import LlamaEmbedder, LlamaModel
from .errors import RequestError
from .models import ModelManager
from .settings import Settings
from .types import Embeddings

log = logging.getLogger(__name__)

# Tokens one input may have. The context's KV costs a few megabytes on small models
# (and ~256 MB on an 8B one); a longer input is refused (400), never cut silently.
EMBED_CTX_TOKENS = 2048


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

    @classmethod
    def for_settings(
        cls, settings: Settings, chat_model: LlamaModel, chat_model_id: str
    ) -> EmbeddingService:
        """The embedding model is resolved now (a bad setting fails at start), loaded
        on first use."""
        path = None
        if settings.embedding_model:
            path = ModelManager(settings.models_dir).resolve(settings.embedding_model)
        threads = settings.n_threads or 0
        return cls(chat_model, chat_model_id, path, settings.n_gpu_layers, threads)

    def _open(self) -> LlamaEmbedder:
        if self._embedder is None:
            model = self._chat_model
            if self._path is not None:
                log.info("loading the embedding model %s", self._path)
                self._own_model = model = LlamaModel(self._path, self._n_gpu_layers)
            n_ctx = min(EMBED_CTX_TOKENS, max(model.n_ctx_train, 256))
            self._embedder = LlamaEmbedder(model, n_ctx, self._n_threads)
        return self._embedder

    def embed(self, texts: Sequence[str]) -> Embeddings:
        """Normalised vectors, one per text; RequestError (param ``input``) for an empty
        text or one longer than the embedding context. Worker thread only."""
        if not texts:
            raise RequestError("input must hold at least one text", "input")
        embedder = self._open()
        model = embedder.model
        vectors, total = [], 0
        for i, text in enumerate(texts):
            # parse_special off: text from a client is never read as control tokens
            tokens = model.tokenize(text, add_special=True, parse_special=False) if text else []
            where = "input" if len(texts) == 1 else f"input.{i}"
            if not text or not tokens:
                raise RequestError(f"{where}: an empty text has no embedding", where)
            if len(tokens) > embedder.n_ctx:
                raise RequestError(
                    f"{where}: {len(tokens)} tokens; the embedding context holds {embedder.n_ctx}",
                    where,
                )
            vectors.append(tuple(float(x) for x in embedder.embed(tokens)))
            total += len(tokens)
        return Embeddings(model=self.model_id, vectors=tuple(vectors), prompt_tokens=total)

    def close(self) -> None:
        if self._embedder is not None:
            self._embedder.close()
            self._embedder = None
        if self._own_model is not None:
            self._own_model.close()
            self._own_model = None
