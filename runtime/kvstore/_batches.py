"""Batch layout: the batches a prompt is prefilled in, the chunks a store keeps along
them, how much of a computed KV a prompt can reuse, and the batches a finished reply
is re-prefilled in (pure: token ids and positions in, positions out).

A token's KV depends on the batch it was computed in (DESIGN.md, "Numerics"), so a
cached prefix equals a cold prefill only if both computed the same batches. Every rule
about where batches end lives here; the engine, its residents and the pipeline call it.
Chunk keys (hashing the chunks cut here) are ``_keys.py``'s.

Words, each with one meaning: a batch *end* is a position where a batch ends; a
prompt's *cuts* are all its batch ends (:func:`batch_cuts`, the last one its length);
a sequence's *bounds* are the ends of the batches its KV was computed in
(``Resident.bounds``); an *anchor* is a position where a batch must end because a
message starts there (:func:`turn_anchors`); a *span* is a chunk a store keeps
(:func:`chunk_spans`); a *group* is the batches one decode computes together
(:func:`decode_groups`), a *piece* part of one batch (:func:`piece_end`).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

TAIL_TOKENS = 2  # a prompt's last tokens, decoded together (see batch_cuts)
# a short message and the tail after it are one batch up to this many tokens (see _ride)
RIDE_TOKENS = 16
Span = tuple[int, int, bool]  # a stored chunk's positions [start, end), and if stepped


# a prompt's batches ---------------------------------------------------------------------
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
    for ``tile``); but with ``tile`` a short message's tail rides in its batch (see
    :func:`_ride`). Each batch but the last is a chunk the store can keep; a prefix
    is restored only up to the end of one of them.
    """
    if n_tokens <= 0:
        return []
    stop = max(n_tokens - tail, 0)
    hard = {a for a in anchors if 0 < a < stop}
    hard.update(c for c in (stop, n_tokens) if c > 0)
    return sorted(_with_inside(_ride(sorted(hard), tile)[0], chunk_tokens, tile))


def _ride(hard: Sequence[int], tile: int) -> tuple[list[int], bool]:
    """``hard`` (a prompt's fixed batch ends, sorted) without the ends of the batches
    that a tail rides in; and whether its last end would go too, were a tail to follow.

    The tail (the last ``TAIL_TOKENS`` before a reply starts, :func:`turn_anchors`,
    and before a prompt's end) is a batch of its own so that a prompt's last batch is
    small: a restored repeat whose store lacks the logits that batch gave recomputes
    only that one (a live repeat, and a restored one with those logits, decode
    nothing, see :func:`live_prefix`). But a batch shorter than ``tile`` takes llama.cpp's slow
    row-at-a-time path (about a decode step a token on a CPU: 100 ms at 1B), and
    cannot share a decode with the long batch before it (a token's bits depend on
    its batch's kind, see :func:`decode_groups`): another question after the same
    history cost two decodes, the tail's most of the time. So with ``tile`` known, a
    batch of exactly ``TAIL_TOKENS`` between two fixed ends joins the batch before
    it, when that one starts at a fixed end and is longer (a reply's one-token
    batches, and the markup after one, stay apart) and the two hold ``tile`` to
    ``RIDE_TOKENS`` tokens: one tiled batch, one decode, and still a small last
    batch for a restored repeat (16 tiled tokens cost about what 2 untiled ones do
    at 1B). The end after a tail that rode always stays, and whether a tail rides
    depends on the fixed ends up to its own end only, so every later turn (whose
    fixed ends hold this prompt's) cuts the same batches up to there. Without
    ``tile`` (not measured, or no short path) nothing rides: batches as before."""
    out: list[int] = []
    prev, rode, may = 0, False, False
    for i, end in enumerate(hard):
        nxt = hard[i + 1] if i + 1 < len(hard) else end + TAIL_TOKENS
        rides = bool(tile) and not rode and nxt - end == TAIL_TOKENS < end - prev
        rides = rides and tile <= nxt - prev <= RIDE_TOKENS
        if rides and i + 1 < len(hard):
            rode = True
            continue
        out.append(end)
        prev, rode, may = end, False, rides
    return out, may


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
    hard, may = _ride(sorted({a for a in anchors if 0 < a <= end}), tile)
    if may and hard[-1] + TAIL_TOKENS > end:  # a longer prompt's tail may ride there
        cuts = _with_inside(hard[:-1], chunk_tokens, tile)
        return sorted(c for c in cuts if start < c <= end)
    cuts = _with_inside(hard, chunk_tokens, tile)
    cuts.update(_inside(hard[-1] if hard else 0, end, chunk_tokens, tile, closed=False))
    if end % chunk_tokens == 0 and not (tile and chunk_tokens >= 2 * tile):
        cuts.add(end)  # (a multiple that may move is no end every longer prompt has)
    return sorted(c for c in cuts if start < c <= end)


