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


def scoped_root(fingerprint: str, scope: str = "") -> bytes:
    """The seed of one cache scope's chains: a household user's salt, a request's
    ``cache_salt`` (runtime/users.py, api/_admission.py). A prefix kept under one scope
    has other keys under every other, so it is never found, restored or shared there,
    in any tier, after a restart too. The empty scope is the unsalted chain of a
    single-user install."""
    root = root_key(fingerprint)
    if not scope:
        return root
    data = root + b"scope\0" + scope.encode("utf-8")
    return hashlib.blake2b(data, digest_size=KEY_BYTES).digest()


def chunk_key(parent: bytes, tokens: Sequence[int], stepped: bool = False) -> bytes:
    """``stepped``: the chunk is a run of one-token batches (see ``_batches.chunk_spans``),
    which gives other KV bits than one batch of the same tokens: another key."""
    mark = b"\x01" if stepped else b""
    data = parent + array("i", tokens).tobytes() + mark
    return hashlib.blake2b(data, digest_size=KEY_BYTES).digest()
