"""Request bodies of the OpenAI-compatible endpoints, and their translation to Request.

Types are strict (a string where a number belongs is a 400, not a guess). Fields
that OpenAI defines but warmstart does not use (``frequency_penalty``, ``logprobs``,
``tools`` ...) are ignored, so clients that always send them keep working.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from ..errors import RequestError
from ..types import Message, Request, Sampling

# Requests without max_tokens get at most this many, and never more than fits.
DEFAULT_MAX_TOKENS = 512


def _valid_unicode(value: str) -> str:
    """JSON may carry lone surrogates (\\ud800) that no UTF-8 encoder accepts; the
    tokenizer would fail on them far from here, so they are a 400 naming the field."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(
            f"contains a lone surrogate (U+{ord(value[exc.start]):04X}) at character "
            f"{exc.start}, which is not valid Unicode text"
        ) from None
    return value


# Every string a client sends is checked, so none can fail later as a 500.
Text = Annotated[str, AfterValidator(_valid_unicode)]
SESSION_ID = Annotated[Text, Field(min_length=1, max_length=256)]


class _Body(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class TextPart(_Body):
    type: Literal["text"]
    text: Text


class ChatMessage(_Body):
    # "developer" is what newer OpenAI clients send for the system prompt.
    role: Literal["system", "developer", "user", "assistant"]
    # Required and never null: warmstart runs no tools, so a message without text is a
    # client error, not an empty turn.
    content: Text | list[TextPart]

    def to_message(self) -> Message:
        content = self.content
        if isinstance(content, list):
            content = "".join(part.text for part in content)
        role = "system" if self.role == "developer" else self.role
        return Message(role=role, content=content)


class StreamOptions(_Body):
    include_usage: bool = False


class _Sampled(_Body):
    """The sampling fields shared by chat and raw completions."""

    model: Text | None = Field(None, description="the loaded model's id or 'default'")
    temperature: float = Field(1.0, ge=0.0, le=2.0, allow_inf_nan=False)
    top_p: float = Field(1.0, ge=0.0, le=1.0, allow_inf_nan=False)
    max_tokens: int | None = Field(None, ge=1, le=1_000_000)
    max_completion_tokens: int | None = Field(None, ge=1, le=1_000_000)
    stop: Text | Annotated[list[Text], Field(max_length=4)] | None = None
    seed: int | None = Field(None, ge=-(2**63), le=2**64 - 1)
    n: int = Field(1, ge=1, le=1, description="only one choice is supported")
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: SESSION_ID | None = Field(None, description="session hint (X-Warmstart-Session wins)")

    def sampling(self, max_tokens: int) -> Sampling:
        stops = [self.stop] if isinstance(self.stop, str) else (self.stop or [])
        return Sampling(
            temperature=self.temperature,
            top_p=self.top_p,
            # llama.cpp seeds are 32-bit; any integer a client sends maps onto one.
            seed=None if self.seed is None else self.seed % 2**32,
            max_tokens=max_tokens,
            stop=tuple(s for s in stops if s),
        )

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class ChatCompletionRequest(_Sampled):
    messages: list[ChatMessage] = Field(..., description="the conversation, oldest first")

    def text_chars(self) -> int:
        return sum(len(m.to_message().content) for m in self.messages)

    def to_request(self, session_id: str | None, max_tokens: int) -> Request:
        if not self.messages:
            raise RequestError("messages must contain at least one message", "messages")
        return Request(
            messages=tuple(m.to_message() for m in self.messages),
            sampling=self.sampling(max_tokens),
            session_id=session_id or self.user,
        )


class CompletionRequest(_Sampled):
    prompt: Text | Annotated[list[Text], Field(min_length=1, max_length=1)] = Field(
        ..., description="the text to continue (a list holding one string is accepted)"
    )

    def text_chars(self) -> int:
        return len(self.prompt if isinstance(self.prompt, str) else self.prompt[0])

    def to_request(self, session_id: str | None, max_tokens: int) -> Request:
        prompt = self.prompt if isinstance(self.prompt, str) else self.prompt[0]
        if not prompt:
            raise RequestError("prompt must not be empty", "prompt")
        return Request(
            prompt=prompt,
            sampling=self.sampling(max_tokens),
            session_id=session_id or self.user,
        )


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    """Every 4xx and 5xx body, in OpenAI's shape."""

    error: ErrorDetail


class PrewarmResult(BaseModel):
    session_id: str
    promoted_tokens: int


class LoadModelRequest(_Body):
    """``POST /v1/warmstart/models/load``: the installed model to switch to."""

    model: Annotated[Text, Field(min_length=1, max_length=256)]
