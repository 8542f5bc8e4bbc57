"""A llama.cpp sampler chain for one reply, and the log-probabilities of its tokens."""

from __future__ import annotations

import ctypes
import math
import random
from collections.abc import Callable

import llama_cpp.llama_cpp as ll
import numpy as np

from ..errors import EngineError, RequestError
from ..types import Sampling, TokenLogprob
from ._grammars import check_grammar_text
from ._llama import LlamaContext, LlamaModel

# llama_token_data, as numpy sees it: int32 id, float logit, float p
_TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])

# the penalties sampler keeps the last N reply tokens; OpenAI's penalties count the
# whole reply so far, so the window is the reply's budget, up to this many
PENALTY_WINDOW_MAX = 8192


def check_grammar(model: LlamaModel, grammar: str) -> None:
    """RequestError when llama.cpp cannot parse ``grammar`` for this vocabulary: said
    before the reply starts (a 400), not halfway through a stream."""
    ll.llama_sampler_free(_grammar_sampler(model, grammar))


def _grammar_sampler(model: LlamaModel, grammar: str) -> ll.llama_sampler_p:
    """llama.cpp's grammar sampler, for a grammar within the limits its parser survives
    (grammars.check_grammar_text): one past them could crash the process, or have
    the whole grammar printed to stderr."""
    check_grammar_text(grammar, None)
    sampler = ll.llama_sampler_init_grammar(model.vocab, grammar.encode(), b"root")
    if not sampler:
        raise RequestError("the grammar for this reply could not be parsed")
    return sampler


def check_sampling(model: LlamaModel, sampling: Sampling) -> None:
    """This model's own rules of a sampling: logit biases name its tokens, a grammar
    parses over its vocabulary (only the vocabulary is read, fixed once loaded: safe
    off the worker thread)."""
    check_logit_bias(model, sampling)
    if sampling.grammar is not None:
        check_grammar(model, sampling.grammar)


def check_logit_bias(model: LlamaModel, sampling: Sampling) -> None:
    n_vocab = model.n_vocab
    for token, _ in sampling.logit_bias:
        if not 0 <= token < n_vocab:
            message = f"logit_bias: token id {token} is not in the vocabulary (0 to {n_vocab - 1})"
            raise RequestError(message, param="logit_bias")