def turn_anchors(
    ids: Sequence[int],
    opener: Sequence[int],
    header: Sequence[int],
    is_control: Callable[[int], bool],
    step_replies: bool = True,
) -> tuple[int, ...]:
    """Where a chat prompt's batches end besides every ``chunk_tokens`` (the anchors of
    :func:`batch_cuts`), from the template's assistant ``opener`` (starting with a
    control token; empty: none) and a user turn's ``header`` (up to its text): where
    each turn but the assistant's opens, and where a user's text starts (another
    question after the same history reuses the markup before it too, as llama-server
    does); the end of each assistant opening and the ``TAIL_TOKENS`` before it (where
    a short message's tail rides in its batch, :func:`batch_cuts` drops that one), so
    the prompt's own last batches are batches of every later turn too, and a repeat
    decodes nothing (the sequence keeps the logits its prompt ended with, see
    :func:`live_prefix`); and with ``step_replies`` every token of a reply, up to the
    control token that closes it. A reply is then prefilled a token at a time, as it
    was decoded, so its KV, live or stored, is what a cold prefill of the next turn
    computes, and the next turn prefills only what follows the reply: its end-of-turn
    markup (one batch), then the new message and its tail. Without ``step_replies`` a
    reply is prefilled in batches, and a finished one is re-prefilled in them in the
    background (:func:`reply_plan`)."""
    if not opener:
        return ()
    n, out = len(opener), set[int]()
    starts = [i for i, token in enumerate(ids) if token == opener[0]]
    for k, i in enumerate(starts):
        if list(ids[i : i + n]) != list(opener):
            out.update((i,) if i else ())
            if i and header and list(ids[i : i + len(header)]) == list(header):
                out.add(i + len(header))
            continue
        c = i + n  # where the reply starts
        out.update(x for x in (c - TAIL_TOKENS, c) if x > 0)
        if not step_replies:
            continue
        nxt = starts[k + 1] if k + 1 < len(starts) else len(ids)
        end = next((p for p in range(c, nxt) if is_control(ids[p])), nxt)
        out.update(range(c + 1, end + 1))
    return tuple(sorted(out))


# decodes ----------------------------------------------------------------------------------
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


def piece_end(begun: int, have: int, ends: Sequence[int], tile: int, piece: int) -> int:
    """Where the next decode of a prompt stops, ``have`` tokens in: the end of the
    group ``ends`` (see :func:`decode_groups`); but with ``piece`` (the scheduler's
    choice: a client waits that would go first) a batch of the long kind (one that
    began at ``begun`` and holds at least ``tile`` tokens) goes in pieces of about
    ``piece`` tokens, each of at least ``tile``: every token then takes the tiled path
    it takes in the whole batch, with the same KV bits, and the worker turns to the
    others between pieces instead of after a whole chunk."""
    if not (piece and tile) or ends[0] - begun < tile:
        return ends[-1]
    stop = have + max(piece, tile)
    return stop if ends[0] - stop >= tile else ends[-1]


def next_decode(
    begun: int,
    have: int,
    cuts: Sequence[int],
    chunk_tokens: int,
    tile: int,
    most: int,
    piece: int = 0,
) -> tuple[int, list[int]]:
    """The next decode of a prompt with batch ends ``cuts``, ``have`` tokens in, the
    batch in progress begun at ``begun`` (a piece of it may be in): where it stops, and
    the batch ends it completes (``[]``: a piece, which ends no batch). ``most`` and
    ``piece``: as :func:`decode_groups` and :func:`piece_end` take them."""
    ends = decode_groups(begun, cuts, chunk_tokens, most, tile)[0]
    stop = piece_end(begun, have, ends, tile, piece)
    return stop, (ends if stop == ends[-1] else [])


