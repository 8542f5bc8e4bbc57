import pytest
from warmstart.runtime.errors import CacheError
from warmstart.runtime.kvstore import _codec

FP = _codec.fingerprint_digest("model-a")
KEY = bytes(range(16))
PAYLOAD = bytes(range(256)) * 64


@pytest.mark.parametrize("level", [0, 1, 3])
def test_roundtrip(level: int) -> None:
    record = _codec.encode(PAYLOAD, KEY, FP, level)
    assert _codec.decode(record, FP, KEY) == PAYLOAD
    assert _codec.read_header(record).level == level


def test_corrupt_truncated_and_foreign_records_are_refused() -> None:
    record = bytearray(_codec.encode(PAYLOAD, KEY, FP, 1))
    with pytest.raises(CacheError, match="another model"):
        _codec.decode(bytes(record), _codec.fingerprint_digest("model-b"), KEY)
    with pytest.raises(CacheError, match="another key"):
        _codec.decode(bytes(record), FP, bytes(16))
    with pytest.raises(CacheError):
        _codec.decode(bytes(record[: len(record) // 2]), FP, KEY)
    with pytest.raises(CacheError, match="truncated"):
        _codec.decode(bytes(record[:10]), FP, KEY)
    raw = bytearray(_codec.encode(PAYLOAD, KEY, FP, 0))
    raw[-5] ^= 0xFF
    with pytest.raises(CacheError, match="checksum"):
        _codec.decode(bytes(raw), FP, KEY)
    record[0:4] = b"NOPE"
    with pytest.raises(CacheError, match="magic"):
        _codec.decode(bytes(record), FP, KEY)


def test_a_record_of_the_unified_cache_format_is_refused() -> None:
    # format 1 held chunks cut through a scratch sequence of a unified KV cache: their
    # blobs no longer load into a stream per conversation, so they are dropped unread
    record = bytearray(_codec.encode(PAYLOAD, KEY, FP, 0))
    record[4:6] = (1).to_bytes(2, "little")
    with pytest.raises(CacheError, match="format 1"):
        _codec.decode(bytes(record), FP, KEY)
