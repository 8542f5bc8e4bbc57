"""A llama.cpp sampler chain for one reply."""

from __future__ import annotations

import random

import llama_cpp.llama_cpp as ll

from ..errors import RequestError
from ..types import Sampling
from ._llama import LlamaContext, LlamaModel


class Sampler:
    """A grammar first when one is given; then greedy when temperature is 0, else top-p
    then temperature then a seeded draw."""

    def __init__(self, sampling: Sampling, model: LlamaModel) -> None:
        self._chain = ll.llama_sampler_chain_init(ll.llama_sampler_chain_default_params())
        if sampling.grammar is not None:
            self._add_grammar(model, sampling.grammar)
        if sampling.temperature <= 0:
            ll.llama_sampler_chain_add(self._chain, ll.llama_sampler_init_greedy())
            return
        seed = sampling.seed if sampling.seed is not None else random.getrandbits(32)
        if sampling.top_p < 1.0:
            ll.llama_sampler_chain_add(self._chain, ll.llama_sampler_init_top_p(sampling.top_p, 1))
        ll.llama_sampler_chain_add(self._chain, ll.llama_sampler_init_temp(sampling.temperature))
        ll.llama_sampler_chain_add(self._chain, ll.llama_sampler_init_dist(seed & 0xFFFFFFFF))

    def _add_grammar(self, model: LlamaModel, grammar: str) -> None:
        sampler = ll.llama_sampler_init_grammar(model.vocab, grammar.encode(), b"root")
        if not sampler:
            self.close()
            raise RequestError("the grammar for this reply could not be parsed")
        ll.llama_sampler_chain_add(self._chain, sampler)

    def sample(self, ctx: LlamaContext) -> int:
        """Draws (and accepts) the next token from the last decoded logits."""
        return int(ll.llama_sampler_sample(self._chain, ctx.ptr, -1))

    def close(self) -> None:
        if self._chain:
            ll.llama_sampler_free(self._chain)
            self._chain = None
