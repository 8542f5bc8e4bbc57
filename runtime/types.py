"""Plain data that crosses the runtime's public seam (CLI, HTTP API, app, tests)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

Role = Literal["system", "user", "assistant", "tool"]
TIERS: tuple[str, ...] = ("live", "ram", "disk")
FinishReason = Literal["stop", "length", "cancelled"]


@dataclass(frozen=True)
class ToolCall:
    """A call of one of the request's tools, as the model made it."""

    id: str
    name: str
    arguments: str  # a JSON object, as text (OpenAI's shape)


@dataclass(frozen=True)
class Tool:
    """A function the model may call; ``parameters`` is its JSON schema, as text."""

    name: str
    description: str = ""
    parameters: str = '{"type": "object"}'


# "auto": the model chooses; "none": it answers in text; "required": it calls at least
# one tool; any other value names the one function it must call
ToolChoice = str


@dataclass(frozen=True)
class Message:
    role: Role
    content: str
    # an assistant turn cut short (Ctrl-C, a client that left): ``content`` is what
    # was shown; kept with the session, never sent to the model
    interrupted: bool = False
    # an assistant turn that called tools
    tool_calls: tuple[ToolCall, ...] = ()
    # a ``tool`` turn: the result of the call with this id, of the function ``name``
    tool_call_id: str | None = None
    name: str | None = None


@dataclass(frozen=True)
class Budget:
    """A reply's token budget as a client gave it, sized once by admission (the
    runtime's ``admit``): ``requested`` tokens, else as many as fit after the prompt,
    at most ``most`` (None: all the room). Admission fits the prompt with the
    requested budget, or with one token (the most prompt kept) without one."""

    requested: int | None = None
    most: int | None = None

    @property
    def fitting(self) -> int:
        """The max_tokens a prompt is fitted (trimmed) with."""
        return 1 if self.requested is None else self.requested

    def sized(self, n_prompt: int, n_ctx: int) -> int:
        """The max_tokens of a prompt of ``n_prompt`` tokens that fits."""
        if self.requested is not None:
            return self.requested
        room = n_ctx - n_prompt
        return room if self.most is None else min(self.most, room)


@dataclass(frozen=True)
class Sampling:
    """Sampling for one reply; ``temperature == 0`` is greedy."""

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    max_tokens: int = 256
    stop: tuple[str, ...] = ()
    # a GBNF grammar (root rule ``root``) the reply must match: JSON output, forced
    # tool calls; applied before any other step of the chain
    grammar: str | None = None
    top_k: int = 0  # 0: off
    min_p: float = 0.0  # 0: off
    # over the reply's own tokens (llama.cpp's penalties sampler); 1.0 / 0.0: off
    repeat_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    # (token id, bias added to its logit); a bias of -inf bans the token
    logit_bias: tuple[tuple[int, float], ...] = ()
    # report each reply token's log-probability with this many alternatives (0 to 20);
    # None: no log-probabilities
    logprobs: int | None = None


@dataclass(frozen=True)
class Request:
    """One reply to produce: a chat (``messages``) or a raw completion (``prompt``)."""

    messages: tuple[Message, ...] = ()
    prompt: str | None = None
    sampling: Sampling = field(default_factory=Sampling)
    session_id: str | None = None
    use_cache: bool = True
    tools: tuple[Tool, ...] = ()
    tool_choice: ToolChoice = "auto"  # honoured only when ``tools`` is not empty
    # more than one call in a reply: off unless asked, as in llama.cpp (a small model
    # repeats its call until max_tokens)
    parallel_tool_calls: bool = False
    # whose request it is (runtime/users.py Caller): ``owner`` scopes the conversation
    # and its stored responses, ``cache_scope`` the KV cache it may reuse and feeds
    # (the user's salt and the request's cache_salt); "" both: a single-user install
    owner: str = ""
    cache_scope: str = ""

    @property
    def uses_tools(self) -> bool:
        """Is the reply read back as tool calls and/or text (not returned raw)? With
        any tools, whatever the choice: the same prompt serves every choice."""
        return bool(self.tools)


