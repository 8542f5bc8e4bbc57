"""Flash attention can be turned off (on a CPU, decode steps and short batches at long
contexts are faster without it), but not under a quantized V, which needs it."""

from __future__ import annotations

import pytest
from pydantic import ValidationError
from warmstart.runtime.settings import Settings


@pytest.mark.parametrize("flash_attn", ["auto", "on", "off"])
def test_every_flash_attention_setting_is_taken_with_an_f16_cache(flash_attn: str) -> None:
    assert Settings(flash_attn=flash_attn).flash_attn == flash_attn


def test_a_quantized_kv_cache_without_flash_attention_is_refused() -> None:
    with pytest.raises(ValidationError, match="needs flash_attn on or auto"):
        Settings(flash_attn="off", type_kv="q8_0")
