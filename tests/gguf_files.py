"""Tiny GGUF files (a header, no weights) for tests of what reads headers."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any


def _string(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw


def _value(value: Any) -> bytes:
    if isinstance(value, bool):
        return struct.pack("<I?", 7, value)
    if isinstance(value, int):
        return struct.pack("<Ii", 5, value) if value < 2**31 else struct.pack("<IQ", 10, value)
    if isinstance(value, float):
        return struct.pack("<If", 6, value)
    if isinstance(value, str):
        return struct.pack("<I", 8) + _string(value)
    if isinstance(value, list):  # of strings: the reader must walk each one
        return struct.pack("<IIQ", 9, 8, len(value)) + b"".join(_string(v) for v in value)
    raise TypeError(value)


def write_gguf(
    path: Path, metadata: dict[str, Any], tensors: dict[str, tuple[int, ...]] | None = None
) -> Path:
    """A GGUF v3 header with ``metadata`` and a tensor table (shapes only)."""
    tensors = tensors or {}
    out = [b"GGUF", struct.pack("<IQQ", 3, len(tensors), len(metadata))]
    out += [_string(k) + _value(v) for k, v in metadata.items()]
    for name, dims in tensors.items():
        out.append(_string(name) + struct.pack("<I", len(dims)))
        out.append(struct.pack(f"<{len(dims)}Q", *dims) + struct.pack("<IQ", 0, 0))
    path.write_bytes(b"".join(out))
    return path


def tiny_model(path: Path, arch: str = "llama", ctx: int = 4096, file_type: int = 15) -> Path:
    """A header that says: ``arch``, ``ctx`` tokens trained, file type (15: Q4_K_M),
    a vocabulary of three tokens and 2 x 3 x 4 + 10 = 34 parameters."""
    return write_gguf(
        path,
        {
            "general.architecture": arch,
            "general.name": path.stem,
            "general.organization": "Testers",
            "general.file_type": file_type,
            f"{arch}.context_length": ctx,
            "tokenizer.ggml.tokens": ["a", "b", "c"],
        },
        {"blk.0.w": (2, 3, 4), "out": (10,)},
    )
