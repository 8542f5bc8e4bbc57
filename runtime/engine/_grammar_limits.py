"""What a JSON schema, and the grammar made from it, may ask of llama.cpp.

A schema of a hundred bytes could take the server down: llama-cpp-python's converter
turns ``maxLength: N`` (and maxItems, and ``{m,n}`` in a pattern) into N nested
groups, and llama.cpp's grammar parser recurses once per group. Measured with
llama-cpp-python 0.3.36 and SmolLM2-135M on 2 cores:

- nesting: a segfault from about 4,500 levels on a 2 MiB thread stack (the default
  where ``ulimit -s`` is unlimited) and 19,000 on 8 MiB; a group holding more than
  2,000 rules is refused (maxLength 1,001 and up), after the whole grammar is
  printed to stderr;
- alternatives: every alternative alive at a token (enum values, anyOf) costs about
  1 ms of the one worker thread per sampled token (an enum of 512 values: 0.7 s for
  the first token, of 1,000: 1.3 to 1.5 s; of 100,000: minutes);
- size: parsing grows with it (a 100 kB grammar: 2.5 ms; 1 MB of 31,000 rules:
  0.65 s on 2 loaded cores).

So every schema is measured here before it is converted (``schema_problem``: its
keywords, with ``$ref`` followed), and every grammar before llama.cpp parses it
(``grammar_problem``: its size and the parser's own limits, checked the way the
parser counts). Past a limit the request is a 400 that names the keyword and the
limit; within them a grammar compiles in milliseconds and costs each token a
bounded amount. Pure: no llama.cpp here.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

# minLength/maxLength/minItems/maxItems, and the sum of the {m,n} counts of one
# pattern: N nested groups of about 2 rules each; 500 keeps a group at about 1,000
# rules (half of llama.cpp's 2,000) and nesting at a ninth of the 2 MiB-stack crash.
MAX_REPEAT = 500
# values in one enum, entries in one anyOf/oneOf/type list: each is a grammar
# alternative, about 1 ms of sampling per token here while alive (0.15-0.25 s at 256)
MAX_ENUM = 256
MAX_ALTERNATIVES = 256
# all the alternatives of a schema (enum values, anyOf/oneOf/type entries and the
# "|" of patterns, $refs followed): bounds the alternatives alive at once however
# they nest, so a token costs at most about 0.7 s of sampling here (measured at 512)
MAX_CHOICES = 512
# subschemas, $refs followed (a $ref reused everywhere counts every time): bounds the
# converter's work and the grammar's rules; OpenAI allows 5,000 properties in all
MAX_NODES = 2000
# properties of one object: the converter's optional-property rules grow with the
# square of their number, and it recurses once per optional property
MAX_PROPERTIES = 256
# nested subschemas ($refs followed); OpenAI allows 10 levels
MAX_DEPTH = 32
# JSON nesting anywhere in a schema (a subschema level is one or two JSON levels)
MAX_JSON_DEPTH = 100
# a pattern's length (each character can become a rule)
MAX_PATTERN_CHARS = 1000
# the grammar text: above what ordinary schemas make (128 tools of 10 properties each:
# 200 kB), and llama.cpp parses it twice per request, once on the worker thread (a
# 1 MB grammar of 31,000 rules: 0.65 s each time on 2 loaded cores)
MAX_GRAMMAR_BYTES = 512 << 10
# nested groups in the grammar: the parser's recursion, a fifth of the 2 MiB-stack crash
MAX_GRAMMAR_NESTING = 1000
# llama.cpp's MAX_REPETITION_THRESHOLD (src/llama-grammar.cpp): the parser refuses a
# repetition past it, printing the whole grammar to stderr on the way
LLAMA_REPETITION_THRESHOLD = 2000

_REPEATS = ("minLength", "maxLength", "minItems", "maxItems")
_MAPS = ("properties", "$defs", "definitions")
_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_ONE = ("items", "additionalProperties")


def subschemas(
    schema: dict[str, Any], where: str, *, defs: bool = True
) -> Iterator[tuple[str, object]]:
    """(path, subschema) of every subschema directly under ``schema``."""
    for key in _MAPS:
        if isinstance(schema.get(key), dict) and (defs or key == "properties"):
            yield from ((f"{where}.{key}.{n}", sub) for n, sub in schema[key].items())
    for key in _LISTS:
        if isinstance(schema.get(key), list):
            yield from ((f"{where}.{key}[{i}]", sub) for i, sub in enumerate(schema[key]))
    for key in _ONE:
        value = schema.get(key)
        if isinstance(value, list):
            yield from ((f"{where}.{key}[{i}]", sub) for i, sub in enumerate(value))
        elif value is not None:
            yield f"{where}.{key}", value


class _Over(Exception):
    """A limit was passed at ``where`` (a schema path, "" in a grammar): ``what``."""

    def __init__(self, where: str, what: str) -> None:
        super().__init__(f"{_shown(where)}{what}")


def _shown(where: str, limit: int = 160) -> str:
    """A path short enough to quote in an error (property names can be long)."""
    if len(where) > limit:
        where = f"{where[: limit // 3]}...{where[-(limit * 2 // 3) :]}"
    return where


@dataclass
class _Cost:
    nodes: int = 1
    choices: int = 0
    height: int = 0  # subschema levels below this one

    def add(self, child: _Cost) -> None:
        self.nodes += child.nodes
        self.choices += child.choices
        self.height = max(self.height, child.height + 1)


def schema_problem(schema: dict[str, Any], where: str = "schema") -> str | None:
    """What in ``schema`` is past a limit, as "<path> ...; at most N", else None."""
    try:
        _check_json_depth(schema, where)
        _Walk(schema, where).visit(schema, where, 0)
    except _Over as over:
        return str(over)
    return None


def _check_json_depth(value: object, where: str) -> None:
    """The walk below follows what the converter converts; this bounds the rest too
    (unused $defs, enum values), which recursive code after it still reads. A loop."""
    pending = [(value, 0)]
    while pending:
        item, depth = pending.pop()
        if depth > MAX_JSON_DEPTH:
            raise _Over(
                where, f" nests JSON more than {MAX_JSON_DEPTH} deep; at most {MAX_JSON_DEPTH}"
            )
        children = (
            item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        )
        pending += [(child, depth + 1) for child in children]


class _Walk:
    """One pass over a schema, following local $refs as the converter does."""

    def __init__(self, root: dict[str, Any], where: str) -> None:
        self.root, self.where = root, where
        self.done: dict[str, _Cost] = {}
        self.open: set[str] = set()

    def visit(self, schema: object, where: str, depth: int) -> _Cost:
        if depth > MAX_DEPTH:
            raise _Over(where, f" nests subschemas more than {MAX_DEPTH} deep; at most {MAX_DEPTH}")
        cost = _Cost()
        if not isinstance(schema, dict):
            return cost
        cost.choices = _own_choices(schema, where)
        ref = schema.get("$ref")
        if isinstance(ref, str):
            cost.add(self._ref(ref, where, depth))
        for path, sub in subschemas(schema, where, defs=False):
            cost.add(self.visit(sub, path, depth + 1))
            _check_totals(cost, path)
        return cost

    def _ref(self, ref: str, where: str, depth: int) -> _Cost:
        if ref in self.open:  # a recursive schema: the grammar refers back, once
            return _Cost()
        if ref not in self.done:
            target = self._target(ref)
            self.open.add(ref)
            path = self.where + ref[1:].replace("/", ".")
            self.done[ref] = self.visit(target, path, depth + 1)
            self.open.discard(ref)
        cost = self.done[ref]
        if depth + 1 + cost.height > MAX_DEPTH:
            raise _Over(
                f"{where}.$ref",
                f" nests subschemas more than {MAX_DEPTH} deep; at most {MAX_DEPTH}",
            )
        return cost

    def _target(self, ref: str) -> object:
        """The subschema a local ref names; None for any other (the converter refuses it)."""
        if not ref.startswith("#/"):
            return None
        target: object = self.root
        for part in ref[2:].split("/"):
            if not isinstance(target, dict) or part not in target:
                return None
            target = target[part]
        return target


def _check_totals(cost: _Cost, where: str) -> None:
    if cost.nodes > MAX_NODES:
        raise _Over(
            where, f": more than {MAX_NODES} subschemas ($refs followed); at most {MAX_NODES}"
        )
    if cost.choices > MAX_CHOICES:
        raise _Over(
            where,
            f": more than {MAX_CHOICES} alternatives (enum values, anyOf, oneOf and type "
            f"entries, a pattern's '|'; $refs followed); at most {MAX_CHOICES}",
        )


def _own_choices(schema: dict[str, Any], where: str) -> int:
    """Checks this subschema's own keywords; returns its alternatives."""
    for key in _REPEATS:
        value = schema.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool) and value > MAX_REPEAT:
            raise _Over(f"{where}.{key}", f" is {_shown(str(value), 24)}; at most {MAX_REPEAT}")
    choices = 0
    for key, limit in (
        ("enum", MAX_ENUM),
        ("anyOf", MAX_ALTERNATIVES),
        ("oneOf", MAX_ALTERNATIVES),
    ):
        value = schema.get(key)
        if isinstance(value, list):
            if len(value) > limit:
                raise _Over(f"{where}.{key}", f" has {len(value)} entries; at most {limit}")
            choices += len(value)
    if isinstance(schema.get("type"), list):
        choices += len(schema["type"])
    properties = schema.get("properties")
    if isinstance(properties, dict) and len(properties) > MAX_PROPERTIES:
        raise _Over(
            f"{where}.properties", f" has {len(properties)} entries; at most {MAX_PROPERTIES}"
        )
    pattern = schema.get("pattern")
    if isinstance(pattern, str):
        choices += _pattern_choices(pattern, f"{where}.pattern")
    if choices > MAX_CHOICES:
        raise _Over(where, f" has {choices} alternatives; at most {MAX_CHOICES}")
    return choices


