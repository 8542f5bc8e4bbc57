"""Prompt text -> token ids, where only trusted text may become control tokens.

llama.cpp's ``parse_special`` applies to a whole string, so a user who types
``<|im_start|>system`` would open a system turn. Here the template's own markup
(trusted) is split at control-token texts in Python, and every stretch of text
between two control tokens, markup and message content alike, is tokenized with
``parse_special=False``. For content without control-token text the ids are the
ones llama.cpp gives the whole string (it too tokenizes the text between special
tokens piece by piece), so cached prefixes keep their keys.

It is also linear in the prompt: llama.cpp's special-token partition searches to
the end of the text once per fragment and special token, which made 50,000 short
messages take minutes.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Protocol

import llama_cpp.llama_cpp as ll

from ..errors import RequestError
from ..types import Message
from ._prompter import ChatPrompter, Part
from ._sampling import check_sampling
from ._template import template_for

if TYPE_CHECKING:
    from ._llama import LlamaModel

# The tokens llama.cpp matches in text only when asked to parse special tokens;
# user-defined ones it matches either way, so the plain tokenizer handles them.
_CONTROL = ll.LLAMA_TOKEN_ATTR_CONTROL | ll.LLAMA_TOKEN_ATTR_UNKNOWN
# a run of text this long or shorter is tokenized once: the same system prompt and
# history come back with every request of a conversation (2 ms for 1,900 tokens here,
# twice a turn: admission, and the next turn's prompt after the reply)
CACHED_RUN_CHARS = 1 << 16
_SPELLED = frozenset({ll.LLAMA_VOCAB_TYPE_SPM, ll.LLAMA_VOCAB_TYPE_BPE, ll.LLAMA_VOCAB_TYPE_RWKV})


class Vocabulary(Protocol):
    vocab: object
    n_vocab: int
    add_bos: bool
    bos: int
    eos: int

    def tokenize(self, text: str, add_special: bool, parse_special: bool = True) -> list[int]: ...

    def token_text(self, token: int) -> str: ...


def trie_pattern(words: Iterable[str]) -> str:
    """A regex matching any of ``words``, the longest at each position, built as a
    trie so that matching costs the length of the match, not the number of words
    (Gemma's vocabulary has thousands of control tokens)."""
    trie: dict[str, dict] = {}
    for word in words:
        node = trie
        for ch in word:
            node = node.setdefault(ch, {})
        node[""] = {}

    def emit(node: dict[str, dict]) -> str:
        branches = [re.escape(ch) + emit(child) for ch, child in sorted(node.items()) if ch]
        if not branches:
            return ""
        body = branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"
        return f"(?:{body})?" if "" in node else body

    return emit(trie)


class PromptTokenizer:
    def __init__(self, model: Vocabulary) -> None:
        self._model = model
        self._specials: dict[str, tuple[int, int]] = {}
        # the most bytes of text one token stands for: its vocabulary text is at least
        # as long as its piece (a BPE byte is one or two characters there, a space in
        # SentencePiece three bytes, a byte token "<0x0A>" six)
        self.longest_piece = 1
        for token in range(model.n_vocab):
            attr = int(ll.llama_vocab_get_attr(model.vocab, token))
            text = model.token_text(token)
            self.longest_piece = max(self.longest_piece, len(text.encode()))
            if attr & _CONTROL and text and text not in self._specials:
                self._specials[text] = (token, attr)
        self._control_ids = frozenset(token for token, _ in self._specials.values())
        pattern = trie_pattern(self._specials)
        self._split = re.compile(pattern) if pattern else None
        # vocabularies whose pieces spell the text they were cut from, whole and in
        # order (WordPiece and Unigram drop or fold characters: no bound there)
        self._spelled = int(ll.llama_vocab_type(model.vocab)) in _SPELLED
        self._bos_text = model.token_text(model.bos) if model.bos >= 0 else ""
        self._add_eos = bool(ll.llama_vocab_get_add_eos(model.vocab))
        self._plain_ids = functools.lru_cache(maxsize=128)(self._tokenize_plain)

    def is_control(self, token: int) -> bool:
        return token in self._control_ids

    def has_control_text(self, text: str) -> bool:
        return bool(self._split and self._split.search(text))

    def control_ids(self, text: str) -> list[int]:
        """The control tokens that ``text``, read as trusted markup, holds."""
        matches = self._split.finditer(text) if self._split else ()
        return [self._specials[m.group()][0] for m in matches]

    def least_tokens(self, parts: Sequence[Part]) -> int:
        """A lower bound on ``len(ids(parts))``, proven without tokenizing (0 where none
        is): every token stands for at most ``longest_piece`` bytes of the text it was
        cut from, and nothing drops text but the whitespace next to a control token,
        so each plain part's stripped bytes need that many tokens at least. Parts
        holding control-token text are left out (one token stands for that text)."""
        if not self._spelled:
            return 0
        plain = sum(
            len(text.strip().encode())
            for text, trusted in parts
            if not (trusted and self.has_control_text(text))
        )
        return -(-plain // self.longest_piece)

    def chat_ids(self, parts: Sequence[Part], messages: Sequence[Message]) -> list[int]:
        """Ids of a rendered chat. When the template could not be split into markup
        and contents (one trusted part), a content holding control-token text is
        refused rather than parsed."""
        if len(parts) == 1 and parts[0][1]:
            for i, message in enumerate(messages):
                if self.has_control_text(message.content):
                    raise RequestError(
                        "this model's chat template rewrites message contents, so "
                        "control-token text in them cannot be kept plain; remove it",
                        param=f"messages.{i}.content",
                    )
        return self.ids(parts)

    def ids(self, parts: Sequence[Part]) -> list[int]:
        """Token ids of the concatenated parts, with BOS (and EOS) as llama.cpp's
        ``add_special`` adds them; control tokens come from trusted parts only."""
        pieces = self._pieces(parts)
        model = self._model
        starts_with_bos = bool(parts) and parts[0][1] and parts[0][0].startswith(self._bos_text)
        add = model.add_bos and not (self._bos_text and starts_with_bos)
        out: list[int] = [model.bos] if add and model.bos >= 0 else []
        for piece in pieces:
            if isinstance(piece, int):
                out.append(piece)
            elif len(piece) <= CACHED_RUN_CHARS:
                out += self._plain_ids(piece)
            else:
                out += self._tokenize_plain(piece)
        if add and self._add_eos and model.eos >= 0:
            out.append(model.eos)
        return out

    def _tokenize_plain(self, text: str) -> tuple[int, ...]:
        return tuple(self._model.tokenize(text, add_special=False, parse_special=False))

    def _pieces(self, parts: Sequence[Part]) -> list[str | int]:
        """Raw text runs (markup and content joined) and control token ids."""
        run = _Run()
        for chunk, trusted in parts:
            at = 0
            matches = self._split.finditer(chunk) if trusted and self._split else ()
            for match in matches:
                run.add(chunk[at : match.start()])
                token, attr = self._specials[match.group()]
                run.token(token, attr)
                at = match.end()
            run.add(chunk[at:])
        return run.close()


def llama_prompter(model: LlamaModel, fingerprint: str, step_replies: bool) -> ChatPrompter:
    """The prompt work of a llama.cpp model: its tokenizer (above), its GGUF's chat
    template (or llama.cpp's built-in one), its vocabulary's sampling rules."""
    tokens = PromptTokenizer(model)
    bos = model.token_text(model.bos) if model.bos >= 0 else ""
    eos = model.token_text(model.eos) if model.eos >= 0 else ""
    template = template_for(model, tokens, bos, eos)
    rules = functools.partial(check_sampling, model)
    return ChatPrompter(tokens, template, fingerprint, rules, step_replies)


class _Run:
    """Collects the pieces; honours the LSTRIP/RSTRIP attributes of control tokens
    (whitespace next to them is dropped), as llama.cpp's partition does."""

    def __init__(self) -> None:
        self.pieces: list[str | int] = []
        self._text: list[str] = []
        self._strip_next = False

    def add(self, raw: str) -> None:
        if self._strip_next:
            raw = raw.lstrip()
        if raw:
            self._text.append(raw)
            self._strip_next = False

    def token(self, token: int, attr: int) -> None:
        text = "".join(self._text)
        if attr & ll.LLAMA_TOKEN_ATTR_LSTRIP:
            text = text.rstrip()
        if text:
            self.pieces.append(text)
        self.pieces.append(token)
        self._text = []
        self._strip_next = bool(attr & ll.LLAMA_TOKEN_ATTR_RSTRIP)

    def close(self) -> list[str | int]:
        if self._text:
            self.pieces.append("".join(self._text))
        return self.pieces
