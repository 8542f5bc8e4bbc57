"""The shipped catalogue: well-formed entries, and which machines each one fits."""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from warmstart.runtime.errors import ModelError
from warmstart.runtime.hardware import MemoryInfo
from warmstart.runtime.models._catalogue import available_rows, fit, load_catalogue

from tests.hardware.machines import LAPTOP, LLAMA_8B, MAC_M2, RTX4090, SMALL_GPU

GiB = 1 << 30
CATALOGUE = load_catalogue()


def test_a_handful_of_instruct_models_from_half_a_billion_to_eight() -> None:
    assert {"qwen2.5-0.5b", "qwen2.5-7b", "llama3.2", "llama3.1", "gemma3", "phi3.5"} <= set(
        CATALOGUE
    )
    sizes = sorted(e.size_bytes for e in CATALOGUE.values())
    assert sizes[0] < 500_000_000 and 4_500_000_000 < sizes[-1] < 6_000_000_000


@pytest.mark.parametrize("entry", CATALOGUE.values(), ids=list(CATALOGUE))
def test_every_entry_is_complete(entry) -> None:  # type: ignore[no-untyped-def]
    assert re.fullmatch(r"[\w.-]+/[\w.-]+", entry.repo) and entry.file.endswith(".gguf")
    assert entry.sha256 is None or re.fullmatch(r"[0-9a-f]{64}", entry.sha256)
    # a verified hash holds only at one revision: it is pinned to a commit
    assert entry.sha256 is None or re.fullmatch(r"[0-9a-f]{40}", entry.revision)
    assert entry.quantization in entry.file and entry.license and entry.title
    assert entry.context_length >= 8192 and 4096 < entry.kv_bytes_per_token < 1 << 20
    assert entry.needs_bytes > entry.size_bytes


def test_llama_8b_figures_match_the_policy_tests_geometry() -> None:
    entry = CATALOGUE["llama3.1"]
    assert entry.kv_bytes_per_token == LLAMA_8B.kv_bytes_per_token
    assert entry.size_bytes == LLAMA_8B.model_bytes


@pytest.mark.parametrize(
    ("profile", "name", "where"),
    [
        (LAPTOP, "llama3.1", "ram"),  # 16 GB, no GPU: on the CPU
        (RTX4090, "llama3.1", "gpu"),
        (MAC_M2, "llama3.1", "gpu"),  # Metal, in unified memory
        (SMALL_GPU, "llama3.1", "gpu"),  # 8 GB of VRAM hold a Q4 8B with 4k of context
        (replace(LAPTOP, memory=MemoryInfo(6 * GiB, 4 * GiB)), "llama3.1", "no"),
        (replace(LAPTOP, memory=MemoryInfo(6 * GiB, 4 * GiB)), "llama3.2", "ram"),
    ],
)
def test_fit(profile, name: str, where: str) -> None:  # type: ignore[no-untyped-def]
    got, why = fit(CATALOGUE[name], profile)
    assert got == where and "GiB" in why


def test_rows_mark_fit_and_installed() -> None:
    small = replace(LAPTOP, memory=MemoryInfo(6 * GiB, 4 * GiB))
    rows = available_rows(CATALOGUE, small, installed={"qwen2.5-0.5b"})
    by_name = {row.split()[0]: row for row in rows[1:-1]}
    assert "too big" in by_name["llama3.1"] and "fits (CPU) *" in by_name["qwen2.5-0.5b"]
    assert len(by_name) == len(CATALOGUE)


def test_a_malformed_catalogue_is_a_model_error() -> None:
    with pytest.raises(ModelError, match="format"):
        load_catalogue("format = 2\n")
    with pytest.raises(ModelError, match="malformed"):
        load_catalogue('format = 1\n[models.x]\nrepo = "a/b"\n')


def test_cli_lists_the_catalogue(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "warmstart.runtime.cli", "models", "list", "--available",
         "--data-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=120, check=True,
    ).stdout  # fmt: skip
    assert "llama3.1" in out and "Llama 3.1 8B Instruct" in out and "fits" in out
