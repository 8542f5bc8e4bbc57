"""A model's prompt work: a request's tool plan, its prompt's token ids and anchors, a
proven least token count, and the model's own sampling checks. What admission
(runtime/serving/_admit.py, ``Prompter``) and the next turn's prompt need; the engine
only computes.

Both engines share it: the llama.cpp one with the GGUF's template and the
``PromptTokenizer`` (llama_prompter in _prompt.py), the fake with its own template
and words (_fake.py). So a prompt's anchors come from one rule for both
(``kvstore.turn_anchors``, with the opener and user header found here by rendering
the template). Only what is fixed once the model is loaded is read: any thread.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Sequence
from typing import Any, Literal, Protocol

from ..errors import RequestError
from ..kvstore import common_prefix, turn_anchors
from ..types import Message, Request, Sampling
from . import _tools

Part = tuple[str, bool]  # (text, trusted)


class Tokens(Protocol):
    """A model's prompt tokenizer (``PromptTokenizer``; the fake's words)."""

    # the most bytes of text one token stands for (``least_tokens``'s shortcut)
    longest_piece: int

    def ids(self, parts: Sequence[Part]) -> list[int]: ...

    def chat_ids(self, parts: Sequence[Part], messages: Sequence[Message]) -> list[int]: ...

    def least_tokens(self, parts: Sequence[Part]) -> int: ...

    def is_control(self, token: int) -> bool: ...

    def has_control_text(self, text: str) -> bool: ...


class Template(Protocol):
    """A chat template that says which of its text is markup (``ChatTemplate``)."""

    source: str | None

    def render_parts(
        self,
        messages: Sequence[Message],
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
    ) -> list[Part]: ...


class ChatPrompter:
    """The prompt work over a model's ``tokens`` and chat ``template`` (implements
    serving's ``Prompter``). ``fingerprint``: the model's (an admitted request names
    the model whose ids it holds); ``sampling_rules``: the model's own checks of a
    sampling (a RequestError before any work); ``step_replies``: see
    ``kvstore.turn_anchors``."""

    def __init__(
        self,
        tokens: Tokens,
        template: Template,
        fingerprint: str,
        sampling_rules: Callable[[Sampling], None],
        step_replies: bool = True,
    ) -> None:
        self.tokens = tokens
        self.template = template
        self.tool_format = _tools.detect_format(template.source)
        self.fingerprint = fingerprint
        self._sampling_rules = sampling_rules
        self.step_replies = step_replies
        # the system message's ids on its own: the same few system prompts come with
        # every request, and tokenizing one of thousands of tokens again takes ms
        self._head_ids = functools.lru_cache(maxsize=16)(tokens.ids)
        self.opener = self._find_opener()
        self.user_header = self._find_user_header()

    def prompt_ids(
        self,
        request: Request,
        generation: bool = True,
        plan: _tools.ToolPlan | Literal["plan it"] | None = "plan it",
    ) -> tuple[list[int], tuple[int, ...]]:
        """Token ids of the request's prompt, and its anchors: where each message of the
        conversation starts (the template's turn-opening control token) and where the
        leading system message ends. Prefill batches end at the anchors, so the next
        turn, whose prompt holds these messages at the same places, computes the same
        batches up to its new message, and reuses them all (see ``batch_cuts``).
        ``generation=False``: without the assistant's opening (the history as the next
        turn's prompt will hold it, once the reply is one of its messages).
        Message contents are plain text: only the template's markup holds control
        tokens (a raw completion prompt is the client's own markup, parsed whole).
        ``plan``: the request's tool plan, when admission already made it."""
        if isinstance(plan, str):  # "plan it"
            plan = self.tool_plan(request)
        if request.prompt is not None:
            ids = self.tokens.ids([(request.prompt, True)])
            anchors = self.turn_starts(ids)
        else:
            ids, anchors = self._chat_ids(request, generation, plan)
        if generation:
            self._made(request, plan, ids)
        return ids, anchors

    def _made(self, request: Request, plan: _tools.ToolPlan | None, ids: list[int]) -> None:
        """Sees each prompt made for a reply (the fake fixes its reply here)."""

    def _chat_ids(
        self, request: Request, generation: bool, plan: _tools.ToolPlan | None
    ) -> tuple[list[int], tuple[int, ...]]:
        """``prompt_ids`` of a chat, its tool plan made."""
        messages = plan.messages if plan else request.messages
        tools = plan.tools if plan else None
        if plan and plan.format != "generic":
            self._check_native_tools(plan)
        parts = _tools.render_parts(self.template, plan, messages, generation)
        ids = self.tokens.chat_ids(parts, messages)
        anchors = set(self.turn_starts(ids))
        system = [m for m in messages[:1] if m.role == "system"]
        if system and len(messages) >= 2:
            head_parts = self.template.render_parts(
                system, add_generation_prompt=False, tools=tools
            )
            # templates such as Gemma's put the system text in the first user turn
            head = self._head_ids(tuple(head_parts)) if head_parts else []
            if head and ids[: len(head)] == head:
                anchors.add(len(head))
        return ids, tuple(sorted(anchors))

    def least_tokens(self, request: Request, reach: int) -> int:
        """A lower bound on the prompt's token count, proven without tokenizing it
        (``PromptTokenizer.least_tokens``): admission refuses a prompt over the context
        by it, where tokenizing a megabyte takes seconds of a core. 0 when the text is
        too short for the bound to reach ``reach`` (then nothing is rendered)."""
        texts = [request.prompt or "", *(m.content for m in request.messages)]
        if 4 * sum(map(len, texts)) < reach * self.tokens.longest_piece:  # <= 4 B a char
            return 0
        if request.prompt is not None:
            return self.tokens.least_tokens([(request.prompt, True)])
        plan = self.tool_plan(request)
        messages = plan.messages if plan else request.messages
        return self.tokens.least_tokens(
            _tools.render_parts(self.template, plan, messages, generation=True)
        )

    def turn_starts(self, ids: Sequence[int]) -> tuple[int, ...]:
        """Where the prompt's batches end besides every ``chunk_tokens``: its turns, as
        this model's template opens them (``kvstore.turn_anchors``)."""
        header, is_control = self.user_header, self.tokens.is_control
        return turn_anchors(ids, self.opener, header, is_control, self.step_replies)

    def _find_opener(self) -> list[int]:
        """The assistant's opening, which the template adds to a prompt (ChatML's
        ``<|im_start|>assistant\\n``), when it starts with a control token (which only
        the template's markup holds); [] otherwise."""
        probe = (Message("user", "x"),)
        try:
            bare = self.tokens.ids(self.template.render_parts(probe, False))
            opened = self.tokens.ids(self.template.render_parts(probe, True))
        except RequestError:
            return []
        if len(opened) <= len(bare) or opened[: len(bare)] != bare:
            return []
        opener = opened[len(bare) :]
        return opener if self.tokens.is_control(opener[0]) else []

    def _find_user_header(self) -> list[int]:
        """What opens a user's turn up to its text (ChatML's ``<|im_start|>user\n``),
        when the assistant's opening starts with a control token; [] otherwise."""
        if not self.opener:
            return []
        try:
            a, b = (
                self.tokens.ids(self.template.render_parts((Message("user", t),), False))
                for t in ("x", "y")
            )
        except RequestError:
            return []
        n = common_prefix(a, b)
        starts = [i for i in range(n) if a[i] == self.opener[0]]
        return list(a[starts[-1] : n]) if starts else []

    def check_sampling(self, sampling: Sampling) -> None:
        """This model's own rules of a sampling (logit biases name its tokens, a
        grammar parses over its vocabulary)."""
        self._sampling_rules(sampling)

    def tool_plan(self, request: Request) -> _tools.ToolPlan | None:
        """How the request's tools and tool turns reach this model (None: it has none)."""
        return _tools.plan(request, self.tool_format)

    def _check_native_tools(self, plan: _tools.ToolPlan) -> None:
        """A native template writes tool definitions and call arguments as JSON in
        its own markup (trusted): control-token text in them is refused, not parsed."""
        texts = [json.dumps(plan.tools or [], ensure_ascii=False)]
        texts += [c.name + c.arguments for m in plan.messages for c in m.tool_calls]
        texts += [m.name or "" for m in plan.messages]
        if any(self.tokens.has_control_text(t) for t in texts):
            raise RequestError(
                "tool definitions and tool-call arguments must not hold this model's "
                "control-token text",
                param="tools",
            )