# stored chunks ----------------------------------------------------------------------------
def chunk_spans(ends: Sequence[int], start: int = 0, run_tokens: int = 0) -> list[Span]:
    """The chunks a store keeps along batch ``ends`` (from position ``start``): one per
    batch, but a run of one-token batches (a reply, decoded a token at a time, and
    what a prefill steps through the same way, see :func:`turn_anchors`) is one
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


def chunk_ends(cuts: Sequence[int], run_tokens: int = 0) -> set[int]:
    """Where the chunks a store keeps along batch ends ``cuts`` end (from 0)."""
    return {end for _, end, _ in chunk_spans(cuts, 0, run_tokens)}


# reuse --------------------------------------------------------------------------------
def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def ends_through(ends: Sequence[int], n: int) -> list[int]:
    """The batch ends of ``ends`` up to position ``n``: the batches of its first ``n``
    tokens, when ``n`` is one of them."""
    return [e for e in ends if e <= n]


def reusable(
    bounds: Sequence[int], held: Sequence[int], ids: Sequence[int], cuts: Sequence[int]
) -> int:
    """How much of a KV computed in batches ending at ``bounds`` (over tokens ``held``)
    a prompt ``ids`` prefilled in batches ending at ``cuts`` can keep: the longest run
    of identical batches over identical tokens."""
    same = common_prefix(held, ids)
    usable = 0
    for mine, theirs in zip(bounds, cuts, strict=False):
        if mine != theirs or mine > same:
            break
        usable = mine
    return usable


def live_prefix(
    bounds: Sequence[int],
    held: Sequence[int],
    ids: Sequence[int],
    cuts: Sequence[int],
    logits_at: int | None = None,
) -> int:
    """How much of a prompt ``ids`` (batch ends ``cuts``, the last one ``len(ids)``) a
    live sequence holding ``held`` (in batches ending at ``bounds``) holds for it. The
    last batch is recomputed for its logits, unless the sequence kept those its KV
    gave at ``logits_at`` and that is this very prompt's end: then the whole of it."""
    if logits_at is not None and logits_at == len(ids):
        whole = reusable(bounds, held, ids, cuts)
        if whole == len(ids):
            return whole
    return reusable(bounds, held, ids, cuts[:-1])


# a finished reply -------------------------------------------------------------------------
# the most one-token decodes that close a reply for the next turn (ReplyPlan.closing)
CLOSING_TOKENS = 2


@dataclass(frozen=True)
class ReplyPlan:
    """How a sequence that holds a prompt and its reply becomes the next turn's prompt
    ``target`` (up to its new message): the first ``reused`` tokens stay as computed,
    then ``target`` is prefilled along the batch ends ``cuts``. ``closing``: a reply
    that max_tokens cut ends with a token sampled but never decoded, and the next turn
    steps through it as one of the reply's one-token batches, which a store keeps as
    one chunk up to the run's end; without it the chunk kept would be another one, and
    the next turn would restore only up to the reply's start. So where that run ends,
    when at most ``CLOSING_TOKENS`` decodes hold it (None: nothing to close): the
    token never decoded, and the end-of-turn token where it is a batch of its own (a
    template whose next turn opens right after it, as Llama 3's does)."""

    target: list[int]
    reused: int
    cuts: list[int]
    closing: int | None


def reply_plan(
    bounds: Sequence[int],
    held: Sequence[int],
    target: Sequence[int],
    cuts: Sequence[int],
    prompt_tokens: int,
) -> ReplyPlan:
    """The :class:`ReplyPlan` of a sequence holding ``held`` in batches ending at
    ``bounds`` (a prompt of ``prompt_tokens`` and its reply), for the next turn's
    prompt ``target`` with batch ends ``cuts``."""
    reused = reusable(bounds, held, target, cuts)
    rest = [c for c in cuts if c > reused]
    run = reused  # the end of the one-token batches that follow what is reused
    for end in rest:
        if end != run + 1:
            break
        run = end
    closes = reused >= prompt_tokens and reused < run <= reused + CLOSING_TOKENS
    return ReplyPlan(list(target), reused, rest, run if closes else None)