class Sampler:
    """llama.cpp's order (common/sampling.cpp): a grammar first when one is given, then
    the logit biases and the penalties; then greedy when temperature is 0, else top-k,
    top-p, min-p, temperature and a seeded draw."""

    def __init__(self, sampling: Sampling, model: LlamaModel) -> None:
        self._chain = ll.llama_sampler_chain_init(ll.llama_sampler_chain_default_params())
        self._argmax = False  # the chain is greedy alone (see below)
        if sampling.grammar is not None:
            self._add_grammar(model, sampling.grammar)
        self._add_biases(model, sampling)
        if (
            sampling.repeat_penalty != 1.0
            or sampling.frequency_penalty
            or sampling.presence_penalty
        ):
            window = min(sampling.max_tokens, PENALTY_WINDOW_MAX)
            self._add(
                ll.llama_sampler_init_penalties(
                    model.n_vocab,
                    window,
                    sampling.repeat_penalty,
                    sampling.frequency_penalty,
                    sampling.presence_penalty,
                )
            )
        if sampling.temperature <= 0:
            self._add(ll.llama_sampler_init_greedy())
            # greedy alone picks the first of the largest logits: numpy's argmax does
            # the same in a tenth of the time (llama.cpp copies all 49,152 candidates
            # first: 90 us of a 13 ms decode step, on the thread the next step waits for)
            self._argmax = ll.llama_sampler_chain_n(self._chain) == 1
            return
        seed = sampling.seed if sampling.seed is not None else random.getrandbits(32)
        if sampling.top_k > 0:
            self._add(ll.llama_sampler_init_top_k(sampling.top_k))
        if sampling.top_p < 1.0:
            self._add(ll.llama_sampler_init_top_p(sampling.top_p, 1))
        if sampling.min_p > 0.0:
            self._add(ll.llama_sampler_init_min_p(sampling.min_p, 1))
        self._add(ll.llama_sampler_init_temp(sampling.temperature))
        self._add(ll.llama_sampler_init_dist(seed & 0xFFFFFFFF))

    def _add(self, sampler: ll.llama_sampler_p) -> None:
        ll.llama_sampler_chain_add(self._chain, sampler)

    def _add_grammar(self, model: LlamaModel, grammar: str) -> None:
        try:
            sampler = _grammar_sampler(model, grammar)
        except RequestError:
            self.close()
            raise
        self._add(sampler)

    def _add_biases(self, model: LlamaModel, sampling: Sampling) -> None:
        if not sampling.logit_bias:
            return
        biases = (ll.llama_logit_bias * len(sampling.logit_bias))(
            *(ll.llama_logit_bias(token, bias) for token, bias in sampling.logit_bias)
        )
        # llama.cpp copies the array: it need not outlive this call
        self._add(
            ll.llama_sampler_init_logit_bias(
                model.n_vocab,
                len(sampling.logit_bias),
                ctypes.cast(biases, ctypes.POINTER(ll.llama_logit_bias)),
            )
        )

    def sample(self, ctx: LlamaContext, logits: np.ndarray | None = None) -> int:
        """Draws (and accepts) the next token from the last decoded logits, or from
        ``logits`` kept from an earlier decode: the same steps as llama.cpp's
        llama_sampler_sample (every token a candidate, in id order, the chain applied,
        the selected one accepted), so the same logits give the same token."""
        if self._argmax:
            token = _first_largest(ctx.logits_view() if logits is None else logits)
            if token is not None:
                return token
        if logits is None:
            return int(ll.llama_sampler_sample(self._chain, ctx.ptr, -1))
        n = logits.size
        cur = (ll.llama_token_data * n)()
        view = np.ctypeslib.as_array(cur).view(_TOKEN_DATA)  # fills the array at C speed
        view["id"], view["logit"], view["p"] = np.arange(n, dtype=np.int32), logits, 0.0
        arr = ll.llama_token_data_array(cur, n, -1, False)
        ll.llama_sampler_apply(self._chain, ctypes.byref(arr))
        if not 0 <= arr.selected < arr.size:
            raise EngineError("the sampler selected no token")
        token = int(arr.data[arr.selected].id)
        ll.llama_sampler_accept(self._chain, token)
        return token

    def close(self) -> None:
        if self._chain:
            ll.llama_sampler_free(self._chain)
            self._chain = None


def _first_largest(logits: np.ndarray | None) -> int | None:
    """The greedy sampler's choice (the first largest logit, as llama.cpp's greedy
    sampler picks); None when a logit is NaN (numpy and llama.cpp then disagree: the
    chain decides) or there are none."""
    if logits is None:
        return None
    token = int(np.argmax(logits))
    return None if math.isnan(logits[token]) else token


def token_logprob(
    logits: np.ndarray, token: int, top: int, piece: Callable[[int], bytes]
) -> TokenLogprob:
    """``token``'s log-probability under the raw ``logits`` (a log-softmax in float64,
    before any sampler step: grammar, biases, penalties and temperature do not change
    it), with the ``top`` most likely tokens, most likely first (ties: lower id first,
    as the greedy sampler breaks them)."""
    x = logits.astype(np.float64)
    peak = float(x.max())
    logz = peak + math.log(float(np.exp(x - peak).sum()))
    alternatives: tuple[TokenLogprob, ...] = ()
    if top > 0:
        k = min(top, x.size)
        best = sorted(np.argpartition(-x, k - 1)[:k].tolist(), key=lambda t: (-x[t], t))
        alternatives = tuple(_entry(t, float(x[t]) - logz, piece) for t in best)
    return _entry(token, float(x[token]) - logz, piece, alternatives)


def _entry(
    token: int, logprob: float, piece: Callable[[int], bytes], top: tuple[TokenLogprob, ...] = ()
) -> TokenLogprob:
    raw = piece(token)
    return TokenLogprob(raw.decode("utf-8", "replace"), raw, logprob, top)