@dataclass
class Report:
    """Where a reply's prompt came from and what it cost. Times in milliseconds."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    restored: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TIERS, 0))
    restore_ms: float = 0.0
    prefill_ms: float = 0.0
    ttft_ms: float = 0.0
    total_ms: float = 0.0
    finish_reason: FinishReason = "stop"
    decision: str = ""
    session_id: str | None = None
    trimmed_messages: int = 0  # earliest turns left out so the conversation fits
    # the stop string (of Sampling.stop) that ended the reply; None: any other end
    stop_sequence: str | None = None
    # where the prompt first differs from its conversation's last one, when it reused
    # less than that (runtime/serving/_divergence.py Divergence.as_dict)
    divergence: dict[str, Any] | None = None

    @property
    def cached_tokens(self) -> int:
        return sum(self.restored.values())

    @property
    def prefilled_tokens(self) -> int:
        return self.prompt_tokens - self.cached_tokens

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["cached_tokens"] = self.cached_tokens
        data["prefilled_tokens"] = self.prefilled_tokens
        return data

    def summary(self) -> str:
        parts = [f"prompt {self.prompt_tokens} tok"]
        for tier in TIERS:
            if self.restored.get(tier):
                parts.append(f"{self.restored[tier]} from {tier}")
        parts.append(f"restore {self.restore_ms:.1f} ms")
        parts.append(f"prefill {self.prefilled_tokens} tok in {self.prefill_ms:.1f} ms")
        parts.append(f"TTFT {self.ttft_ms:.1f} ms")
        if self.trimmed_messages:
            parts.append(f"{self.trimmed_messages} earliest messages left out to fit")
        if self.divergence:
            parts.append(f"recomputed from {self.divergence['text']}")
        return " | ".join(parts)


DraftState = Literal[
    "ready", "superseded", "yielded", "no free sequence", "nothing certain", "cache off"
]


@dataclass(frozen=True)
class Draft:
    """A draft's outcome: ``ready`` tokens of the final prompt are live (of
    ``prompt_tokens``, the draft's own; ``certain`` could be), ``cached`` of them were
    live or restored before it ran; ``state`` says how it ended."""

    session_id: str | None
    prompt_tokens: int
    certain: int
    ready: int
    cached: int
    state: DraftState
    ms: float


@dataclass(frozen=True)
class Embeddings:
    """Unit-length vectors, one per input text, and the tokens they took."""

    model: str
    vectors: tuple[tuple[float, ...], ...]
    prompt_tokens: int


@dataclass(frozen=True)
class TokenLogprob:
    """One reply token's log-probability under the model's raw next-token logits (a
    log-softmax before any sampler step), with the most likely alternatives in
    ``top`` (most likely first; their own ``top`` is empty)."""

    token: str
    raw: bytes  # the token's bytes: a piece of a multi-byte character is not text
    logprob: float
    top: tuple[TokenLogprob, ...] = ()


@dataclass(frozen=True)
class Token:
    """A piece of the reply's text, streamed as soon as it is decoded. With
    ``Sampling.logprobs``, ``logprobs`` holds the tokens decoded since the last event
    (their text may be held back for a stop string, so ``text`` may be empty)."""

    text: str
    logprobs: tuple[TokenLogprob, ...] = ()


@dataclass(frozen=True)
class Done:
    """The last event of every stream. ``reply``: for a request that uses tools, the
    model's output read back as text and tool calls (None otherwise)."""

    report: Report
    reply: Message | None = None


Event = Token | Done


@runtime_checkable
class Stream(Protocol):
    """The events of one reply. Iterate it; ``cancel()`` may be called from any thread
    and ends the iteration with a ``Done`` whose finish_reason is ``cancelled``."""

    def __iter__(self) -> Iterator[Event]: ...

    def cancel(self) -> None: ...


@runtime_checkable
class WatchedStream(Stream, Protocol):
    """A Stream an event loop can read without a thread per token: ``watch(fn)``
    has ``fn`` called (on the producer's thread) after each event is put, and
    ``poll()`` returns the next event, or None when none is waiting yet."""

    def watch(self, watcher: Callable[[], None] | None) -> None: ...

    def poll(self) -> Event | None: ...


@dataclass(frozen=True)
class StoredResponse:
    """A reply of the Responses API (/v1/responses) kept so that a later request can
    continue it by its id (``previous_response_id``) or read it back.

    ``messages``: the conversation through this reply's output, without the request's
    instructions (they are not carried to the next response); ``session_id``: the
    conversation it was served in; ``named``: whether the client named that
    conversation (else it is a derived id, and so is the continuation's);
    ``body``: the response object as it was sent."""

    id: str
    session_id: str | None
    named: bool
    messages: tuple[Message, ...]
    body: dict[str, Any]
    created: float = 0.0


@dataclass(frozen=True)
class SessionInfo:
    """A conversation the runtime knows, with where its KV lives now."""

    id: str
    title: str
    created: float
    updated: float
    n_tokens: int
    tiers: dict[str, int]  # tokens of this conversation's cached prefix per tier
    messages: tuple[Message, ...] = ()
    anonymous: bool = False  # its requests named no conversation: not listed by default
    # why its last prompt that reused less than the one before was recomputed
    # (runtime/serving/_divergence.py), while the runtime that served it runs
    divergence: str | None = None

    @property
    def location(self) -> str:
        """The fastest tier holding any of this conversation ("none" if uncached)."""
        for tier in TIERS:
            if self.tiers.get(tier):
                return tier
        return "none"
