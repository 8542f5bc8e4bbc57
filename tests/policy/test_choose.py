"""The machine-derived policy over the four recorded machines of issue 3."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from dataclasses import replace
from typing import Any

import pytest
from warmstart.runtime.hardware import Calibration, HardwareProfile, MemoryInfo, PcieLink, ZstdPoint
from warmstart.runtime.policy import Tuning, choose, choose_zstd_level, estimate_rates, rates_from
from warmstart.runtime.policy._choose import break_even_tokens, host_reserve
from warmstart.runtime.settings import load_settings

from tests.hardware.machines import (
    H100,
    LLAMA_8B,
    MACHINES,
    RTX4090,
    SMALL_GPU,
    SMOLLM_135M,
    calibration_for,
)

TUNABLES = [f.name for f in dataclasses.fields(Tuning) if f.name != "reasons"]
CASES = [(name, measured) for name in MACHINES for measured in (True, False)]


def _choose(profile: HardwareProfile, *, measured: bool = True, **settings: object) -> Tuning:
    cal = calibration_for(profile) if measured else None
    return choose(profile, cal, LLAMA_8B, load_settings(**settings))


def _with_link(profile: HardwareProfile, gen: int, width: int) -> HardwareProfile:
    gpu = replace(profile.gpus[0], pcie=PcieLink(gen, gen, width, width))
    return replace(profile, gpus=(gpu,))


@pytest.mark.parametrize(("machine", "measured"), CASES)
def test_values_are_sane(machine: str, measured: bool) -> None:
    profile = MACHINES[machine]
    t = _choose(profile, measured=measured)
    kvb = LLAMA_8B.kv_bytes_per_token
    assert 256 <= t.n_ctx <= LLAMA_8B.n_ctx_train and t.n_ctx % 256 == 0
    assert 1 <= t.resident_sequences <= 8
    assert t.chunk_tokens & (t.chunk_tokens - 1) == 0
    assert 1 << 20 <= t.chunk_tokens * kvb <= 32 << 20  # several MB a transfer
    assert t.ram_pool_bytes % (t.chunk_tokens * kvb) == 0
    assert 0.0 <= t.low_watermark < t.high_watermark <= 1.0
    assert 0 < t.disk_budget_bytes <= profile.disk.free // 2
    assert 1 <= t.swap_in_threshold_tokens <= t.n_ctx
    assert 0 <= t.zstd_level <= 19 and 0 <= t.prewarm_sessions <= 16
    assert all(t.reasons[name] for name in TUNABLES)


@pytest.mark.parametrize(("machine", "measured"), CASES)
def test_memory_is_left_to_the_os_and_the_model(machine: str, measured: bool) -> None:
    profile = MACHINES[machine]
    t = _choose(profile, measured=measured)
    kv = t.resident_sequences * t.n_ctx * LLAMA_8B.kv_bytes_per_token  # a stream each
    host_used = t.ram_pool_bytes + (0 if profile.offloads else kv + LLAMA_8B.model_bytes)
    assert host_used + host_reserve(profile.memory.total) <= profile.memory.available
    if profile.gpu is not None:
        assert kv + LLAMA_8B.model_bytes < profile.gpu.vram_free


def _break_even(profile: HardwareProfile, cal: Calibration | None) -> float:
    rates = rates_from(cal) if cal is not None else estimate_rates(profile, LLAMA_8B).rates
    return break_even_tokens(rates, LLAMA_8B.kv_bytes_per_token)


@pytest.mark.parametrize("machine", ["rtx4090", "h100", "small_gpu"])
def test_faster_link_lowers_the_threshold_estimated(machine: str) -> None:
    """Thresholds are whole tokens, so they may tie; the break-even itself must drop."""
    slow_profile = _with_link(MACHINES[machine], 3, 4)
    fast_profile = _with_link(MACHINES[machine], 5, 16)
    slow, fast = _choose(slow_profile, measured=False), _choose(fast_profile, measured=False)
    assert fast.swap_in_threshold_tokens <= slow.swap_in_threshold_tokens
    assert _break_even(fast_profile, None) < _break_even(slow_profile, None)


@pytest.mark.parametrize("machine", ["rtx4090", "h100", "small_gpu"])
def test_faster_link_lowers_the_threshold_measured(machine: str) -> None:
    profile = MACHINES[machine]
    cal = calibration_for(profile)
    slow_cal = replace(cal, h2d_pinned_gbps=2.0, state_set_gbps=2.0)
    slow = choose(profile, slow_cal, LLAMA_8B, load_settings())
    fast = choose(profile, cal, LLAMA_8B, load_settings())
    assert fast.swap_in_threshold_tokens <= slow.swap_in_threshold_tokens
    assert _break_even(profile, cal) < _break_even(profile, slow_cal)
    if machine == "h100":  # fast prefill: the threshold is large enough to show it
        assert fast.swap_in_threshold_tokens < slow.swap_in_threshold_tokens


@pytest.mark.parametrize("machine", sorted(MACHINES))
def test_slower_prefill_lowers_the_threshold(machine: str) -> None:
    """Slow prefill makes recomputing dear, so restoring pays off sooner."""
    profile = MACHINES[machine]
    cal = calibration_for(profile)
    slow_cal = replace(
        cal, prefill_short_s=cal.prefill_short_s * 4, prefill_long_s=cal.prefill_long_s * 4
    )
    fast = choose(profile, cal, LLAMA_8B, load_settings())
    slow = choose(profile, slow_cal, LLAMA_8B, load_settings())
    assert slow.swap_in_threshold_tokens <= fast.swap_in_threshold_tokens
    assert _break_even(profile, slow_cal) < _break_even(profile, cal)
    if machine == "h100":
        assert slow.swap_in_threshold_tokens < fast.swap_in_threshold_tokens


@pytest.mark.parametrize(("machine", "measured"), CASES)
def test_less_ram_shrinks_the_pool(machine: str, measured: bool) -> None:
    profile = MACHINES[machine]
    mem = profile.memory
    smaller = replace(profile, memory=MemoryInfo(mem.total * 3 // 4, mem.available * 3 // 4))
    big, small = _choose(profile, measured=measured), _choose(smaller, measured=measured)
    assert 0 < small.ram_pool_bytes < big.ram_pool_bytes


@pytest.mark.parametrize(
    ("read_gbps", "decompress_gbps", "ratio", "level"),
    [
        (0.2, 1.5, 0.60, 9),  # slow disk, compressible KV: compression saves disk for free
        (3.0, 1.5, 0.60, 0),  # the disk outruns decompression: store raw
        (0.2, 1.5, 0.97, 0),  # fp16 KV that barely compresses: not worth it
        (0.2, 0.25, 0.60, 0),  # read + decompress in series is much slower than raw
    ],
)
def test_zstd_level(read_gbps: float, decompress_gbps: float, ratio: float, level: int) -> None:
    points = tuple(
        ZstdPoint(lv, ratio + 0.01 * (9 - lv) / 8, 1.0, decompress_gbps) for lv in (1, 3, 9)
    )
    cal = calibration_for(SMALL_GPU, disk_read_gbps=read_gbps, zstd=points)
    chosen, reason = choose_zstd_level(cal)
    assert chosen == level and reason
    assert choose(SMALL_GPU, cal, LLAMA_8B, load_settings()).zstd_level == level


def test_disk_faster_than_decompression_turns_compression_off() -> None:
    points = (ZstdPoint(1, 0.5, 2.0, 2.0),)
    slow_disk = calibration_for(SMALL_GPU, disk_read_gbps=0.3, zstd=points)
    fast_disk = calibration_for(SMALL_GPU, disk_read_gbps=2.5, zstd=points)
    assert choose(SMALL_GPU, slow_disk, LLAMA_8B, load_settings()).zstd_level == 1
    off = choose(SMALL_GPU, fast_disk, LLAMA_8B, load_settings())
    assert off.zstd_level == 0 and "faster than zstd" in off.reasons["zstd_level"]


def test_slow_compression_is_refused() -> None:
    """Capture at full prefill speed must not wait for the compressor."""
    points = (ZstdPoint(1, 0.5, 0.01, 5.0),)
    cal = calibration_for(H100, disk_read_gbps=0.3, zstd=points)
    assert choose_zstd_level(cal)[0] == 0


OVERRIDES: dict[str, Any] = {
    "n_ctx": 4096,
    "resident_sequences": 3,
    "ram_pool_bytes": 1 << 30,
    "disk_budget_bytes": 5 << 30,
    "chunk_tokens": 128,
    "swap_in_threshold_tokens": 500,
    "high_watermark": 0.8,
    "low_watermark": 0.4,
    "zstd_level": 3,
    "prewarm_sessions": 2,
    "merge_batch_tokens": 512,
    "batch_tile": 64,
    "decode_batch": 1,
    "memory_floor_bytes": 3 << 30,
}


@pytest.mark.parametrize("name", sorted(OVERRIDES))
@pytest.mark.parametrize("machine", sorted(MACHINES))
def test_user_setting_wins(machine: str, name: str) -> None:
    t = _choose(MACHINES[machine], **{name: OVERRIDES[name]})
    assert getattr(t, name) == OVERRIDES[name]
    assert t.reasons[name] == "set by the user"
    assert 0.0 <= t.low_watermark < t.high_watermark <= 1.0


def test_every_override_at_once() -> None:
    t = _choose(H100, **OVERRIDES)
    assert {name: getattr(t, name) for name in OVERRIDES} == OVERRIDES
    assert set(t.reasons.values()) == {"set by the user"}


@pytest.mark.parametrize("machine", sorted(MACHINES))
def test_derived_values_stay_within_user_limits(machine: str) -> None:
    pool = 64 << 20
    t = _choose(MACHINES[machine], ram_pool_bytes=pool, resident_sequences=2)
    chat = min(t.n_ctx, 2048) * LLAMA_8B.kv_bytes_per_token
    assert t.prewarm_sessions * chat <= pool
    assert t.ram_pool_bytes == pool and t.resident_sequences == 2


@pytest.mark.parametrize(("low", "high"), [(0.97, None), (None, 0.05), (0.0, None)])
def test_one_watermark_from_the_user_keeps_the_pair_ordered(
    low: float | None, high: float | None
) -> None:
    t = _choose(RTX4090, low_watermark=low, high_watermark=high)
    assert 0.0 <= t.low_watermark < t.high_watermark <= 1.0


def test_no_gpu_is_normal() -> None:
    """A CUDA build on a machine whose GPU is gone runs on the CPU."""
    profile = replace(RTX4090, gpus=())
    t = choose(profile, None, LLAMA_8B, load_settings())
    assert not profile.offloads and t.resident_sequences >= 1


def test_partial_offload_keeps_host_kv() -> None:
    full = _choose(SMALL_GPU)
    half = _choose(SMALL_GPU, n_gpu_layers=16)
    assert half.ram_pool_bytes < full.ram_pool_bytes  # half the KV and weights live in RAM


@pytest.mark.parametrize(
    "geometry", [SMOLLM_135M, replace(LLAMA_8B, swa=True), replace(LLAMA_8B, recurrent=True)]
)
def test_other_models(geometry: object) -> None:
    t = choose(RTX4090, None, geometry, load_settings())  # type: ignore[arg-type]
    assert t.n_ctx <= geometry.n_ctx_train  # type: ignore[attr-defined]


def test_tiny_memory_still_answers() -> None:
    profile = replace(SMALL_GPU, gpus=(), memory=MemoryInfo(4 << 30, 3 << 30), backend="cpu")
    t = choose(profile, None, LLAMA_8B, load_settings())
    assert t.resident_sequences == 1 and t.n_ctx == 256 and t.ram_pool_bytes == 0
    assert t.prewarm_sessions == 0


def test_rates_from_calibration() -> None:
    cal = calibration_for(SMALL_GPU)  # state 6, RAM 15, H2D pinned 6 GB/s
    rates = rates_from(cal, zstd_level=0)
    assert rates.tier_gbps["ram"] == pytest.approx(6.0)
    assert rates.tier_gbps["disk"] == pytest.approx(1 / (1 / 0.5 + 1 / 6.0))
    assert rates.prefill_tps == pytest.approx(2500.0)
    assert rates.fixed_ms["disk"] > rates.fixed_ms["ram"] > 0
    compressed = rates_from(cal, zstd_level=1)  # ratio 0.91, 0.9 GB/s decompression
    assert compressed.tier_gbps["disk"] == pytest.approx(1 / (0.91 / 0.5 + 1 / 0.9 + 1 / 6.0))
    assert rates_from(cal).tier_gbps == rates.tier_gbps  # the chosen level is raw here


def test_estimates_follow_the_machine() -> None:
    laptop = estimate_rates(MACHINES["laptop"], LLAMA_8B).rates
    h100 = estimate_rates(H100, LLAMA_8B).rates
    assert h100.prefill_tps > 10 * laptop.prefill_tps
    assert h100.tier_gbps["ram"] > laptop.tier_gbps["ram"]


def test_policy_stays_pure() -> None:
    code = (
        "import sys, warmstart.runtime.policy; print(sorted(m for m in sys.modules "
        "if m.split('.')[0] in ('llama_cpp', 'psutil', 'zstandard') "
        "or m.startswith('warmstart.runtime.hardware')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_all_is_true() -> None:
    import warmstart.runtime.policy as policy

    assert sorted(policy.__all__) == sorted(
        n for n in dir(policy) if not n.startswith("_") and n != "annotations"
    )
    assert all(hasattr(policy, n) for n in policy.__all__)


@pytest.mark.parametrize("model", [SMOLLM_135M, LLAMA_8B], ids=["smollm", "llama8b"])
def test_cpu_live_context_is_capped_and_the_pool_takes_the_rest(model: Any) -> None:
    from warmstart.runtime.policy._choose import CPU_CHATS, CPU_LIVE_KV_BYTES, CPU_WANTED_CTX

    laptop = MACHINES["laptop"]
    t = choose(laptop, calibration_for(laptop), model, load_settings())
    live = t.n_ctx * t.resident_sequences * model.kv_bytes_per_token  # a stream each
    # A small model gets the fixed cap; a larger one room for two 8K chats. (Issue 14:
    # the fixed cap alone gave an 8B model 2048 tokens on a 16 GB laptop.)
    cap = max(CPU_LIVE_KV_BYTES, CPU_CHATS * CPU_WANTED_CTX * model.kv_bytes_per_token)
    assert live <= cap and "CPU inference" in t.reasons["n_ctx"]
    # the pool holds more than the live chats, or for the 8B at least another 8K chat
    assert t.ram_pool_bytes > min(live, CPU_WANTED_CTX * model.kv_bytes_per_token)
    gpu = choose(RTX4090, calibration_for(RTX4090), model, load_settings())
    assert "CPU inference" not in gpu.reasons["n_ctx"]


def test_whole_chunks_merge_only_where_measured_and_for_the_measured_size() -> None:
    from dataclasses import replace

    laptop = MACHINES["laptop"]
    measured = calibration_for(laptop)
    chunk = choose(laptop, measured, LLAMA_8B, load_settings()).chunk_tokens
    same = replace(measured, merge_units=(chunk // 2, chunk), merge_max=4 * chunk)
    assert choose(laptop, same, LLAMA_8B, load_settings()).merge_batch_tokens == 4 * chunk
    other = replace(measured, merge_units=(chunk * 2,), merge_max=8 * chunk)
    t = choose(laptop, other, LLAMA_8B, load_settings())
    assert t.merge_batch_tokens == 0 and "verified" in t.reasons["merge_batch_tokens"]
    never = choose(laptop, measured, LLAMA_8B, load_settings())
    assert never.merge_batch_tokens == 0 and never.reasons["merge_batch_tokens"]


@pytest.mark.parametrize("machine", sorted(MACHINES))
def test_the_memory_floor_is_the_reserve_left_to_the_os(machine: str) -> None:
    profile = MACHINES[machine]
    t = _choose(profile)
    assert t.memory_floor_bytes == host_reserve(profile.memory.total) // (1 << 20) * (1 << 20)
    # the pool, full, leaves the floor free as measured at start
    assert t.ram_pool_bytes <= profile.memory.available - t.memory_floor_bytes
    pinned = profile.offloads and profile.backend == "cuda"
    said = "pinned pages can be neither swapped nor given back" in t.reasons["memory_floor_bytes"]
    assert said == pinned


def test_a_restores_reason_counts_every_token_it_loads() -> None:
    """A blob replaces what a sequence holds: a restore beyond a live prefix loads the
    live tokens too, and its reason says so (a 1B run read "restore 16 tokens" while
    1,936 were loaded)."""
    from warmstart.runtime.policy import Rates, decide_restore

    rates = Rates(prefill_tps=80.0, tier_gbps={"ram": 7.0}, fixed_ms={"ram": 0.1})
    d = decide_restore(16, 1_936 * 32_780, "ram", 0, rates, live=1_920)
    assert d.restore and d.reason.startswith("restore 1936 tokens (16 beyond the 1920 live)")
    assert "recomputing 16" in d.reason
    assert decide_restore(512, 512 * 32_780, "ram", 0, rates).reason.startswith(
        "restore 512 tokens from ram"
    )


def test_replies_are_decoded_together_only_where_the_calibration_proved_it() -> None:
    from tests.hardware.machines import LAPTOP

    settings = load_settings()
    proven = calibration_for(LAPTOP, decode_batch=8)
    t = choose(LAPTOP, proven, SMOLLM_135M, settings)
    assert t.decode_batch == 8 and t.reasons["decode_batch"].startswith("measured")
    differ = calibration_for(LAPTOP, decode_batch=0, decode_batch_note="2 replies: differ")
    t = choose(LAPTOP, differ, SMOLLM_135M, settings)
    assert t.decode_batch == 1 and "2 replies: differ" in t.reasons["decode_batch"]
    # a GPU's kernels are other ones: serial until the GPU check proves them
    assert choose(H100, calibration_for(H100, decode_batch=8), LLAMA_8B, settings).decode_batch == 1
    # more than proven, set by the user: it says what that costs
    t = choose(LAPTOP, differ, SMOLLM_135M, load_settings(decode_batch=4))
    assert t.decode_batch == 4 and "may differ from --no-cache" in t.reasons["decode_batch"]
