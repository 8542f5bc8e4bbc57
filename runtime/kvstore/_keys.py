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


def cut_points(n_tokens: int, chunk_tokens: int, anchor: int = 0) -> list[int]:
    """Chunk boundaries for a prefix of ``n_tokens`` (always ending with ``n_tokens``).

    A boundary falls exactly at ``anchor`` (the end of the system prompt), so every
    conversation that shares a system prompt shares all of its chunks instead of each
    storing one that straddles its end. Before the anchor, ``[0, anchor)`` is split
    into equal parts of at most ``chunk_tokens`` (no sliver of a chunk at its end);
    after it, a boundary every ``chunk_tokens``.
    """
    if n_tokens <= 0:
        return []
    anchor = anchor if 0 < anchor <= n_tokens else 0
    cuts: list[int] = []
    if anchor:
        parts = -(-anchor // chunk_tokens)
        cuts.extend(anchor * i // parts for i in range(1, parts + 1))
    cuts.extend(range(anchor + chunk_tokens, n_tokens, chunk_tokens))
    cuts.append(n_tokens)
    return sorted(set(cuts))


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i
