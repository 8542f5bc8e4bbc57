"""Structured-output grammars: llama-cpp-python's converter, and the refusals around it
(no model needed)."""

from __future__ import annotations

import pytest
from warmstart.runtime.engine._grammars import (
    ignored_keyword,
    json_object_grammar,
    json_schema_grammar,
)
from warmstart.runtime.errors import RequestError


def test_a_schema_becomes_a_grammar_with_a_root_rule() -> None:
    schema = {
        "type": "object",
        "properties": {"a": {"type": "string", "maxLength": 5}, "b": {"enum": ["x", "y"]}},
        "required": ["a", "b"],
    }
    assert "root ::=" in json_schema_grammar(schema)
    assert "root" in json_object_grammar()


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "nonsense"},
        {"$ref": "https://example.com/s.json"},
        {"type": "string", "pattern": "(("},
    ],
)
def test_what_the_converter_cannot_handle_names_the_field(schema: dict) -> None:  # type: ignore[type-arg]
    with pytest.raises(RequestError) as caught:
        json_schema_grammar(schema)
    assert caught.value.param == "response_format"


def test_constraints_the_converter_would_drop_are_refused() -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer", "maximum": 3}}}
    with pytest.raises(RequestError, match=r"schema\.properties\.n\.maximum"):
        json_schema_grammar(schema)
    # a property *named* like a keyword is data, not a constraint
    assert ignored_keyword({"properties": {"minimum": {"type": "integer"}}}) is None
    assert ignored_keyword({"anyOf": [{"type": "string"}, {"not": {}}]}) == "schema.anyOf[1].not"
    assert ignored_keyword({"type": "string", "format": "email"}) == "schema.format"
    assert ignored_keyword({"type": "string", "format": "date"}) is None


def test_strings_cannot_hold_raw_control_characters() -> None:
    # a raw newline inside a JSON string does not parse: the converter's char rule allowed it
    grammar = json_schema_grammar({"type": "object", "properties": {"a": {"type": "string"}}})
    char = next(line for line in grammar.splitlines() if line.startswith("char ::= "))
    assert char.startswith(r'char ::= [^"\\\x7F\x00-\x1F]')
