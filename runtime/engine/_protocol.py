"""The engine seam: what ``LocalRuntime`` (runtime/serving/_core.py) and the request pipeline
(runtime/serving/_pipeline.py) call on an engine, and nothing more.

Two engines implement it: the llama.cpp one (``_engine.LlamaEngine``) and a
deterministic fake without a model (``_fake.FakeEngine``), so the real runtime (its
queue, sessions, store, stats and rules) runs in tests in milliseconds. Both pass the
same contract tests (tests/serving/test_service_contract.py, tests/engine/test_protocol.py).

The contract, as the pipeline relies on it:

- One thread owns the engine (the runtime's worker); only ``interrupt`` is called
  from others. The vocabulary (``model``) and the ``prompter`` (the prompt work:
  a request's ids and anchors, its tool plan, its sampling checks) read only what is
  fixed once the engine exists, from any thread.
- ``residents`` are the conversations in the context; ``claim`` takes an idle one for
  a prompt and says how many of its tokens it already holds (a prefix ending at one
  of ``cuts``), ``release`` gives it back. Its ``tokens`` and ``bounds`` change only
  through ``trim``, ``evict``, ``prefill``, ``step`` and ``restore``.
- ``prefill`` computes tokens after what a resident holds, in one batch; a token's
  KV bytes depend only on the tokens before it and the batch ends (so a restored
  prefix equals a recomputed one). False, with nothing kept, once ``interrupt(True)``.
- ``ctx.logits()`` are the last decode's next-token logits, whichever resident
  decoded; ``keep_logits`` keeps them with the resident for the same prompt again.
- ``snapshot`` + ``cut`` write the KV of positions [c0, c1) into ``blob_bytes(c1 -
  c0)`` bytes (a snapshot of [c0, c1) holds at least those cells; where the engine
  can, no others, so a capture costs its new chunks); ``restore`` loads such chunks
  back (False when it refuses them, the resident then empty). The bytes are opaque
  to everyone but the engine; the store keys them with ``fingerprint``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal, Protocol

import numpy as np

if TYPE_CHECKING:
    from ..types import Request, Sampling
    from ._residents import Resident
    from ._tools import ToolPlan


class Vocabulary(Protocol):
    """The model's tokens, as the runtime and the pipeline read them."""

    @property
    def n_vocab(self) -> int: ...

    @property
    def n_swa(self) -> int: ...  # > 0: a sliding-window cache (chunks cut per batch)

    def tokenize(self, text: str, add_special: bool, parse_special: bool = True) -> list[int]: ...

    def piece(self, token: int, special: bool = False) -> bytes: ...

    def token_text(self, token: int) -> str: ...

    def is_eog(self, token: int) -> bool: ...


class Logits(Protocol):
    def logits(self) -> np.ndarray: ...


class TokenSampler(Protocol):
    """Draws a reply's tokens. ``ctx``: the engine's ``ctx`` (the last decode's
    logits); ``logits``: kept ones instead. ``close`` frees it."""

    def sample(self, ctx: Any, logits: np.ndarray | None = None) -> int: ...

    def close(self) -> None: ...


class Prompter(Protocol):
    """A model's prompt work, what admission (runtime/serving/_admit.py) and the next
    turn's prompt need: its tool plan, its prompt's ids and anchors, a proven least
    token count (without tokenizing), its own checks of a sampling (a RequestError
    before any work). Both engines' is a ``ChatPrompter`` (_prompter.py)."""

    @property
    def fingerprint(self) -> str: ...  # the model's: whose ids an admitted request holds

    def tool_plan(self, request: Request) -> ToolPlan | None: ...

    def prompt_ids(
        self,
        request: Request,
        generation: bool = True,
        plan: ToolPlan | Literal["plan it"] | None = "plan it",
    ) -> tuple[list[int], tuple[int, ...]]: ...  # plan: the tool plan admission made

    def least_tokens(self, request: Request, reach: int) -> int: ...

    def check_sampling(self, sampling: Sampling) -> None: ...


class Engine(Protocol):
    """A model's context holding resident conversations; see the module docstring."""

    residents: list[Resident]
    evictions: int  # conversations pushed out of the live context

    @property
    def model(self) -> Vocabulary: ...

    @property
    def ctx(self) -> Logits: ...

    @property
    def fingerprint(self) -> str: ...  # everything a stored chunk's bytes depend on

    @property
    def chunkable(self) -> bool: ...  # False: no chunk can be cut (a recurrent model)

    @property
    def n_ctx(self) -> int: ...  # KV cells of one resident

    @property
    def kv_bytes_per_token(self) -> int: ...

    def blob_bytes(self, n_tokens: int) -> int: ...

    @property
    def prompter(self) -> Prompter: ...  # the model's prompt work (any thread)

    # residents (the worker)
    def claim(
        self,
        ids: Sequence[int],
        cuts: Sequence[int],
        session: str | None,
        share: bool,
        stored: int = 0,
        kept: Callable[[Resident], int] | None = None,
        scope: str = "",
    ) -> tuple[Resident, int]: ...

    def release(self, res: Resident) -> None: ...

    def trim(self, res: Resident, n: int) -> None: ...

    def evict(self, res: Resident, counted: bool = True) -> None: ...

    # computing (the worker; interrupt from any thread)
    def prefill(
        self,
        res: Resident,
        tokens: Sequence[int],
        want_logits: bool,
        ends: Sequence[int] | None = None,
    ) -> bool: ...

    def keep_logits(self, res: Resident) -> np.ndarray: ...

    def interrupt(self, stop: bool) -> None: ...

    def step(self, res: Resident, token: int) -> None: ...

    def step_many(self, steps: Sequence[tuple[Resident, int]]) -> list[np.ndarray]: ...

    def sampler(self, sampling: Sampling) -> TokenSampler: ...

    # chunk copies (the worker)
    def snapshot(self, seq: int, c0: int = 0, c1: int = -1) -> list[Any]: ...

    def cut(self, snapshot: list[Any], c0: int, c1: int, out: np.ndarray) -> int: ...

    def restore(
        self, res: Resident, chunks: Sequence[np.ndarray], ids: Sequence[int], bounds: list[int]
    ) -> bool: ...

    def close(self) -> None: ...
