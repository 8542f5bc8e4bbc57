"""Which flash attention the engine runs: "auto" is off on the CPU with an f16 KV cache
(llama.cpp's CPU kernel computes each query row alone, a decode step took 1.8 times as
long with it here), on with a quantized V (which needs it), llama.cpp's own on a GPU."""

from __future__ import annotations

import pytest
from pydantic import ValidationError
from warmstart.runtime.serving import _factory
from warmstart.runtime.settings import Settings


@pytest.mark.parametrize(
    ("flash_attn", "type_kv", "gpu", "layers", "expected"),
    [
        ("auto", "f16", False, -1, "off"),  # a CPU-only build
        ("auto", "f16", True, 0, "off"),  # a GPU build, nothing offloaded
        ("auto", "f16", True, -1, "auto"),  # offloaded: llama.cpp chooses
        ("auto", "q8_0", False, -1, "on"),  # a quantized V needs it
        ("on", "f16", False, -1, "on"),  # what the user set wins
        ("off", "f16", True, -1, "off"),
    ],
)
def test_flash_attention_as_the_engine_runs_it(  # type: ignore[no-untyped-def]
    monkeypatch, flash_attn, type_kv, gpu, layers, expected
) -> None:
    monkeypatch.setattr(_factory, "gpu_offload_supported", lambda: gpu)
    settings = Settings(flash_attn=flash_attn, type_kv=type_kv)
    assert _factory.flash_attn_of(settings, layers) == expected


def test_a_quantized_kv_cache_without_flash_attention_is_refused() -> None:
    with pytest.raises(ValidationError, match="needs flash_attn on or auto"):
        Settings(flash_attn="off", type_kv="q8_0")
