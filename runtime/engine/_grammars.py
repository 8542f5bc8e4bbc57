"""GBNF grammars for structured output: any JSON object, or JSON matching a schema.

Both come from llama-cpp-python (its ``JSON_GBNF`` and its port of llama.cpp's JSON
schema converter), imported when first needed: the light parts of the runtime (the
fake, the app's client) never load llama.cpp.
"""

from __future__ import annotations

import json
from typing import Any

from ..errors import RequestError
from ._grammar_limits import grammar_problem, schema_problem, subschemas


def json_object_grammar() -> str:
    """Any JSON object (OpenAI's ``json_object`` mode)."""
    from llama_cpp.llama_grammar import JSON_GBNF

    return str(JSON_GBNF)


# Constraints llama-cpp-python 0.3.36's converter drops without a word: a reply could
# then break them, so a schema that uses one is refused rather than half honoured.
IGNORED_KEYWORDS = frozenset(
    {
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "multipleOf",
        "uniqueItems",
        "not",
        "if",
        "then",
        "else",
        "patternProperties",
        "propertyNames",
        "minProperties",
        "maxProperties",
        "contains",
        "minContains",
        "maxContains",
        "dependentRequired",
        "dependentSchemas",
        "unevaluatedProperties",
        "unevaluatedItems",
    }
)
# string formats the converter has a rule for (any other it ignores)
FORMATS = frozenset(
    {"date", "time", "date-time", "uuid", "uuid1", "uuid2", "uuid3", "uuid4", "uuid5"}
)


def ignored_keyword(schema: object, where: str = "schema") -> str | None:
    """The path of the first keyword in ``schema`` the converter would ignore."""
    if not isinstance(schema, dict):
        return None
    for key in schema:
        if key in IGNORED_KEYWORDS:
            return f"{where}.{key}"
    if "format" in schema and schema["format"] not in FORMATS:
        return f"{where}.format"
    children = subschemas(schema, where)
    return next((found for path, sub in children if (found := ignored_keyword(sub, path))), None)


def json_schema_grammar(schema: dict[str, Any], param: str = "response_format") -> str:
    """The grammar of JSON documents that match ``schema``; RequestError naming
    ``param`` when the converter cannot handle the schema, or would ignore part of it."""
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    check_schema(schema, param)  # first: it bounds the depth ignored_keyword recurses to
    if (keyword := ignored_keyword(schema)) is not None:
        message = f"{param}: {keyword} is not supported in a JSON schema by warmstart's grammar"
        raise RequestError(message, param=param)
    try:
        grammar = _no_control_chars(str(json_schema_to_gbnf(json.dumps(schema))))
    # the converter says "unsupported" with assert, ValueError, KeyError, TypeError or
    # a RecursionError on a cyclic $ref: any of them is the schema's fault, not ours
    except Exception as exc:
        why = str(exc) or type(exc).__name__
        message = f"{param}: this JSON schema cannot be turned into a grammar ({why})"
        raise RequestError(message, param=param) from exc
    check_grammar_text(grammar, param)
    return grammar


def check_schema(schema: dict[str, Any], param: str, where: str = "schema") -> None:
    """RequestError naming ``param``, the keyword's path and the limit, when ``schema``
    asks for more than a grammar may (see _grammar_limits): before any conversion."""
    if (problem := schema_problem(schema, where)) is not None:
        raise RequestError(f"{param}: {problem} (warmstart's grammar limit)", param=param)


def check_grammar_text(grammar: str, param: str | None) -> None:
    """RequestError when llama.cpp's parser would refuse or crash on ``grammar``:
    said here, so that llama.cpp never sees it (and never prints it)."""
    if (problem := grammar_problem(grammar)) is not None:
        prefix = f"{param}: the JSON schema is too large: " if param else ""
        raise RequestError(f"{prefix}{problem} (warmstart's grammar limit)", param=param)


def _no_control_chars(grammar: str) -> str:
    """The 0.3.36 converter lets a JSON string hold raw control characters (a newline
    inside a string: the reply does not parse); llama.cpp's own converter and
    ``JSON_GBNF`` exclude them, as JSON does. Its ``char`` rule is narrowed the same way."""
    lines = grammar.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("char ::= "):
            lines[i] = line.replace(r'[^"\\]', r'[^"\\\x7F\x00-\x1F]', 1)
    return "\n".join(lines) + "\n"