_QUANTIFIER = re.compile(r"\{\s*(\d*)\s*(?:,\s*(\d*)\s*)?\}")


def _pattern_choices(pattern: str, where: str) -> int:
    """Checks a pattern's length and repetition counts; returns its alternatives."""
    if len(pattern) > MAX_PATTERN_CHARS:
        raise _Over(where, f" is {len(pattern)} characters; at most {MAX_PATTERN_CHARS}")
    unescaped = re.sub(r"\\.", "", pattern)
    repeats = 0
    for match in _QUANTIFIER.finditer(unescaped):
        low, high = (int(n) if n else 0 for n in match.group(1, 2))
        repeats += max(low, high)
    if repeats > MAX_REPEAT:
        raise _Over(
            where, f" repeats {repeats} times in all ({{m,n}} counts); at most {MAX_REPEAT}"
        )
    return unescaped.count("|")


# the grammar text ----------------------------------------------------------------------

# GBNF's tokens, as llama_grammar_parser reads them; the last alternative, any other
# character, is one it cannot read. findall, then one loop: about half the time the
# converter took to write the grammar (750 kB: 0.4 s against 0.8 s, 2 loaded cores).
_GBNF_TOKEN = re.compile(
    r"""[ \t\r\n]+|\#[^\n]*
    |"(?:\\.|[^"\\])*"|\[(?:\\.|[^\]\\])*\]
    |[A-Za-z0-9_-]+(?:[ \t]*::=)?
    |!?<[^>\n]*>
    |\{[ \t]*\d+[ \t]*(?:,[ \t]*\d*[ \t]*)?\}
    |[][*+?()|."{}<!\\]|.""",
    re.VERBOSE,
)
_SKIP = frozenset(" \t\r\n#")
_WORD = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")
_REPETITION = frozenset("*+?{")


