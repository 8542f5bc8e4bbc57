"""One chat turn from the terminal: a line, a pasted block, or a \"\"\" block (no model)."""

from __future__ import annotations

import os

import pytest
from warmstart.runtime.cli._lines import TurnReader, waiting_on


class Typed:
    """Lines as input() returns them; ``pasted`` marks the lines that arrive together
    with the one before (so ``more()`` is true before each of them)."""

    def __init__(self, *lines: str, pasted: frozenset[int] = frozenset()) -> None:
        self.lines, self.pasted, self.i = list(lines), pasted, 0
        self.prompts: list[str] = []

    def read(self, prompt: str) -> str:
        self.prompts.append(prompt)
        if self.i >= len(self.lines):
            raise EOFError
        self.i += 1
        return self.lines[self.i - 1]

    def more(self) -> bool:
        return self.i in self.pasted


def test_typed_lines_are_turns_each() -> None:
    t = Typed("hello", "again")
    read = TurnReader(t.read, t.more)
    assert read("> ") == "hello" and read("> ") == "again"
    with pytest.raises(EOFError):
        read("> ")


def test_a_pasted_block_is_one_turn() -> None:
    t = Typed("first line", "second", "third", "typed later", pasted=frozenset({1, 2}))
    read = TurnReader(t.read, t.more)
    assert read("> ") == "first line\nsecond\nthird"
    assert read("> ") == "typed later"


def test_a_fenced_block_is_one_turn() -> None:
    t = Typed('"""', "def f():", "    return 1", '"""', '"""inline"""', '"""opened', 'closed"""')
    read = TurnReader(t.read, t.more)
    assert read("> ") == "def f():\n    return 1"
    assert t.prompts[1:4] == ["... "] * 3
    assert read("> ") == "inline"
    assert read("> ") == "opened\nclosed"


def test_an_unclosed_block_at_the_end_of_input_still_counts() -> None:
    read = TurnReader(Typed('"""', "a", "b").read)
    assert read("> ") == "a\nb"


def test_waiting_on_sees_what_is_already_there() -> None:
    r, w = os.pipe()
    try:
        more = waiting_on(r, gap_s=0.01)
        assert not more()
        os.write(w, b"x\n")
        assert more()
    finally:
        os.close(r)
        os.close(w)
