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

Format 3 is format 2 with 8 more header bytes (u32 length of the logits the payload
ends with, u32 reserved: 0), then the payload: the chunk's KV bytes followed by the
next-token logits (float32, the whole vocabulary) its last batch gave. A chunk kept
without logits is still written as format 2, which a reader without logits reads.

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
LOGITS_VERSION = 3  # 3: the payload ends with logits (their length after the header)
_HEADER = struct.Struct("<4sHBB32s16sQQ")
_LOGITS = struct.Struct("<II")  # format 3's: the logits' bytes, reserved
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
    logits: int = 0  # the payload's last bytes that are logits, not KV

    @property
    def size(self) -> int:
        """Bytes the header takes before the payload."""
        return HEADER_BYTES + extension_bytes(self.version)


def extension_bytes(version: int) -> int:
    """Header bytes after the first ``HEADER_BYTES`` a record of ``version`` has."""
    return _LOGITS.size if version == LOGITS_VERSION else 0


def encode(
    payload: bytes | memoryview, key: bytes, fingerprint: bytes, level: int, logits: int = 0
) -> bytes:
    """Wraps one chunk's KV bytes (and the ``logits`` bytes that end ``payload``, when
    it keeps the logits of its last batch); ``level`` 0 stores them raw."""
    view = memoryview(payload).cast("B")
    crc = checksum(view)
    if level > 0:
        body = zstandard.ZstdCompressor(level=level).compress(view)
        codec = CODEC_ZSTD
    else:
        body, codec = bytes(view), CODEC_RAW
    if not 0 <= logits <= len(view):
        raise CacheError(f"{logits} bytes of logits in a payload of {len(view)}")
    version = LOGITS_VERSION if logits else FORMAT_VERSION
    head = _HEADER.pack(MAGIC, version, codec, level, fingerprint, key, len(view), crc)
    if logits:
        head += _LOGITS.pack(logits, 0)
    return head + body


def read_header(data: bytes | memoryview) -> Header:
    """The header at the start of ``data`` (format 3's whole header: see ``size``)."""
    if len(data) < HEADER_BYTES:
        raise CacheError(f"record truncated: {len(data)} bytes, header needs {HEADER_BYTES}")
    magic, version, codec, level, fp, key, length, crc = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise CacheError("not a warmstart KV record (bad magic)")
    if version not in (FORMAT_VERSION, LOGITS_VERSION):
        raise CacheError(f"record format {version} is not {FORMAT_VERSION} or {LOGITS_VERSION}")
    header = Header(version, codec, level, fp, key, length, crc)
    if version == LOGITS_VERSION:
        if len(data) < header.size:
            raise CacheError(f"record truncated: {len(data)} bytes, header needs {header.size}")
        logits, _ = _LOGITS.unpack_from(data, HEADER_BYTES)
        if not 0 < logits <= length:
            raise CacheError(f"record says {logits} bytes of logits in {length}")
        header = Header(version, codec, level, fp, key, length, crc, logits)
    return header


def header_from(src: BinaryIO) -> Header:
    """Reads a record's header (of either format) from the start of ``src``."""
    head = src.read(HEADER_BYTES)
    if len(head) >= 6:
        head += src.read(extension_bytes(int.from_bytes(head[4:6], "little")))
    return read_header(head)


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
    body = io.BytesIO(bytes(memoryview(data)[header.size :]))
    n = read_into(body, header, fingerprint, key, out)
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
