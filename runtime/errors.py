"""The one exception tree of warmstart.

    WarmstartError
    ├── ConfigError              a setting is out of bounds or malformed (names the setting)
    ├── ModelError               a model cannot be found, fetched, verified or loaded
    │   └── ModelNotFound
    ├── EngineError              llama.cpp refused an operation (decode, tokenize, state copy)
    │   └── ContextOverflow      the prompt (plus max_tokens) does not fit in the context
    ├── RequestError             a request is malformed (empty messages, bad sampling values)
    ├── Busy                     the request queue is full (HTTP 429)
    ├── Cancelled                the client went away or said stop: its generation (or its
    │                            download, whose .part is kept to resume) was stopped
    ├── CacheError               a cache record is corrupt, truncated or foreign
    │   └── DiskUnavailable      the cache dir cannot be written (read-only, not ours, damaged);
    │       │                    the cache runs from RAM and retries, requests go on
    │       └── DiskFull         the cache disk ran out of space (same degradation)
    └── PeerError                a server that `bench_peers` compares would not build,
                                 start or answer

Foreign errors (OSError, sqlite3, llama.cpp return codes) are wrapped where they
enter with ``raise ... from exc``. The HTTP layer maps these types, never
message text, to OpenAI-shaped errors.
"""

from __future__ import annotations


class WarmstartError(Exception):
    """Base of every error warmstart raises on purpose."""


class ConfigError(WarmstartError):
    """A setting is malformed or out of bounds; the message names the setting."""


class ModelError(WarmstartError):
    """A model cannot be fetched, verified or loaded."""


class ModelNotFound(ModelError):
    """No model answers to the given name or path."""


class EngineError(WarmstartError):
    """llama.cpp refused an operation."""


class ContextOverflow(EngineError):
    """The prompt plus the requested completion does not fit in the context."""

    def __init__(
        self,
        prompt_tokens: int,
        max_tokens: int,
        n_ctx: int,
        at_least: bool = False,
        tools: bool = False,
    ) -> None:
        """``tools``: the request has tools, whose definitions the prompt holds (a large
        parameter schema can fill the context by itself)."""
        size = f"at least {prompt_tokens}" if at_least else str(prompt_tokens)
        shorten = "the conversation or the tools' definitions" if tools else "the conversation"
        held = " (the tools' definitions included)" if tools else ""
        super().__init__(
            f"this prompt is {size} tokens{held} and asks for up to {max_tokens} more, "
            f"but a conversation holds at most {n_ctx} tokens; shorten {shorten} "
            "or lower max_tokens"
        )
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens
        self.n_ctx = n_ctx


class RequestError(WarmstartError):
    """A request is malformed; ``param`` names the offending field when known."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class Busy(WarmstartError):
    """Too many requests are waiting; retry after ``retry_after`` seconds."""

    def __init__(self, retry_after: float) -> None:
        super().__init__(f"the server is busy; retry in {retry_after:.0f} s")
        self.retry_after = retry_after


class Cancelled(WarmstartError):
    """The generation, or a download, was cancelled by its client."""


class CacheError(WarmstartError):
    """A cache record cannot be used: corrupt, truncated or made for another model."""


class DiskUnavailable(CacheError):
    """The disk tier cannot be opened or written; the cache serves from RAM, requests
    go on, and the disk tier is tried again from time to time."""


class DiskFull(DiskUnavailable):
    """The cache disk is full; the cache stops writing, requests go on."""


class PeerError(WarmstartError):
    """A server that `bench_peers` compares (llama-server, hearth-llm, warmstart serve)
    would not build, start or answer; the message says which and why."""
