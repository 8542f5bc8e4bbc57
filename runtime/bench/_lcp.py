"""llama-cpp-python's own caches (LlamaRAMCache, LlamaDiskCache) on the same model and
prompts as warmstart, run in `warmstart bench`'s child processes."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any


def _llama(
    model: Path, n_ctx: int, extra_buffers: bool, n_gpu_layers: int, mmap: bool | None = None
) -> Any:
    """llama-cpp-python's ``Llama`` loaded as ours was (the loader verdict's mmap and
    offload; its pinned staging comes with the child's environment, see _child)."""
    from llama_cpp import Llama

    if not extra_buffers:
        _without_extra_buffers()
    return Llama(
        model_path=str(model),
        n_ctx=n_ctx,
        n_gpu_layers=n_gpu_layers,  # the same offload as ours (-1: every layer)
        flash_attn=True,
        verbose=False,
        use_mmap=mmap is not False,  # Llama has no "auto": mmap, as llama.cpp's auto maps
    )


def _without_extra_buffers() -> None:
    """The high-level ``Llama`` builds its own model params and has no option for
    llama.cpp's extra buffer types: make its defaults say off. Only ever called in
    the comparison's child process, which exists for this one model."""
    import llama_cpp.llama_cpp as ll

    default_params = ll.llama_model_default_params

    def without() -> Any:
        params = default_params()
        params.use_extra_bufts = False
        return params

    ll.llama_model_default_params = without


def _lcp_ttft(llm: Any, prompt: str, max_tokens: int = 16) -> float:
    """Submit to the first token llama-cpp-python samples (a stopping criterion sees each
    one), the reply held to ``max_tokens`` by that criterion too. Its own ``max_tokens``
    is not enough: while the text ends in the lead byte of a UTF-8 character, its loop
    skips that check, and a model that repeats such a byte (the GPU check's synthetic
    one does: byte 0xFE, greedily) generated until its context was full, with every
    token's text decoded again from the start (minutes on an H200). Its first streamed
    text is no mark either: held back for the same bytes, it came after the last token."""
    from llama_cpp import StoppingCriteriaList

    times: list[float] = []

    def count(_ids: Any, _logits: Any) -> bool:
        times.append(time.perf_counter())
        return len(times) >= max_tokens

    t0 = time.perf_counter()
    stop = StoppingCriteriaList([count])
    for _ in llm.create_completion(
        prompt, max_tokens=max_tokens, temperature=0.0, stream=True, stopping_criteria=stop
    ):
        pass
    return times[0] - t0


def child_lcp(
    model: Path,
    cache_dir: Path,
    prompts: list[str],
    n_ctx: int,
    populate: bool,
    extra_buffers: bool = False,
    n_gpu_layers: int = 0,
    mmap: bool | None = None,
) -> dict[str, Any]:
    from llama_cpp import LlamaDiskCache, LlamaRAMCache

    llm = _llama(model, n_ctx, extra_buffers, n_gpu_layers, mmap)
    llm.set_cache(LlamaDiskCache(cache_dir=str(cache_dir), capacity_bytes=8 << 30))
    first = _lcp_ttft(llm, prompts[0])
    if populate:
        return {"cold_ttft_s": first}
    llm.set_cache(LlamaRAMCache(capacity_bytes=8 << 30))
    _lcp_ttft(llm, prompts[0])  # saved to the RAM cache
    _lcp_ttft(llm, prompts[1])  # another chat takes the context
    return {"disk_ttft_s": first, "ram_ttft_s": _lcp_ttft(llm, prompts[0])}
