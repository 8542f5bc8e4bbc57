"""Issue 14: what the policy gives real model sizes on the machines users have.

The default 135M demo model and an 8B Q4 model (Llama-3.1-8B Q4_K_M geometry: 32
layers, 8 KV heads of 128, a 4.9 GB file) on a 16 GB CPU laptop, a 24 GB GPU and a
16 GB Apple-silicon Mac: each gets a context and a number of live chats a user would
call reasonable, and doctor's reason says why in words. (Before: the 8B model got
2048 tokens on the laptop and the Mac, from a fixed 0.5 GiB cap on a CPU's live KV.)
"""

from __future__ import annotations

import pytest
from warmstart.runtime.cli._doctor import doctor_report, render_doctor
from warmstart.runtime.policy import ModelGeometry, choose
from warmstart.runtime.settings import load_settings

from tests.hardware.machines import (
    LAPTOP,
    LLAMA_8B,
    MAC_M2_16,
    RTX4090,
    SMOLLM_135M,
    calibration_for,
)

GiB = 1 << 30
MODELS = {"135m": SMOLLM_135M, "8b": LLAMA_8B}
MACHINES = {"laptop16": LAPTOP, "rtx4090": RTX4090, "mac16": MAC_M2_16}

# machine, model -> n_ctx range, residents range, words the n_ctx reason must contain
CASES = [
    ("laptop16", "135m", (4096, 8192), (4, 8), ["CPU inference", "0.5 GiB", "4 chats"]),
    ("laptop16", "8b", (8192, 16384), (2, 4), ["CPU inference", "2 chats of 8192", "RAM pool"]),
    ("rtx4090", "135m", (8192, 8192), (8, 8), ["VRAM after the model", "4 chats"]),
    ("rtx4090", "8b", (16384, 32768), (2, 8), ["VRAM after the model", "4 chats"]),
    ("mac16", "135m", (4096, 8192), (4, 8), ["unified memory (Metal)", "0.5 GiB"]),
    ("mac16", "8b", (8192, 16384), (2, 4), ["unified memory (Metal)", "2 chats of 8192"]),
]


@pytest.mark.parametrize("measured", [True, False], ids=["measured", "estimated"])
@pytest.mark.parametrize(("machine", "model", "ctx", "residents", "words"), CASES)
def test_a_reasonable_context_and_residents(
    machine: str,
    model: str,
    ctx: tuple[int, int],
    residents: tuple[int, int],
    words: list[str],
    measured: bool,
) -> None:
    profile, geometry = MACHINES[machine], MODELS[model]
    calibration = calibration_for(profile) if measured else None
    t = choose(profile, calibration, geometry, load_settings())
    assert ctx[0] <= t.n_ctx <= ctx[1], t.reasons["n_ctx"]
    assert residents[0] <= t.resident_sequences <= residents[1], t.reasons["resident_sequences"]
    reason = t.reasons["n_ctx"]
    assert all(w in reason for w in words), reason
    assert f"chats of {t.n_ctx}" in t.reasons["resident_sequences"]
    text = render_doctor(doctor_report(profile, calibration, t))
    assert reason in text  # doctor prints the reason with the value


@pytest.mark.parametrize("machine", sorted(MACHINES))
def test_the_os_the_model_the_context_and_the_pool_fit(machine: str) -> None:
    profile = MACHINES[machine]
    t = choose(profile, None, LLAMA_8B, load_settings())
    live = t.n_ctx * t.resident_sequences * LLAMA_8B.kv_bytes_per_token
    if profile.offloads and not profile.unified_memory:  # the model and the context in VRAM
        assert profile.gpu is not None and live + LLAMA_8B.model_bytes < profile.gpu.vram_free
        host = t.ram_pool_bytes
    else:
        host = LLAMA_8B.model_bytes + live + t.ram_pool_bytes
    reserve = max(2 * GiB, profile.memory.total // 8)
    assert host + reserve <= profile.memory.available
    assert t.ram_pool_bytes >= 512 << 20  # still room to keep chats that are not live


def test_too_little_ram_for_two_8k_chats_says_so() -> None:
    from dataclasses import replace

    tight = replace(LAPTOP, memory=replace(LAPTOP.memory, available=8 * GiB))
    t = choose(tight, None, LLAMA_8B, load_settings())
    assert "too little for 2 chats of 8192 tokens" in t.reasons["n_ctx"]
    assert 2048 <= t.n_ctx < 8192 and t.resident_sequences >= 2


def test_a_model_trained_shorter_than_8k_wants_its_own_length() -> None:
    short = ModelGeometry(n_ctx_train=4096, n_layer=32, kv_bytes_per_token=131072,
                          model_bytes=4_000_000_000)  # fmt: skip
    t = choose(LAPTOP, None, short, load_settings())
    assert t.n_ctx == 4096 and "2 chats of 4096" in t.reasons["n_ctx"]
