"""A GGUF file's header, read without loading its weights (pure Python, mmap).

What a model listing needs (architecture, context length, file type, parameter
count) lies in the header: the key/value metadata and the tensor table. The file is
mapped, not read, so only the header's pages are touched (a few MB for a large
vocabulary; the weights never are). Arrays (the vocabulary, the merges) are skipped,
their length kept. Layout: https://github.com/ggml-org/ggml/blob/master/docs/gguf.md
"""

from __future__ import annotations

import math
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ModelError

MAGIC = b"GGUF"
_STRING, _ARRAY = 8, 9
# value type -> struct format of the scalar types
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?"}
_SCALARS |= {10: "<Q", 11: "<q", 12: "<d"}

# llama.cpp's llama_ftype (include/llama.h), by value; a test checks it against llama_cpp
FILE_TYPES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1",
    10: "Q2_K", 11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M",
    16: "Q5_K_S", 17: "Q5_K_M", 18: "Q6_K", 19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S",
    22: "IQ3_XS", 23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL", 26: "IQ3_S", 27: "IQ3_M",
    28: "IQ2_S", 29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M", 32: "BF16", 36: "TQ1_0",
    37: "TQ2_0", 38: "MXFP4_MOE",
}  # fmt: skip


@dataclass(frozen=True)
class Header:
    version: int
    metadata: dict[str, Any]  # scalars and strings; an array is its length
    n_params: int  # elements of every tensor

    @property
    def architecture(self) -> str | None:
        arch = self.metadata.get("general.architecture")
        return arch if isinstance(arch, str) else None

    def arch_value(self, key: str) -> Any:
        """``{architecture}.{key}``, e.g. ``context_length``; None when absent."""
        return self.metadata.get(f"{self.architecture}.{key}")

    @property
    def file_type(self) -> str | None:
        code = self.metadata.get("general.file_type")
        return FILE_TYPES.get(code, f"type {code}") if isinstance(code, int) else None


class _Cursor:
    def __init__(self, buf: mmap.mmap) -> None:
        self.buf, self.at = buf, 0

    def unpack(self, fmt: str) -> Any:
        (value,) = struct.unpack_from(fmt, self.buf, self.at)
        self.at += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        n = self.unpack("<Q")
        raw = self.buf[self.at : self.at + n]
        self.at += n
        return raw.decode("utf-8", errors="replace")

    def value(self, kind: int) -> Any:
        if kind in _SCALARS:
            return self.unpack(_SCALARS[kind])
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            item, n = self.unpack("<I"), self.unpack("<Q")
            if item in _SCALARS:
                self.at += n * struct.calcsize(_SCALARS[item])
            else:  # strings (or nested arrays): each has its own length
                for _ in range(n):
                    self.value(item)
            return n
        raise ValueError(f"unknown GGUF value type {kind}")


def read_header(path: Path) -> Header:
    """The metadata and parameter count of a GGUF file; ModelError when it is not one."""
    try:
        with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            return _parse(buf)
    except (OSError, ValueError, struct.error, IndexError) as exc:
        raise ModelError(f"{path}: not a readable GGUF file ({exc})") from exc


def _parse(buf: mmap.mmap) -> Header:
    if buf[:4] != MAGIC:
        raise ValueError("no GGUF magic")
    cur = _Cursor(buf)
    cur.at = 4
    version = cur.unpack("<I")
    if version < 2:  # version 1 used 32-bit counts; llama.cpp refuses it too
        raise ValueError(f"GGUF version {version} is too old")
    n_tensors, n_kv = cur.unpack("<Q"), cur.unpack("<Q")
    metadata: dict[str, Any] = {}
    for _ in range(n_kv):
        key = cur.string()
        metadata[key] = cur.value(cur.unpack("<I"))
    n_params = 0
    for _ in range(n_tensors):
        name_bytes = cur.unpack("<Q")  # (not `cur.at += ...`: that reads cur.at first)
        cur.at += name_bytes
        dims = [cur.unpack("<Q") for _ in range(cur.unpack("<I"))]
        cur.at += 4 + 8  # element type, data offset
        n_params += math.prod(dims)
    return Header(version, metadata, n_params)