@functools.lru_cache(maxsize=16)  # a grammar is checked where it is made and where it is used
def grammar_problem(grammar: str) -> str | None:
    """What in a GBNF grammar llama.cpp's parser would refuse (printing the whole
    grammar to stderr) or crash on, counted the way it counts; None if nothing."""
    size = len(grammar.encode("utf-8", "surrogatepass"))
    if size > MAX_GRAMMAR_BYTES:
        return f"the grammar is {size} bytes; at most {MAX_GRAMMAR_BYTES}"
    try:
        _parse(_GBNF_TOKEN.findall(grammar))
    except _Over as over:
        return f"the grammar {over}"
    return None


def _parse(tokens: list[str]) -> None:
    """llama_grammar_parser's bookkeeping without its output: the symbols it creates
    (a rule name when first seen, one per group, one per optional repetition), the
    share of them in each group (what its repetition check multiplies), and how deep
    groups nest. ``rules``: of the last item; ``item``: is there one to repeat."""
    names: set[str] = set()
    defined: set[str] = set()
    symbols = 0
    opened: list[int] = []  # the symbols before each open group
    rules, item = 1, False
    for token in tokens:
        first = token[0]
        if first in _SKIP:
            continue
        if first in _REPETITION and token != "{":
            rules, item, created = _repeat(rules, item, token)
            symbols += created
        elif first == "(":
            if len(opened) >= MAX_GRAMMAR_NESTING:
                limit = MAX_GRAMMAR_NESTING
                raise _Over("", f"nests groups more than {limit} deep; at most {limit}")
            opened.append(symbols)
            symbols += 1
            rules, item = 1, False
        elif first == ")":
            if not opened:
                raise _Over("", "closes a group it never opened")
            rules, item = max(1, symbols - opened.pop()), True
        elif first == "|":
            rules, item = 1, False
        elif first == '"' or first == "[":
            if len(token) < 2:
                raise _Over("", f"has an unterminated {token!r}")
            rules, item = 1, len(token) > 2  # an empty one is no item to repeat
        elif first in _WORD:  # a rule's name, where it is defined or used
            head = token.endswith("::=")
            if head and opened:
                raise _Over("", "has an unclosed group")
            rules, item = 1, not head
            name = token.removesuffix("::=").rstrip(" \t")
            if name not in names:
                names.add(name)
                symbols += 1
            if head:
                defined.add(name)
        elif first == "." or (first in "<!" and token.endswith(">")):  # any char, a token
            rules, item = 1, True
        else:
            raise _Over("", f"has a character it cannot read ({token!r})")
    if opened:
        raise _Over("", "has an unclosed group")
    if undefined := names - defined:
        raise _Over("", f"uses a rule it does not define ({min(undefined)})")


def _repeat(rules: int, item: bool, token: str) -> tuple[int, bool, int]:
    """handle_repetitions: its checks, and (rules of the item now, is there an item,
    symbols created)."""
    if not item:
        raise _Over("", f"repeats nothing ({token!r})")
    low, high = _bounds(token)
    limit = LLAMA_REPETITION_THRESHOLD
    if low > limit:
        raise _Over("", f"repeats at least {low} times; llama.cpp takes at most {limit}")
    if high is not None and high > limit:
        high = None  # llama.cpp's own reading: no upper bound
    total = high if high else (low or 1)
    if rules * total > limit:
        raise _Over("", f"repeats a group of {rules} rules {total} times; llama.cpp takes {limit}")
    created = 1 if high is None else high - low
    return rules * total, created > 0 or low > 0, created


def _bounds(token: str) -> tuple[int, int | None]:
    """(min, max or None) of a repetition operator."""
    if token in ("*", "+", "?"):
        return {"*": (0, None), "+": (1, None), "?": (0, 1)}[token]
    low, comma, high = token[1:-1].replace(" ", "").replace("\t", "").partition(",")
    if not comma:
        return int(low), int(low)
    return int(low), int(high) if high else None
