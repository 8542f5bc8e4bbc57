"""Chunk keys: a hash chain over token ids, seeded with the model fingerprint (pure).

``key_i = H(key_{i-1} || tokens of chunk i)``, so a key names the whole prefix up
to the chunk's end, and the same prefix under the same model always has the same
keys (a system prompt shared by many chats is stored once).
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence

KEY_BYTES = 16


def root_key(fingerprint: str) -> bytes:
    """The chain's seed: differs for every model/context fingerprint."""
    return hashlib.blake2b(
        b"warmstart-root\0" + fingerprint.encode(), digest_size=KEY_BYTES
    ).digest()


def chunk_key(parent: bytes, tokens: Sequence[int]) -> bytes:
    return hashlib.blake2b(parent + array("i", tokens).tobytes(), digest_size=KEY_BYTES).digest()


def batch_cuts(n_tokens: int, chunk_tokens: int, anchor: int = 0, tail: int = 2) -> list[int]:
    """The ends of the batches a prompt of ``n_tokens`` is prefilled in, cold or not.

    A token's KV depends on the batch it was computed in (DESIGN.md, "Numerics"), so
    every prefill of a prompt uses these same batches, wherever its cached prefix
    ends: one every ``chunk_tokens`` from position 0, one ending at ``anchor`` (the
    end of the system prompt, so chats sharing it share its chunks), one ending
    ``tail`` tokens before the end, and the last ``tail`` tokens together. Each batch
    but the last is a chunk the store can keep; a prefix is restored only up to the
    end of one of them.
    """
    if n_tokens <= 0:
        return []
    stop = max(n_tokens - tail, 0)
    cuts = set(range(chunk_tokens, stop, chunk_tokens))
    if 0 < anchor < stop:
        cuts.add(anchor)
    cuts.update(c for c in (stop, n_tokens) if c > 0)
    return sorted(cuts)


def aligned_cuts(start: int, end: int, chunk_tokens: int, anchor: int = 0) -> list[int]:
    """The batch ends in (start, end] that every longer prompt shares: multiples of
    ``chunk_tokens`` and the anchor. What a finished reply is re-prefilled along."""
    cuts = {c for c in range(chunk_tokens * (start // chunk_tokens + 1), end + 1, chunk_tokens)}
    if start < anchor <= end:
        cuts.add(anchor)
    return sorted(cuts)


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i
