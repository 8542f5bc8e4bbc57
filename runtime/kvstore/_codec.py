"""The on-disk record format of one chunk (pure: bytes in, bytes out).

    offset  size  field
    0       4     magic b"WSKV"
    4       2     format version (1)
    6       1     codec: 0 raw, 1 zstd
    7       1     zstd level (0 for raw)
    8       32    SHA-256 of the model/context fingerprint
    40      16    chunk key
    56      8     payload length, uncompressed
    64      8     XXH3-64 of the uncompressed payload
    72      ...   payload (raw, or one zstd frame)

A record is only ever restored into a context with the same fingerprint, under the
same key, with an intact checksum: anything else raises CacheError and the caller
drops it and recomputes.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass
from typing import BinaryIO

import numpy as np
import xxhash
import zstandard

from ..errors import CacheError

MAGIC = b"WSKV"
FORMAT_VERSION = 2  # 2: chunks are cut from a stream-per-sequence state (engine/_kvblob.py)
_HEADER = struct.Struct("<4sHBB32s16sQQ")
HEADER_BYTES = _HEADER.size
CODEC_RAW, CODEC_ZSTD = 0, 1


def checksum(data: bytes | memoryview | np.ndarray) -> int:
    """XXH3-64: about 6 GB/s here, where zlib's CRC-32 does 2.4; it is on the restore path."""
    return int(xxhash.xxh3_64_intdigest(data))  # type: ignore[arg-type]


def fingerprint_digest(fingerprint: str) -> bytes:
    return hashlib.sha256(fingerprint.encode()).digest()


@dataclass(frozen=True)
class Header:
    version: int
    codec: int
    level: int
    fingerprint: bytes
    key: bytes
    length: int
    crc: int


def encode(payload: bytes | memoryview, key: bytes, fingerprint: bytes, level: int) -> bytes:
    """Wraps one chunk's KV bytes; ``level`` 0 stores them raw."""
    view = memoryview(payload).cast("B")
    crc = checksum(view)
    if level > 0:
        body = zstandard.ZstdCompressor(level=level).compress(view)
        codec = CODEC_ZSTD
    else:
        body, codec = bytes(view), CODEC_RAW
    head = _HEADER.pack(MAGIC, FORMAT_VERSION, codec, level, fingerprint, key, len(view), crc)
    return head + body


def read_header(data: bytes | memoryview) -> Header:
    if len(data) < HEADER_BYTES:
        raise CacheError(f"record truncated: {len(data)} bytes, header needs {HEADER_BYTES}")
    magic, version, codec, level, fp, key, length, crc = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise CacheError("not a warmstart KV record (bad magic)")
    if version != FORMAT_VERSION:
        raise CacheError(f"record format {version} is not {FORMAT_VERSION}")
    return Header(version, codec, level, fp, key, length, crc)


def check_header(header: Header, fingerprint: bytes, key: bytes) -> None:
    if header.fingerprint != fingerprint:
        raise CacheError("record made for another model or context configuration")
    if header.key != key:
        raise CacheError("record stored under another key")
    if header.codec not in (CODEC_RAW, CODEC_ZSTD):
        raise CacheError(f"unknown codec {header.codec}")


def decode(data: bytes | memoryview, fingerprint: bytes, key: bytes) -> bytes:
    """Checks a whole record against the expected fingerprint and key; returns the KV bytes."""
    import io

    header = read_header(data)
    out = np.empty(header.length, dtype=np.uint8)
    n = read_into(io.BytesIO(bytes(memoryview(data)[HEADER_BYTES:])), header, fingerprint, key, out)
    return out[:n].tobytes()


def read_into(
    src: BinaryIO, header: Header, fingerprint: bytes, key: bytes, out: np.ndarray
) -> int:
    """Reads the payload that follows ``header`` in ``src`` straight into ``out`` (no
    intermediate copy), verifies it, and returns its length. Raises CacheError."""
    check_header(header, fingerprint, key)
    if header.length > out.nbytes:
        raise CacheError(f"record of {header.length} bytes does not fit {out.nbytes}")
    view = out[: header.length].data.cast("B")
    try:
        if header.codec == CODEC_ZSTD:
            reader = zstandard.ZstdDecompressor().stream_reader(src, closefd=False)
            n = _fill(reader, view)
        else:
            n = _fill(src, view)
    except zstandard.ZstdError as exc:
        raise CacheError(f"record does not decompress: {exc}") from exc
    if n != header.length:
        raise CacheError(f"record truncated: {n} of {header.length} bytes")
    if checksum(view) != header.crc:
        raise CacheError("record checksum mismatch")
    return n


def _fill(src: BinaryIO, view: memoryview) -> int:
    n = 0
    while n < len(view):
        got = src.readinto(view[n:])  # type: ignore[attr-defined]
        if not got:
            break
        n += got
    return n
