"""Chat messages -> prompt text, with the chat template stored in the GGUF."""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from typing import Any

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ..errors import ModelError, RequestError
from ..types import Message

# Used when a GGUF carries no template: ChatML is what most small instruct models expect.
CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _raise(message: str) -> None:
    raise RequestError(f"the model's chat template refused these messages: {message}")


class ChatTemplate:
    """Renders messages the way the model was trained to read them."""

    def __init__(self, source: str | None, bos_token: str, eos_token: str) -> None:
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
        try:
            self._template = env.from_string(source or CHATML)
        except TemplateError as exc:
            raise ModelError(f"the model's chat template does not parse: {exc}") from exc
        self._bos = bos_token
        self._eos = eos_token

    def render(self, messages: Sequence[Message], add_generation_prompt: bool = True) -> str:
        payload: list[dict[str, Any]] = [{"role": m.role, "content": m.content} for m in messages]
        try:
            return self._template.render(
                messages=payload,
                add_generation_prompt=add_generation_prompt,
                bos_token=self._bos,
                eos_token=self._eos,
            )
        except TemplateError as exc:
            raise RequestError(f"the chat template failed on these messages: {exc}") from exc
