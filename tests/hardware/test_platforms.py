"""Windows and macOS: the probe degrades instead of crashing, and doctor stays sane there.

Neither system runs here; the recorded profiles (tests/hardware/machines.py)
are what the probe reports on them, and the Linux-only sources are run with
their files and functions taken away.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest
from warmstart.runtime.cli._doctor import doctor_report, render_doctor
from warmstart.runtime.hardware import (
    AppleGpuSource,
    NoGpuSource,
    ProcCpuSource,
    RecordedBackendSource,
    SysfsDiskSource,
    SysfsPcieSource,
    default_sources,
    probe,
)
from warmstart.runtime.policy import choose
from warmstart.runtime.policy._choose import host_reserve
from warmstart.runtime.settings import load_settings

from tests.hardware.machines import LLAMA_8B, MAC_M2, WINDOWS, calibration_for

pytestmark = pytest.mark.usefixtures("clean_settings")


def test_probe_without_sysfs_proc_or_device_numbers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Windows has no /sys, no /proc and no os.major: every source still answers."""
    monkeypatch.delattr(os, "major")
    sources = replace(
        default_sources(tmp_path / "no-sys"),
        gpu=NoGpuSource(),
        cpu=ProcCpuSource(tmp_path / "no-cpuinfo"),
        backend=RecordedBackendSource("cpu"),
    )
    profile = probe(tmp_path / "cache", sources)
    assert profile.notes == ()
    assert profile.disk.free > 0 and profile.disk.kind == "unknown" and profile.disk.device == ""
    assert profile.cpu.logical_cores >= 1 and profile.cpu.model
    assert SysfsPcieSource(tmp_path / "no-sys").links() == ()


def test_disk_on_macos_without_sysfs(tmp_path: Path) -> None:
    disk = SysfsDiskSource(tmp_path / "no-sys").disk(tmp_path / "not" / "yet")
    assert disk.total > 0 and disk.kind == "unknown"


def test_apple_gpu_source_is_unified_and_only_on_apple_silicon() -> None:
    (gpu,) = AppleGpuSource(system="Darwin", machine="arm64").gpus()
    assert gpu.unified and gpu.pcie is None and gpu.source == "metal" and gpu.vram_total > 0
    assert AppleGpuSource(system="Darwin", machine="x86_64").gpus() == ()
    assert AppleGpuSource(system="Linux", machine="arm64").gpus() == ()


@pytest.mark.parametrize("measured", [True, False])
def test_mac_counts_unified_memory_once_and_pins_nothing(measured: bool) -> None:
    cal = calibration_for(MAC_M2) if measured else None
    tuning = choose(MAC_M2, cal, LLAMA_8B, load_settings())
    assert MAC_M2.unified_memory and not MAC_M2.offloads
    # model, live KV and pool all come out of the one RAM, with the OS's share left
    kv = (tuning.resident_sequences + 1) * tuning.n_ctx * LLAMA_8B.kv_bytes_per_token
    used = LLAMA_8B.model_bytes + kv + tuning.ram_pool_bytes
    assert used + host_reserve(MAC_M2.memory.total) <= MAC_M2.memory.available
    assert tuning.ram_pool_bytes > 0 and "pinned" not in tuning.reasons["ram_pool_bytes"]
    assert "no PCIe link" in tuning.reasons["ram_pool_bytes"]
    assert "unified memory" in tuning.reasons["n_ctx"]
    if not measured:
        assert "unified memory" in tuning.reasons["chunk_tokens"]

    text = render_doctor(doctor_report(MAC_M2, cal, tuning))
    assert "Apple M2 Pro: unified memory with the CPU" in text and "PCIe gen" not in text
    assert "PCIe unknown" not in text and "pinned" not in text
    assert "llama.cpp backend: metal" in text


@pytest.mark.parametrize("measured", [True, False])
def test_windows_keeps_a_disk_tier_and_its_gpu(measured: bool) -> None:
    cal = calibration_for(WINDOWS) if measured else None
    tuning = choose(WINDOWS, cal, LLAMA_8B, load_settings())
    assert WINDOWS.offloads
    assert 0 < tuning.disk_budget_bytes <= WINDOWS.disk.free // 2  # unknown kind, still a tier
    kv = (tuning.resident_sequences + 1) * tuning.n_ctx * LLAMA_8B.kv_bytes_per_token
    assert kv + LLAMA_8B.model_bytes < WINDOWS.gpus[0].vram_free
    assert tuning.ram_pool_bytes <= WINDOWS.memory.total // 2  # pinned for CUDA: capped
    text = render_doctor(doctor_report(WINDOWS, cal, tuning))
    assert "NVIDIA GeForce RTX 4070" in text and "no notable flags" in text
    assert r"C:\Users\u\AppData\Local\warmstart\cache" in text
