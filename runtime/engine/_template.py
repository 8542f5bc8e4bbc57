"""Chat messages -> prompt text, with the chat template stored in the GGUF, or, when
the GGUF has none, the one of llama.cpp's built-in templates its architecture uses.

``render_parts`` also says which text is the template's own markup (trusted: its
control tokens are parsed) and which is message content (plain text, so that
``<|im_start|>system`` typed by a user, or found in a web page a tool fetched,
never becomes a control token).
"""

from __future__ import annotations

import datetime
import json
import logging
import re
from collections.abc import Sequence
from typing import Any, Protocol

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ..errors import ModelError, RequestError
from ..types import Message
from ._llama import apply_builtin_template
from ._prompter import Part
from ._tools import arguments_value

log = logging.getLogger(__name__)

# llama.cpp's built-in template for each architecture whose GGUFs sometimes come
# without a template (``general.architecture`` -> template name). A guess is checked
# before use (see template_for): the turn must end with a token the model stops at.
BUILTIN_BY_ARCHITECTURE = {
    "gemma": "gemma",
    "gemma2": "gemma",
    "gemma3": "gemma",
    "gemma3n": "gemma",
    "llama": "llama3",  # Llama 3.x; a Llama 2 vocabulary has no <|eot_id|> and is refused
    "qwen2": "chatml",
    "qwen3": "chatml",
    "phi3": "phi3",
    "mistral3": "mistral-v7-tekken",
}


# Stand-ins for message contents while rendering: private-use characters no template
# literal contains, and which template filters such as trim leave alone.
_MARK = "\ue000{}\ue001"
_MARKS = re.compile("\ue000(\\d+)\ue001")

Tools = list[dict[str, Any]] | None  # the ``tools`` a template receives, OpenAI's shape


def _tojson(
    value: Any, indent: int | None = None, separators: Any = None, sort_keys: bool = False
) -> str:
    return json.dumps(
        value, ensure_ascii=False, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _payload(m: Message, content: str) -> dict[str, Any]:
    """A message in the shape Hugging Face chat templates read."""
    out: dict[str, Any] = {"role": m.role, "content": content}
    if m.tool_calls:
        out["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.name, "arguments": arguments_value(c.arguments)},
            }
            for c in m.tool_calls
        ]
    if m.tool_call_id is not None:
        out["tool_call_id"] = m.tool_call_id
    if m.name is not None:
        out["name"] = m.name
    return out


def _raise(message: str) -> None:
    raise RequestError(f"the model's chat template refused these messages: {message}")


class ChatTemplate:
    """Renders messages the way the model was trained to read them."""

    name = "the GGUF's own"
    source: str | None = None

    def __init__(self, source: str | None, bos_token: str, eos_token: str) -> None:
        if source is None:
            raise ModelError("the model has no chat template")
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
        # as Hugging Face renders templates (and tool schemas were trained on): plain
        # JSON, not Jinja's HTML-escaped one (``<`` as ``\\u003c``)
        env.filters["tojson"] = _tojson
        try:
            self._template = env.from_string(source)
        except TemplateError as exc:
            raise ModelError(f"the model's chat template does not parse: {exc}") from exc
        self._bos = bos_token
        self._eos = eos_token
        self.source = source

    def render(
        self,
        messages: Sequence[Message],
        add_generation_prompt: bool = True,
        tools: Tools = None,
    ) -> str:
        payload = [_payload(m, m.content) for m in messages]
        return self._render(payload, add_generation_prompt, tools)

    def render_parts(
        self,
        messages: Sequence[Message],
        add_generation_prompt: bool = True,
        tools: Tools = None,
    ) -> list[Part]:
        """The rendered prompt as (text, trusted) parts: contents are untrusted.

        Contents are rendered as numbered marks, then put back in; the result must
        equal the plain rendering (a template that rewrites contents, other than by
        stripping whitespace, cannot be split). When it cannot, the whole prompt is
        one trusted part, and a content holding control-token text is refused by
        the caller (see PromptTokenizer.check_plain). An empty content is not marked:
        templates test it (``{% if message.content %}``, a turn that only calls tools).
        ``tools`` and tool-call arguments are the template's to render (as JSON): they
        stay in trusted parts, and the caller refuses control-token text in them."""
        plain = self.render(messages, add_generation_prompt, tools)
        marked = [_payload(m, _MARK.format(i) if m.content else "") for i, m in enumerate(messages)]
        rendered = self._render(marked, add_generation_prompt, tools)
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

    def _render(
        self, payload: list[dict[str, Any]], add_generation_prompt: bool, tools: Tools = None
    ) -> str:
        extra = {} if tools is None else {"tools": tools}
        try:
            return self._template.render(
                messages=payload,
                add_generation_prompt=add_generation_prompt,
                bos_token=self._bos,
                eos_token=self._eos,
                **extra,
            )
        except TemplateError as exc:
            raise RequestError(f"the chat template failed on these messages: {exc}") from exc


class BuiltinTemplate(ChatTemplate):
    """One of llama.cpp's built-in templates, by name (for GGUFs that carry none)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._render([{"role": "user", "content": "x"}], True)  # an unknown name fails here

    def _render(
        self, payload: list[dict[str, Any]], add_generation_prompt: bool, tools: Tools = None
    ) -> str:
        turns = [(m["role"], m["content"]) for m in payload]
        return apply_builtin_template(self.name, turns, add_generation_prompt)


class TemplateModel(Protocol):
    """What choosing a template needs to know of a model."""

    def chat_template(self) -> str | None: ...

    def meta(self, key: str) -> str | None: ...

    def is_eog(self, token: int) -> bool: ...


class ControlTokens(Protocol):
    def control_ids(self, text: str) -> list[int]: ...


def template_for(
    model: TemplateModel, tokens: ControlTokens, bos_token: str, eos_token: str
) -> ChatTemplate:
    """The GGUF's own template; else llama.cpp's built-in one for its architecture,
    if the model stops at the end of that template's turns (else another family's
    end marker would be written into the replies); else a clear refusal."""
    source = model.chat_template()
    if source is not None:
        return ChatTemplate(source, bos_token, eos_token)
    arch = model.meta("general.architecture") or "unknown"
    name = BUILTIN_BY_ARCHITECTURE.get(arch)
    if name is None:
        raise ModelError(
            f"the model has no chat template and warmstart knows none for its "
            f"architecture {arch!r}; use a GGUF that carries its chat template"
        )
    template = BuiltinTemplate(name)
    end = end_of_turn(template)
    if not any(model.is_eog(t) for t in tokens.control_ids(end)):
        raise ModelError(
            f"the model has no chat template, and the {name!r} template its architecture "
            f"({arch}) usually has ends turns with {end.strip()!r}, which this model does "
            "not stop at; use a GGUF that carries its chat template"
        )
    log.info("the model has no chat template: using llama.cpp's %r for %s", name, arch)
    return template


def end_of_turn(template: ChatTemplate) -> str:
    """The markup a template writes after an assistant's reply."""
    reply = "\ue002"
    turns = [Message("user", "q"), Message("assistant", reply)]
    text = template.render(turns, add_generation_prompt=False)
    return text[text.rindex(reply) + len(reply) :]
