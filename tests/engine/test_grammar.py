"""A grammar in the sampler chain: the reply matches it, greedy or sampled, and a
grammar llama.cpp cannot parse is the client's error, not a crash."""

from __future__ import annotations

import pytest
from warmstart.runtime.errors import RequestError
from warmstart.runtime.types import Message, Request, Sampling

pytestmark = pytest.mark.slow

YES_NO = 'root ::= ("yes" | "no") "."'


def _ask(rt, sampling: Sampling) -> str:  # type: ignore[no-untyped-def]
    request = Request(
        messages=(Message("user", "Is the sea wet?"),), sampling=sampling, use_cache=False
    )
    text, _ = rt.generate(request).text()
    return text


def test_replies_match_the_grammar(make_runtime) -> None:  # type: ignore[no-untyped-def]
    rt = make_runtime()
    assert _ask(rt, Sampling(max_tokens=8, grammar=YES_NO)) in ("yes.", "no.")
    sampled = Sampling(max_tokens=8, grammar=YES_NO, temperature=1.0, seed=7)
    assert _ask(rt, sampled) in ("yes.", "no.")


def test_a_broken_grammar_is_a_request_error(make_runtime) -> None:  # type: ignore[no-untyped-def]
    rt = make_runtime()
    with pytest.raises(RequestError):
        _ask(rt, Sampling(max_tokens=8, grammar="root ::= ("))
    assert _ask(rt, Sampling(max_tokens=4)).strip()  # the runtime still answers
