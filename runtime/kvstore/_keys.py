"""Chunk keys: a hash chain over token ids, seeded with the model fingerprint (pure).

``key_i = H(key_{i-1} || tokens of chunk i)``, so a key names the whole prefix up
to the chunk's end, and the same prefix under the same model always has the same
keys (a system prompt shared by many chats is stored once).
"""

from __future__ import annotations

import hashlib
import itertools
from array import array
from collections.abc import Sequence

KEY_BYTES = 16
Span = tuple[int, int, bool]  # a stored chunk's positions [start, end), and if stepped
TAIL_TOKENS = 2  # a prompt's last tokens, always decoded together, never restored


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
    """``stepped``: the chunk is a run of one-token batches (see :func:`chunk_spans`),
    which gives other KV bits than one batch of the same tokens: another key."""
    mark = b"\x01" if stepped else b""
    data = parent + array("i", tokens).tobytes() + mark
    return hashlib.blake2b(data, digest_size=KEY_BYTES).digest()


def chunk_spans(ends: Sequence[int], start: int = 0, run_tokens: int = 0) -> list[Span]:
    """The chunks a store keeps along batch ``ends`` (from position ``start``): one per
    batch, but a run of one-token batches (a reply, decoded a token at a time, and
    what a prefill steps through the same way, see ``LlamaEngine._turn_starts``) is one
    chunk, cut where a multiple of ``run_tokens`` falls (0: nowhere) and at its end.
    (start, end, stepped) each; a span is stepped when it holds several batches."""
    spans: list[Span] = []
    c0 = prev = start
    for i, end in enumerate(ends):
        single = end - prev == 1
        nxt = ends[i + 1] - end if i + 1 < len(ends) else 0
        inside = single and nxt == 1 and not (run_tokens and end % run_tokens == 0)
        if not inside:
            spans.append((c0, end, end - c0 > 1 and single))
            c0 = end
        prev = end
    return spans


def batch_cuts(
    n_tokens: int,
    chunk_tokens: int,
    anchors: Sequence[int] = (),
    tail: int = TAIL_TOKENS,
    tile: int = 0,
) -> list[int]:
    """The ends of the batches a prompt of ``n_tokens`` is prefilled in, cold or not.

    A token's KV depends on the batch it was computed in (DESIGN.md, "Numerics"), so
    every prefill of a prompt uses these same batches, wherever its cached prefix
    ends: one ending at each of ``anchors`` (where a message of the conversation
    starts and where the system prompt ends: a later turn's prompt holds the same
    messages at the same places, so it shares every batch up to its new message), one
    ending ``tail`` tokens before the end, the last ``tail`` tokens together, and
    between those, one every ``chunk_tokens`` from position 0 (see :func:`_inside`
    for ``tile``). Each batch but the last is a chunk the store can keep; a prefix is
    restored only up to the end of one of them.
    """
    if n_tokens <= 0:
        return []
    stop = max(n_tokens - tail, 0)
    hard = {a for a in anchors if 0 < a < stop}
    hard.update(c for c in (stop, n_tokens) if c > 0)
    return sorted(_with_inside(sorted(hard), chunk_tokens, tile))


def _with_inside(hard: Sequence[int], chunk_tokens: int, tile: int) -> set[int]:
    """``hard`` (a prompt's fixed batch ends, sorted) and the ends :func:`_inside`
    puts between them, from position 0."""
    cuts = set(hard)
    for start, end in itertools.pairwise([0, *hard]):
        cuts.update(_inside(start, end, chunk_tokens, tile))
    return cuts


def _inside(start: int, end: int, chunk_tokens: int, tile: int, closed: bool = True) -> list[int]:
    """The batch ends strictly between two of a prompt's fixed ones: every multiple of
    ``chunk_tokens``. With ``tile`` (``Tuning.batch_tile``: a batch of at least that
    many tokens takes llama.cpp's fast tiled path, a shorter one the slow per-row one)
    and chunks of at least twice that, the first and last of them move where the
    batch beside them would be shorter than ``tile``, so a message of ``tile`` tokens
    or more is prefilled in batches of ``tile`` to ``chunk_tokens`` tokens only. They
    move by where the message starts and ends, which a later turn's prompt shares.
    ``closed=False``: ``end`` is only where the tokens known so far stop (the last
    batch's end is still to come): the ends that every longer prompt has."""
    cuts = list(range(chunk_tokens * (start // chunk_tokens + 1), end, chunk_tokens))
    if not (tile and chunk_tokens >= 2 * tile) or not cuts:
        return cuts
    if closed and end - start < 2 * tile:
        return []  # one batch of tile to 2 * tile - 1 tokens (or a shorter message)
    if cuts[0] - start < tile:
        cuts[0] = start + tile
    if not closed:
        return [c for c in cuts if c + tile <= end]
    if end - cuts[-1] < tile:
        cuts[-1] = end - tile
        if len(cuts) > 1 and cuts[-1] - cuts[-2] < tile:
            cuts.pop()  # both moved, too close: one batch of fewer than 2 * tile + tile
    return cuts


def aligned_cuts(
    start: int, end: int, chunk_tokens: int, anchors: Sequence[int] = (), tile: int = 0
) -> list[int]:
    """The batch ends in (start, end] that every longer prompt shares: the anchors,
    and between them (and after the last, as far as it is known) what
    :func:`batch_cuts` puts there. What a finished reply is re-prefilled along."""
    hard = sorted(a for a in anchors if 0 < a <= end)
    cuts = _with_inside(hard, chunk_tokens, tile)
    cuts.update(_inside(hard[-1] if hard else 0, end, chunk_tokens, tile, closed=False))
    if end % chunk_tokens == 0 and not (tile and chunk_tokens >= 2 * tile):
        cuts.add(end)  # (a multiple that may move is no end every longer prompt has)
    return sorted(c for c in cuts if start < c <= end)


def decode_groups(
    have: int, cuts: Sequence[int], chunk_tokens: int, most: int, tile: int = 0
) -> list[list[int]]:
    """The batch ends after ``have``, grouped into decode calls of up to ``most``
    tokens (0: one batch a call), where the machine gives every token the same KV bits
    that way. ``tile`` (``Tuning.batch_tile``): a token's bits depend only on whether
    its batch holds at least ``tile`` tokens, so batches that long go together, and
    shorter ones (but one-token ones, which may take another path) go together below
    ``tile``. Without it: runs of whole aligned chunks together."""
    if not most:
        return [[c] for c in cuts if c > have]
    groups: list[list[int]] = []
    start = prev = have
    kind: str | None = None  # the last group's kind of batch
    for end in (c for c in cuts if c > have):
        size = end - prev
        if tile:
            this = None if size == 1 else "long" if size >= tile else "short"
        else:
            this = "long" if size == chunk_tokens and prev % chunk_tokens == 0 else None
        limit = tile - 1 if this == "short" else most
        if groups and this is not None and this == kind and end - start <= limit:
            groups[-1].append(end)
        else:
            groups.append([end])
            start, kind = prev, this
        prev = end
    return groups


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i
