"""GBNF grammars for structured output: any JSON object, or JSON matching a schema.

Both come from llama-cpp-python (its ``JSON_GBNF`` and its port of llama.cpp's JSON
schema converter), imported when first needed: the light parts of the runtime (the
fake, the app's client) never load llama.cpp.
"""

from __future__ import annotations

import json
from typing import Any

from .errors import RequestError


def json_object_grammar() -> str:
    """Any JSON object (OpenAI's ``json_object`` mode)."""
    from llama_cpp.llama_grammar import JSON_GBNF

    return str(JSON_GBNF)


def json_schema_grammar(schema: dict[str, Any], param: str = "response_format") -> str:
    """The grammar of JSON documents that match ``schema``; RequestError naming
    ``param`` when the converter cannot handle the schema."""
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    try:
        return str(json_schema_to_gbnf(json.dumps(schema)))
    # the converter says "unsupported" with assert, ValueError, KeyError, TypeError or
    # a RecursionError on a cyclic $ref: any of them is the schema's fault, not ours
    except Exception as exc:
        why = str(exc) or type(exc).__name__
        message = f"{param}: this JSON schema cannot be turned into a grammar ({why})"
        raise RequestError(message, param=param) from exc
