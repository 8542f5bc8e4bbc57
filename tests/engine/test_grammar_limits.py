"""The limits a JSON schema and its grammar are held to before llama.cpp sees them
(issue 23: a 100-byte schema segfaulted the server). Pure, except the last test,
which holds the grammar check to llama.cpp's own parser."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from warmstart.runtime.engine import _grammar_limits as limits
from warmstart.runtime.engine._grammar_limits import grammar_problem, schema_problem
from warmstart.runtime.engine._grammars import json_schema_grammar
from warmstart.runtime.errors import RequestError


def _nested(depth: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "array", "items": schema}
    return schema


def _chain(n: int, twice: bool) -> dict[str, Any]:
    """$defs a0..an, each a_k an anyOf of a_{k+1} (twice: two refs to it)."""
    refs = 2 if twice else 1
    defs: dict[str, Any] = {
        f"a{k}": {"anyOf": [{"$ref": f"#/$defs/a{k + 1}"}] * refs + [{"type": "null"}]}
        for k in range(n)
    }
    defs[f"a{n}"] = {"type": "integer"}
    return {"$defs": defs, "anyOf": [{"$ref": "#/$defs/a0"}]}


REFUSED = [
    ({"type": "string", "maxLength": 20000}, "schema.maxLength is 20000; at most 500"),
    ({"type": "string", "minLength": 501}, "schema.minLength is 501"),
    ({"type": "array", "items": {"type": "integer"}, "maxItems": 1000000}, "schema.maxItems"),
    ({"type": "array", "minItems": 10**40}, "schema.minItems is 10000000..."),
    ({"enum": list(range(100000))}, "schema.enum has 100000 entries; at most 256"),
    ({"anyOf": [{"type": "string"}] * 257}, "schema.anyOf has 257 entries"),
    (
        {"properties": {"a": {"type": "string", "pattern": "^a{0,300}b{3,300}$"}}},
        "schema.properties.a.pattern repeats 600 times",
    ),
    ({"type": "string", "pattern": "^" + "a" * 1001 + "$"}, "schema.pattern is 1003 characters"),
    (
        {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(257)}},
        "schema.properties has 257 entries; at most 256",
    ),
    (_nested(40), "nests subschemas more than 32 deep"),
    # a $defs entry nothing uses is never converted, but recursive code reads it
    (
        {"$defs": {"x": _nested(400)}, "type": "string"},
        "schema nests JSON more than 100 deep; at most 100",
    ),
    # a ref used twice at each level: a short schema, an exponential grammar
    (_chain(10, twice=True), "more than 512 alternatives"),
    (
        {"type": "object", "properties": {f"p{i}": {"enum": list(range(200))} for i in range(3)}},
        "schema.properties.p2: more than 512 alternatives",
    ),
    (
        {"anyOf": [_nested(8)] * 250},
        "more than 2000 subschemas",
    ),
]


@pytest.mark.parametrize(("schema", "says"), REFUSED)
def test_a_schema_past_a_limit_is_refused_naming_the_keyword(schema: Any, says: str) -> None:
    problem = schema_problem(schema)
    assert problem is not None and says in problem, problem
    with pytest.raises(RequestError) as caught:
        json_schema_grammar(schema, param="format")
    assert caught.value.param == "format"
    assert str(caught.value).startswith("format: ") and says in str(caught.value)


ACCEPTED = [
    {"type": "string", "maxLength": 500},
    {"type": "array", "items": {"type": "integer"}, "minItems": 500, "maxItems": 500},
    {"enum": [f"value {i}" for i in range(256)]},
    {"type": "string", "pattern": "^[a-z]{0,250}-[0-9]{1,250}$"},
    _nested(32),
    _chain(15, twice=False),
    # recursive: a tree whose nodes hold lists of nodes
    {
        "$defs": {
            "node": {
                "type": "object",
                "properties": {"children": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
            }
        },
        "anyOf": [{"$ref": "#/$defs/node"}],
    },
]


@pytest.mark.parametrize("schema", ACCEPTED)
def test_schemas_within_the_limits_are_grammars(schema: Any) -> None:
    assert schema_problem(schema) is None
    assert grammar_problem(json_schema_grammar(schema)) is None


def test_a_path_quoted_in_an_error_is_kept_short() -> None:
    schema = {"properties": {"x" * 10000: {"type": "string", "maxLength": 10**6}}}
    problem = schema_problem(schema)
    assert problem is not None and problem.endswith("maxLength is 1000000; at most 500")
    assert len(problem) < 300


def test_a_grammar_too_large_is_refused_after_conversion() -> None:
    schema = {"const": "x" * (limits.MAX_GRAMMAR_BYTES + 1)}
    with pytest.raises(RequestError, match=r"response_format: .*the grammar is \d+ bytes"):
        json_schema_grammar(schema)


@pytest.mark.parametrize(
    ("grammar", "says"),
    [
        ("root ::= " + "(" * 1001 + '"a"' + ")" * 1001, "nests groups more than 1000 deep"),
        ('root ::= "a"{2001}', "repeats at least 2001 times"),
        ('root ::= ("a" ("b")?){1000}', "repeats a group of 3 rules 1000 times"),
        ('root ::= ""?', "repeats nothing"),
        ('root ::= ("a"', "unclosed group"),
        ('root ::= "a" b', "uses a rule it does not define (b)"),
        ("root ::= @", "a character it cannot read ('@')"),
    ],
)
def test_what_llama_cpp_would_refuse_or_crash_on_is_named(grammar: str, says: str) -> None:
    problem = grammar_problem(grammar)
    assert problem is not None and says in problem, problem


def _converted(schema: dict[str, Any]) -> str:
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    return str(json_schema_to_gbnf(json.dumps(schema)))


@pytest.mark.slow
def test_the_grammar_check_agrees_with_llama_cpp_at_its_edges(model_path: Path) -> None:
    """Grammars from schemas past warmstart's own limits, about llama.cpp's threshold:
    the check must refuse exactly what llama.cpp's parser refuses (each of those
    prints its grammar to stderr: that is what the check spares the log)."""
    import llama_cpp.llama_cpp as ll
    from warmstart.runtime.engine._llama import LlamaModel

    model = LlamaModel(model_path, 0)
    try:
        for n in (999, 1000, 1001, 1010):
            for schema in (
                {"type": "string", "maxLength": n},
                {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": n},
                {"type": "string", "pattern": f"^(ab{{0,{n}}})?$"},
                {"type": "string", "pattern": f"^(a{{0,{n // 2}}}b{{0,{n // 2}}})*$"},
                {"type": "string", "pattern": f"^(x?){{0,{n}}}$"},
            ):
                grammar = _converted(schema)
                sampler = ll.llama_sampler_init_grammar(model.vocab, grammar.encode(), b"root")
                if sampler:
                    ll.llama_sampler_free(sampler)
                assert (grammar_problem(grammar) is None) == bool(sampler), schema
    finally:
        model.close()
