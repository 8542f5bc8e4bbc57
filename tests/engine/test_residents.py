"""Which sequence a prompt gets (``Residents.claim``), on the fake engine: the same
bookkeeping drives the llama.cpp one."""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from warmstart.runtime.engine._fake import FakeEngine, FakeOptions
from warmstart.runtime.engine._residents import Resident

SHARED = list(range(1000, 1100))  # a system prompt: 100 tokens, one batch


def _held(engine: FakeEngine, tail: list[int]) -> Resident:
    """A conversation that shares SHARED, idle in the first sequence."""
    ids = SHARED + tail
    res, live = engine.claim(ids, [len(SHARED), len(ids)], None, share=True)
    assert live == 0 and res.seq == 0
    assert engine.prefill(res, ids, want_logits=True, ends=[len(SHARED), len(ids)])
    engine.release(res)
    return res


def _other_question(engine: FakeEngine, kept: Callable[[Resident], int]) -> tuple[Resident, int]:
    ids = [*SHARED, 7, 8, 9]
    return engine.claim(ids, [len(SHARED), len(ids)], None, True, len(SHARED), kept)


def test_a_conversation_the_store_keeps_whole_gives_its_sequence_to_another_question() -> None:
    engine = FakeEngine(512, 2, FakeOptions(prefill_delay=0.0))
    held = _held(engine, list(range(80)))  # more than a continuation may drop
    res, live = _other_question(engine, lambda r: len(r.tokens))
    # the shared prefix stays live where it is: no copy, no restore
    assert res is held and live == len(SHARED) and res.tokens == SHARED
    assert res.displaced == (SHARED + list(range(80)), [len(SHARED), len(SHARED) + 80], None)


@pytest.mark.parametrize(
    ("tail", "kept"),
    [
        (list(range(80)), lambda r: len(SHARED)),  # its own tail is not stored
        (list(range(120)), lambda r: len(r.tokens)),  # longer than the prefix it shares
    ],
    ids=["tail-not-stored", "tail-longer-than-shared"],
)
def test_otherwise_it_stays_live_and_another_sequence_loads_the_prefix(
    tail: list[int], kept: Callable[[Resident], int]
) -> None:
    engine = FakeEngine(512, 2, FakeOptions(prefill_delay=0.0))
    held = _held(engine, tail)
    res, live = _other_question(engine, kept)
    assert res is not held and held.tokens == SHARED + tail and res.displaced is None
    assert live == 0  # the store holds the shared prefix: a restore loads it


def _resident_changes(tree: ast.Module, fields: set[str]) -> Iterator[int]:
    """Lines that set, delete or grow a ``Resident`` field of an object other than
    ``self`` (no other class of the engine or the runtime has fields of those names)."""
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = [
                e for t in node.targets for e in (t.elts if isinstance(t, ast.Tuple) else [t])
            ]
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        elif isinstance(node, ast.Delete):
            targets = [t.value if isinstance(t, ast.Subscript) else t for t in node.targets]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            targets = [node.func.value] if node.func.attr in ("append", "extend") else []
        for t in targets:
            if not (isinstance(t, ast.Attribute) and t.attr in fields):
                continue
            if not (isinstance(t.value, ast.Name) and t.value.id == "self"):
                yield node.lineno


def test_a_resident_changes_only_in_its_own_module() -> None:
    """What a resident's KV holds is one module's bookkeeping (_residents.py): the
    engines and the pipeline call its methods, so both engines keep it alike."""
    fields = {f.name for f in dataclasses.fields(Resident)} - {"seq"}
    runtime = Path(__file__).resolve().parents[2] / "runtime"
    found = [
        f"{path.relative_to(runtime)}:{line}"
        for package in ("engine", "serving")
        for path in sorted((runtime / package).glob("*.py"))
        if path.name != "_residents.py"
        for line in _resident_changes(ast.parse(path.read_text("utf-8")), fields)
    ]
    assert found == []
