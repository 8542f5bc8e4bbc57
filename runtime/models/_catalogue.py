"""The catalogue of well-known instruct GGUFs shipped with warmstart (catalogue.toml),
and whether each fits a machine (pure: the profile is passed in).

Names follow Ollama's where there is one (``llama3.2`` is the 3B, ``llama3.2-1b`` the
1B). An entry without a verified SHA-256 has ``sha256 = None``: its pull reports the
hash it computed and warns instead of refusing.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING, Literal

from ..errors import ModelError
from ..policy import host_reserve, vram_reserve

if TYPE_CHECKING:
    from ..hardware import HardwareProfile

MiB = 1 << 20
GiB = 1 << 30
FIT_CTX = 4096  # the context a model must hold to count as fitting: one real chat
COMPUTE_BYTES = 512 * MiB  # llama.cpp's compute buffers and the process around them

Fit = Literal["gpu", "ram", "no"]


@dataclass(frozen=True)
class CatalogueEntry:
    name: str
    title: str
    repo: str
    revision: str
    file: str
    quantization: str
    size_bytes: int
    sha256: str | None
    context_length: int
    license: str
    kv_bytes_per_token: int

    @property
    def needs_bytes(self) -> int:
        return needs_bytes(self.size_bytes, self.kv_bytes_per_token)


def _entry(name: str, raw: dict[str, object]) -> CatalogueEntry:
    try:
        return CatalogueEntry(name=name, sha256=raw.pop("sha256", None), **raw)  # type: ignore[arg-type]
    except TypeError as exc:
        raise ModelError(f"catalogue entry {name!r} is malformed: {exc}") from exc


def load_catalogue(text: str | None = None) -> dict[str, CatalogueEntry]:
    """The shipped catalogue (or ``text``, a catalogue in the same format)."""
    if text is None:
        text = resources.files(__package__).joinpath("catalogue.toml").read_text("utf-8")
    data = tomllib.loads(text)
    if data.get("format") != 1:
        raise ModelError(f"catalogue format {data.get('format')!r} is not 1")
    return {name: _entry(name, dict(raw)) for name, raw in data.get("models", {}).items()}


def needs_bytes(size_bytes: int, kv_bytes_per_token: int) -> int:
    """Memory to run a model: weights, a KV of FIT_CTX tokens at f16, compute buffers."""
    return size_bytes + FIT_CTX * kv_bytes_per_token + COMPUTE_BYTES


def fit(entry: CatalogueEntry, profile: HardwareProfile) -> tuple[Fit, str]:
    """Where the model runs on this machine (see :func:`fit_bytes`)."""
    return fit_bytes(entry.needs_bytes, profile)


def fit_bytes(need: int, profile: HardwareProfile) -> tuple[Fit, str]:
    """Where a model needing ``need`` bytes runs on this machine, by total memory (what
    is free changes by the minute; the OS and the CUDA context keep their reserves)."""
    gpu = profile.gpu
    if gpu is not None and (profile.offloads or profile.unified_memory):
        room = gpu.vram_total - vram_reserve(gpu.vram_total)
        if profile.unified_memory:
            room = profile.memory.total - host_reserve(profile.memory.total)
        if need <= room:
            return "gpu", f"needs {need / GiB:.1f} GiB of {room / GiB:.1f} GiB on the GPU"
    room = profile.memory.total - host_reserve(profile.memory.total)
    if need <= room:
        return "ram", f"needs {need / GiB:.1f} GiB of {room / GiB:.1f} GiB of RAM (CPU)"
    return "no", f"needs {need / GiB:.1f} GiB; this machine has {room / GiB:.1f} GiB to give"


def available_rows(
    catalogue: dict[str, CatalogueEntry], profile: HardwareProfile, installed: set[str]
) -> list[str]:
    """The lines of ``models list --available``: what each entry is and where it fits."""
    marks = {"gpu": "fits (GPU)", "ram": "fits (CPU)", "no": "too big"}
    rows = [f"{'NAME':14s} {'SIZE':>8s}  {'CONTEXT':>7s}  {'LICENCE':10s} {'FITS':12s} TITLE"]
    for entry in catalogue.values():
        where, _ = fit(entry, profile)
        mark = marks[where] + (" *" if entry.name in installed else "")
        rows.append(
            f"{entry.name:14s} {entry.size_bytes / 1e9:>6.2f}GB  {entry.context_length:>7d}  "
            f"{entry.license:10s} {mark:12s} {entry.title}"
        )
    rows.append("* installed. Pull one with `warmstart models pull NAME`.")
    return rows
