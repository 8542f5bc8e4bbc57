"""The sampler chain's fields on the real model: log-probabilities consistent with
greedy decoding and with the cache, biases, seeds, penalties, top-k and min-p."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from warmstart.runtime.errors import RequestError
from warmstart.runtime.types import Request, Token, TokenLogprob

from tests.conftest import chat

pytestmark = pytest.mark.slow

QUESTION = "Name three colours of the rainbow."


def _run(rt, request: Request) -> tuple[str, list[TokenLogprob], object]:  # type: ignore[no-untyped-def]
    text, logprobs, report = [], [], None
    for event in rt.generate(request):
        if isinstance(event, Token):
            text.append(event.text)
            logprobs.extend(event.logprobs)
        else:
            report = event.report
    return "".join(text), logprobs, report


def _with(request: Request, **sampling: object) -> Request:
    return replace(request, sampling=replace(request.sampling, **sampling))


def test_logprobs_are_consistent_with_greedy(make_runtime) -> None:  # type: ignore[no-untyped-def]
    rt = make_runtime()
    text, logprobs, report = _run(rt, _with(chat(QUESTION), logprobs=5))
    assert text and len(logprobs) == report.completion_tokens  # type: ignore[attr-defined]
    assert b"".join(lp.raw for lp in logprobs).decode() == text
    for lp in logprobs:
        assert lp.logprob <= 0.0 and len(lp.top) == 5
        # greedy takes the most likely token of the raw logits: the first alternative
        assert lp.top[0].raw == lp.raw and lp.top[0].logprob == lp.logprob
        assert [a.logprob for a in lp.top] == sorted((a.logprob for a in lp.top), reverse=True)
    plain, none, _ = _run(rt, chat(QUESTION))
    assert plain == text and none == []


def test_logprobs_from_a_cached_prefix_equal_no_cache(make_runtime) -> None:  # type: ignore[no-untyped-def]
    rt = make_runtime()
    request = _with(chat(QUESTION, max_tokens=8), logprobs=3)
    _, cold, _ = _run(rt, replace(request, use_cache=False))
    _run(rt, request)  # computes and stores the prompt
    rt.evict_live()
    _, warm, report = _run(rt, request)
    assert report.cached_tokens > 0  # type: ignore[attr-defined]
    np.testing.assert_allclose(
        [lp.logprob for lp in warm], [lp.logprob for lp in cold], rtol=0, atol=1e-5
    )
    assert [lp.raw for lp in warm] == [lp.raw for lp in cold]


def test_a_banned_token_is_not_sampled(make_runtime) -> None:  # type: ignore[no-untyped-def]
    rt = make_runtime()
    request = chat(QUESTION, max_tokens=8)
    ids = rt.engine.model.tokenize(_run(rt, request)[0], add_special=False)
    banned = ids[0]
    _, logprobs, _ = _run(rt, _with(request, logit_bias=((banned, float("-inf")),), logprobs=0))
    again = b"".join(lp.raw for lp in logprobs)
    assert rt.engine.model.piece(banned) != logprobs[0].raw, again


def test_a_token_outside_the_vocabulary_is_a_request_error(make_runtime) -> None:  # type: ignore[no-untyped-def]
    rt = make_runtime()
    with pytest.raises(RequestError) as caught:
        rt.generate(_with(chat(QUESTION), logit_bias=((10**7, 1.0),)))
    assert caught.value.param == "logit_bias"


def test_seeded_sampling_repeats_with_top_k_and_min_p(make_runtime) -> None:  # type: ignore[no-untyped-def]
    rt = make_runtime()
    request = _with(chat(QUESTION, max_tokens=12), temperature=1.0, seed=11, top_k=20, min_p=0.05)
    assert _run(rt, request)[0] == _run(rt, request)[0]


def test_penalties_run_and_reply(make_runtime) -> None:  # type: ignore[no-untyped-def]
    rt = make_runtime()
    request = chat("Say the word 'cat' ten times.", max_tokens=24)
    plain = _run(rt, request)[0]
    penalised = _with(request, repeat_penalty=1.5, frequency_penalty=1.0, presence_penalty=1.0)
    text, _, report = _run(rt, penalised)
    assert text.strip() and report.finish_reason in ("stop", "length")  # type: ignore[attr-defined]
    # counted repeats of the reply's own tokens weigh against them: the text changes
    assert text != plain


def test_a_broken_grammar_is_refused_before_the_reply(make_runtime) -> None:  # type: ignore[no-untyped-def]
    rt = make_runtime()
    with pytest.raises(RequestError):
        rt.generate(_with(chat(QUESTION), grammar="root ::= ("))


def test_greedy_alone_reads_the_largest_logit_as_the_chain_would(make_runtime) -> None:  # type: ignore[no-untyped-def]
    """A plain greedy reply skips llama.cpp's copy of every candidate (argmax in place):
    each token must be the one the chain itself draws from the same logits."""
    from warmstart.runtime.engine._sampling import Sampler
    from warmstart.runtime.types import Sampling

    rt = make_runtime()
    engine = rt.engine
    fast, chain = Sampler(Sampling(), engine.model), Sampler(Sampling(), engine.model)
    chain._argmax = False  # the chain's own draw
    assert fast._argmax and not Sampler(Sampling(repeat_penalty=1.1), engine.model)._argmax
    ids = engine.model.tokenize("Once upon a time, in a land of rivers,", add_special=True)
    seq = engine.residents[0].seq
    engine.ctx.decode(ids, seq, 0)
    for step in range(48):
        token = fast.sample(engine.ctx)
        assert token == chain.sample(engine.ctx)
        engine.ctx.decode([token], seq, len(ids) + step)
    engine.ctx.seq_rm(seq)
    fast.close()
    chain.close()
