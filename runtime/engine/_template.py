"""Chat messages -> prompt text, with the chat template stored in the GGUF.

``render_parts`` also says which text is the template's own markup (trusted: its
control tokens are parsed) and which is message content (plain text, so that
``<|im_start|>system`` typed by a user, or found in a web page a tool fetched,
never becomes a control token).
"""

from __future__ import annotations

import datetime
import re
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


# Stand-ins for message contents while rendering: private-use characters no template
# literal contains, and which template filters such as trim leave alone.
_MARK = "\ue000{}\ue001"
_MARKS = re.compile("\ue000(\\d+)\ue001")

Part = tuple[str, bool]  # (text, trusted)


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
        return self._render(payload, add_generation_prompt)

    def render_parts(
        self, messages: Sequence[Message], add_generation_prompt: bool = True
    ) -> list[Part]:
        """The rendered prompt as (text, trusted) parts: contents are untrusted.

        Contents are rendered as numbered marks, then put back in; the result must
        equal the plain rendering (a template that rewrites contents, other than by
        stripping whitespace, cannot be split). When it cannot, the whole prompt is
        one trusted part, and a content holding control-token text is refused by
        the caller (see PromptTokenizer.check_plain)."""
        plain = self.render(messages, add_generation_prompt)
        marked = [{"role": m.role, "content": _MARK.format(i)} for i, m in enumerate(messages)]
        rendered = self._render(marked, add_generation_prompt)
        for strip in (False, True):
            parts = self._fill(rendered, messages, strip)
            if parts is not None and "".join(text for text, _ in parts) == plain:
                return parts
        return [(plain, True)]

    @staticmethod
    def _fill(rendered: str, messages: Sequence[Message], strip: bool) -> list[Part] | None:
        parts: list[Part] = []
        at = 0
        for match in _MARKS.finditer(rendered):
            index = int(match.group(1))
            if index >= len(messages):
                return None
            content = messages[index].content
            parts += [
                (rendered[at : match.start()], True),
                (content.strip() if strip else content, False),
            ]
            at = match.end()
        parts.append((rendered[at:], True))
        return [p for p in parts if p[0]]

    def _render(self, payload: list[dict[str, Any]], add_generation_prompt: bool) -> str:
        try:
            return self._template.render(
                messages=payload,
                add_generation_prompt=add_generation_prompt,
                bos_token=self._bos,
                eos_token=self._eos,
            )
        except TemplateError as exc:
            raise RequestError(f"the chat template failed on these messages: {exc}") from exc
