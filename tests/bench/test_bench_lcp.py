"""llama-cpp-python's side of `warmstart bench` (runtime/bench/_lcp.py) on a model whose
greedy reply is one UTF-8 lead byte again and again: the GPU check's synthetic model
with the default model's geometry, asked for replies of lead bytes, does that, and
llama-cpp-python's ``max_tokens`` does not stop such a reply (its loop skips the check
while a character looks unfinished), so the bench ran until the context was full: past
100 s on an H200."""

from __future__ import annotations

from pathlib import Path

import pytest
from warmstart.runtime.bench import _lcp

from installers.gpu import synth_gguf


@pytest.fixture(scope="module")
def lead_byte_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("lcp") / "smollm2-shaped.gguf"
    # replies of the lead bytes of two-byte characters only (the model's own replies are
    # printable ASCII), and weights whose draw answers one of them again and again (the
    # draw depends on the vocabulary's size: another seed may be needed if it changes)
    lead_bytes = range(0xC2, 0xE0)
    return synth_gguf.write(path, synth_gguf.GEOMETRIES["smollm2-135m"], reply_bytes=lead_bytes)


def test_the_comparison_reply_stops_at_its_tokens(lead_byte_model: Path) -> None:
    llm = _lcp._llama(lead_byte_model, 512, extra_buffers=False, n_gpu_layers=0)
    try:
        prompt = "abc" * 20
        ids = llm.tokenize(prompt.encode(), special=True)
        n_prompt = len(ids)
        # its greedy reply: after one letter, one byte again and again (ids 3-258 are
        # bytes 0-255), a byte that opens a multi-byte UTF-8 character
        gen = llm.generate(ids, temp=0.0)
        reply = [next(gen) for _ in range(8)]
        gen.close()
        assert len(set(reply[1:])) == 1 and reply[1] - 3 >= 0xC0, reply
        llm.reset()
        ttft = _lcp._lcp_ttft(llm, prompt, max_tokens=16)
        assert ttft > 0
        assert llm.n_tokens <= n_prompt + 16, llm.n_tokens  # not the whole context
    finally:
        llm.close()
