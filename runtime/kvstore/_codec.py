"""The on-disk record format of one chunk (pure: bytes in, bytes out).

    offset  size  field
    0       4     magic b"WSKV"
    4       2     format version (1)
    6       1     codec: 0 raw, 1 zstd
    7       1     zstd level (0 for raw)
    8       32    SHA-256 of the model/context fingerprint
    40      16    chunk key
    56      8     payload length, uncompressed
    64      4     CRC-32 of the uncompressed payload
    68      ...   payload (raw, or one zstd frame)

A record is only ever restored into a context with the same fingerprint, under the
same key, with an intact checksum: anything else raises CacheError and the caller
drops it and recomputes.
"""

from __future__ import annotations

import hashlib
import struct
import zlib
from dataclasses import dataclass

import zstandard

from runtime.errors import CacheError

MAGIC = b"WSKV"
FORMAT_VERSION = 1
_HEADER = struct.Struct("<4sHBB32s16sQI")
HEADER_BYTES = _HEADER.size
CODEC_RAW, CODEC_ZSTD = 0, 1


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
    crc = zlib.crc32(view)
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


def decode(data: bytes | memoryview, fingerprint: bytes, key: bytes) -> bytes:
    """Checks a record against the expected fingerprint and key; returns the KV bytes."""
    header = read_header(data)
    if header.fingerprint != fingerprint:
        raise CacheError("record made for another model or context configuration")
    if header.key != key:
        raise CacheError("record stored under another key")
    body = memoryview(data)[HEADER_BYTES:]
    if header.codec == CODEC_ZSTD:
        try:
            payload = zstandard.ZstdDecompressor().decompress(body, max_output_size=header.length)
        except zstandard.ZstdError as exc:
            raise CacheError(f"record does not decompress: {exc}") from exc
    elif header.codec == CODEC_RAW:
        payload = bytes(body)
    else:
        raise CacheError(f"unknown codec {header.codec}")
    if len(payload) != header.length:
        raise CacheError(f"record truncated: {len(payload)} of {header.length} bytes")
    if zlib.crc32(payload) != header.crc:
        raise CacheError("record checksum mismatch")
    return payload
