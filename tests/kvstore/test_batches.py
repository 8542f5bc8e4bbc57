"""The batches a prompt is prefilled in, over plain lists (runtime/kvstore/_batches.py):
cuts, anchors, decodes and pieces, and the chunks a store keeps along them."""

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st
from warmstart.runtime.kvstore._batches import (
    aligned_cuts,
    batch_cuts,
    chunk_ends,
    chunk_spans,
    decode_groups,
    ends_through,
    next_decode,
    piece_end,
    turn_anchors,
)


def test_batches_are_aligned_from_zero_with_the_last_two_tokens_apart() -> None:
    assert batch_cuts(600, 256) == [256, 512, 598, 600]
    assert batch_cuts(514, 256) == [256, 512, 514]
    assert batch_cuts(10, 256) == [8, 10]
    assert batch_cuts(2, 256) == [2]
    assert batch_cuts(0, 256) == []


def test_a_system_prompt_ends_a_batch() -> None:
    assert batch_cuts(300, 128, anchors=(100,)) == [100, 128, 256, 298, 300]
    assert batch_cuts(300, 128, anchors=(299,)) == [128, 256, 298, 300]  # inside the tail


@given(st.integers(1, 5000), st.integers(16, 512), st.integers(0, 5000), st.integers(1, 400))
def test_a_longer_prompt_shares_every_aligned_batch(
    n: int, chunk: int, anchor: int, more: int
) -> None:
    cuts = batch_cuts(n, chunk, (anchor,))
    assert cuts[-1] == n and cuts == sorted(set(cuts))
    assert all(0 < b - a <= chunk for a, b in itertools.pairwise([0, *cuts]))
    longer = batch_cuts(n + more, chunk, (anchor,))
    shared = [c for c in cuts[:-1] if c % chunk == 0 or c == anchor < n - 2]
    assert set(shared) <= set(longer)


def test_every_message_start_ends_a_batch_and_a_later_turn_shares_them() -> None:
    turn1 = batch_cuts(300, 128, anchors=(40, 120, 297))  # system ends at 40
    assert turn1 == [40, 120, 128, 256, 297, 298, 300]
    # turn 2 holds turn 1's messages (and the reply, up to 340) at the same places
    turn2 = batch_cuts(420, 128, anchors=(40, 120, 297, 340))
    assert [c for c in turn1 if c <= 297] == [c for c in turn2 if c <= 297]
    assert 340 in turn2


def test_a_multiple_inside_the_tail_ends_a_batch_as_in_the_next_turn() -> None:
    """The next turn's prompt has every multiple below its own tail, so this prompt's
    tail is cut there too: its last batches are the next turn's."""
    assert batch_cuts(129, 128) == [127, 128, 129]
    turn2 = batch_cuts(200, 128, anchors=(127, 129))
    assert [c for c in turn2 if c <= 129] == [127, 128, 129]


def test_a_run_of_one_token_batches_is_kept_as_one_chunk() -> None:
    # a prompt batch, the opener's tail, a reply stepped a token at a time to 12, more
    ends = [4, 6, 7, 8, 9, 10, 11, 12, 20]
    assert chunk_spans(ends) == [
        (0, 4, False),
        (4, 6, False),
        (6, 12, True),
        (12, 20, False),
    ]
    # runs are cut where a multiple of run_tokens falls, so a chunk stays small
    assert chunk_spans(ends, run_tokens=8)[2:4] == [(6, 8, True), (8, 12, True)]
    # a prefix of the same ends gives the same chunks up to where it stops
    assert chunk_spans([4, 6]) == chunk_spans(ends)[:2]
    # from a later start (a store that continues a prefix)
    assert chunk_spans([7, 8, 15], start=6) == [(6, 8, True), (8, 15, False)]
    # a single one-token batch between larger ones is a batch of its own
    assert chunk_spans([4, 5, 9]) == [(0, 4, False), (4, 5, False), (5, 9, False)]


def test_a_reply_is_re_prefilled_along_the_aligned_batches() -> None:
    assert aligned_cuts(256, 700, 256) == [512]
    assert aligned_cuts(100, 700, 256, anchors=(300,)) == [256, 300, 512]
    assert aligned_cuts(512, 600, 256) == []


def test_whole_chunks_are_merged_only_where_allowed() -> None:
    cuts = batch_cuts(600, 64, anchors=(100,))  # 64, 100, 128, ..., 576, 598, 600
    assert decode_groups(0, cuts, 64, 0) == [[c] for c in cuts]
    groups = decode_groups(0, cuts, 64, 256)
    assert groups[:3] == [[64], [100], [128]]  # the anchor splits two chunks
    assert groups[3:5] == [[192, 256, 320, 384], [448, 512, 576]]
    assert groups[5:] == [[598], [600]]
    assert [c for g in groups for c in g] == cuts
    assert decode_groups(320, cuts, 64, 256)[0] == [384, 448, 512, 576]


def test_batches_of_one_kind_are_merged_where_kinds_are_all_that_counts() -> None:
    # a system prompt to 317 (64-token chunks, then 61 tokens), a question, the tail
    cuts = [64, 128, 192, 256, 317, 320, 330, 332]
    groups = decode_groups(0, cuts, 64, 512, tile=64)
    assert groups == [[64, 128, 192, 256], [317], [320, 330, 332]]
    # long batches go together whether aligned or not, up to most
    assert decode_groups(0, [70, 200, 300, 301], 128, 256, tile=64) == [[70, 200], [300], [301]]
    # short ones stay below the tile, and a one-token batch stays alone
    assert decode_groups(0, [40, 60, 61, 63, 90], 128, 512, tile=64) == [[40, 60], [61], [63, 90]]
    assert decode_groups(317, cuts, 64, 512, tile=64) == [[320, 330, 332]]
    # merging off: one batch a call, kinds or not
    assert decode_groups(0, cuts, 64, 0, tile=64) == [[c] for c in cuts]


def test_with_a_tile_every_batch_of_a_long_message_is_at_least_a_tile_long() -> None:
    # a system prompt to 317, a question to 330, the tail: 256 moves back to 253
    assert batch_cuts(332, 128, (317, 330), tile=64) == [128, 253, 317, 330, 332]
    # a message from 330 to 700: its first batch ends at 394, not at 384, its last
    # starts at 636, not at 640
    assert batch_cuts(702, 128, (330, 700), tile=64)[2:] == [330, 394, 512, 636, 700, 702]
    # both ends moved, too close together: the last one goes
    assert batch_cuts(272, 128, (100, 270), tile=64) == [100, 164, 270, 272]
    # chunks shorter than two tiles: the multiples stay where they are
    assert batch_cuts(332, 64, (317, 330), tile=64) == batch_cuts(332, 64, (317, 330))


@given(
    st.integers(1, 3000),
    st.sampled_from([128, 256, 512]),
    st.lists(st.integers(1, 3000), max_size=6),
    st.integers(3, 600),
)
def test_with_a_tile_batches_fit_a_chunk_and_a_later_turn_shares_them(
    n: int, chunk: int, anchors: list[int], more: int
) -> None:
    tile = 64
    mine = [a for a in anchors if a < n - 2]  # (a chat prompt has none inside its tail)
    cuts = batch_cuts(n, chunk, mine, tile=tile)
    hard = {a for a in mine if 0 < a < n - 2} | {max(n - 2, 0), n}
    for a, b in itertools.pairwise([0, *cuts]):
        assert 0 < b - a <= chunk
        inside = not any(a < h < b for h in hard)
        assert inside
        if a not in hard or b not in hard:  # a batch a multiple ends or starts
            seg = [h for h in sorted(hard | {0}) if h <= a][-1], min(h for h in hard if h >= b)
            assert b - a >= tile or seg[1] - seg[0] < tile, (a, b, seg)
    # the next turn holds this prompt's messages, its tail's two ends among its anchors
    later = batch_cuts(n + more, chunk, [*mine, max(n - 2, 0), n], tile=tile)
    assert [c for c in later if c <= n] == cuts
    # a raw completion's prompt and reply are re-prefilled along the ends that every
    # longer prompt with the same anchors has
    settled = aligned_cuts(0, n, chunk, mine, tile=tile)
    assert set(settled) <= set(batch_cuts(n + more, chunk, mine, tile=tile))


@given(
    st.integers(0, 2000),
    st.integers(1, 1500),
    st.integers(1, 1500),
    st.sampled_from([64, 128, 256]),
    st.sampled_from([0, 32]),
    st.lists(st.integers(1, 2000), max_size=5),
    st.lists(st.integers(1, 4000), max_size=5),
)
def test_cuts_up_to_a_message_start_depend_only_on_what_comes_before_it(
    d: int, more_a: int, more_b: int, chunk: int, tile: int, before: list[int], after: list[int]
) -> None:
    """Two prompts that agree up to ``d``, where a message starts in both (a new
    question, or a branch), are cut alike up to there, whatever follows: increasing
    batch ends, the last one the prompt's length, none longer than a chunk."""
    shared = [a for a in before if a < d]
    a = batch_cuts(d + more_a + 2, chunk, [*shared, d, *(d + x for x in after)], tile=tile)
    b = batch_cuts(d + more_b + 2, chunk, [*shared, d], tile=tile)
    for cuts, n in ((a, d + more_a + 2), (b, d + more_b + 2)):
        assert cuts == sorted(set(cuts)) and cuts[-1] == n
        assert all(0 < y - x <= chunk for x, y in itertools.pairwise([0, *cuts]))
    assert ends_through(a, d) == ends_through(b, d)
    assert d == 0 or d in a


# a ChatML-like vocabulary: 1 opens a turn, 9 closes one (both control tokens)
OPENER, HEADER = [1, 2, 3], [1, 4, 3]  # "<|im_start|>assistant\n", "<|im_start|>user\n"
SYSTEM, USER = [1, 5, 3, 10, 11, 9, 3], [1, 4, 3, 12, 13, 9, 3]
REPLY = [20, 21, 22, 9, 3]  # three tokens, then the end of the turn


def _control(token: int) -> bool:
    return token in (1, 9)


def test_turns_end_batches_and_a_reply_is_stepped_a_token_at_a_time() -> None:
    turn1 = [*SYSTEM, *USER, *OPENER]
    # the user turn opens at 7, its text at 10; the opening's tail: 15, 17
    assert turn_anchors(turn1, OPENER, HEADER, _control) == (7, 10, 15, 17)
    turn2 = [*turn1, *REPLY, 1, 4, 3, 30, 9, 3, *OPENER]
    # the reply (17 to 20) a token at a time, up to its closing token
    assert turn_anchors(turn2, OPENER, HEADER, _control) == (
        *(7, 10, 15, 17, 18, 19, 20),
        *(22, 25, 29, 31),
    )
    unstepped = turn_anchors(turn2, OPENER, HEADER, _control, step_replies=False)
    assert unstepped == (7, 10, 15, 17, 22, 25, 29, 31)
    # no assistant opening that starts with a control token: no anchors
    assert turn_anchors(turn2, [], HEADER, _control) == ()


def test_a_stepped_reply_is_one_chunk_and_the_next_turn_shares_every_batch_before_it() -> None:
    turn1 = [*SYSTEM, *USER, *OPENER]
    turn2 = [*turn1, *REPLY, 1, 4, 3, 30, 9, 3, *OPENER]
    cuts1 = batch_cuts(len(turn1), 8, turn_anchors(turn1, OPENER, HEADER, _control))
    cuts2 = batch_cuts(len(turn2), 8, turn_anchors(turn2, OPENER, HEADER, _control))
    assert cuts1 == [7, 8, 10, 15, 16, 17]
    assert ends_through(cuts2, len(turn1)) == cuts1
    # the opening's last tokens and the reply's three, one-token batches: one chunk
    assert (15, 20, True) in chunk_spans(cuts2)


def test_a_long_batch_goes_in_pieces_of_at_least_a_tile_only_when_asked() -> None:
    cuts = batch_cuts(600, 256, tile=64)
    assert cuts == [256, 512, 598, 600]
    assert next_decode(0, 0, cuts, 256, 64, most=0) == (256, [256])
    assert next_decode(0, 0, cuts, 256, 64, most=0, piece=64) == (64, [])
    assert next_decode(0, 128, cuts, 256, 64, most=0, piece=64) == (192, [])
    # the last piece would leave less than a tile: the batch ends with it
    assert next_decode(0, 192, cuts, 256, 64, most=0, piece=64) == (256, [256])
    assert piece_end(0, 0, [256], 64, 100) == 100
    assert piece_end(0, 0, [256], 0, 100) == 256  # no tile known: never in pieces
    assert piece_end(512, 512, [598], 64, 64) == 598  # shorter than two tiles
    # merged whole chunks: the group ends with the first batch's last piece
    assert next_decode(0, 192, [256, 512, 600], 256, 64, most=512, piece=64) == (512, [256, 512])


@given(
    st.integers(1, 3000),
    st.sampled_from([128, 256]),
    st.lists(st.integers(1, 3000), max_size=5),
    st.sampled_from([0, 64]),
    st.sampled_from([0, 256, 512]),
    st.lists(st.sampled_from([0, 64, 100]), min_size=1, max_size=8),
)
def test_decodes_in_pieces_or_groups_complete_exactly_the_prompts_batches(
    n: int, chunk: int, anchors: list[int], tile: int, most: int, pieces: list[int]
) -> None:
    cuts = batch_cuts(n, chunk, anchors, tile=tile)
    have = begun = 0
    done: list[int] = []
    for step in itertools.count():
        if have == n:
            break
        piece = pieces[step % len(pieces)]  # contended at some steps, not at others
        stop, bound = next_decode(begun, have, cuts, chunk, tile, most, piece)
        assert stop > have
        if not bound:  # a piece: at least a tile, and at least a tile left of its batch
            nxt = min(c for c in cuts if c > begun)
            assert stop - have >= tile and nxt - stop >= tile
        have = stop
        done += bound
        begun = done[-1] if done else 0
    assert done == cuts


def test_chunk_ends_and_the_batches_up_to_a_position() -> None:
    assert chunk_ends([4, 6, 7, 8, 9, 10, 11, 12, 20]) == {4, 6, 12, 20}
    assert chunk_ends([4, 6, 7, 8, 9, 10, 11, 12, 20], run_tokens=8) == {4, 6, 8, 12, 20}
    assert ends_through([4, 8, 12], 8) == [4, 8]
    assert ends_through([4, 8, 12], 3) == []


def test_with_a_tile_a_short_messages_tail_rides_in_its_batch() -> None:
    """A system prompt to 317, the user's turn markup to 320, a question and the
    assistant's opening to 332, its last two tokens the tail: with a tile of 8 the
    question and its tail are one batch (one tiled decode, not a tiled one and an
    untiled one), when the two hold 8 to 16 tokens."""
    anchors = (317, 320, 330, 332)
    assert batch_cuts(332, 128, anchors, tile=8)[-3:] == [317, 320, 332]
    assert decode_groups(320, batch_cuts(332, 128, anchors, tile=8), 128, 512, 8) == [[332]]
    # before (no tile known) and with a tile too long for it: the tail stays apart
    assert batch_cuts(332, 128, anchors)[-3:] == [320, 330, 332]
    assert batch_cuts(332, 128, anchors, tile=64)[-3:] == [320, 330, 332]
    assert decode_groups(320, batch_cuts(332, 128, anchors), 128, 512, 8) == [[330], [332]]
    # a longer question keeps its tail apart (a restored repeat recomputes 2 tokens)
    assert batch_cuts(352, 128, (317, 320, 350, 352), tile=8)[-3:] == [320, 350, 352]
    # and so does a question shorter than a tile with it (two short batches share a
    # decode anyway)
    assert batch_cuts(325, 128, (317, 320, 323, 325), tile=8)[-3:] == [320, 323, 325]


def test_a_tail_that_rode_is_cut_alike_in_the_next_turn() -> None:
    """The next turn's prompt holds the question, its opening's two ends, the reply a
    token at a time, its end-of-turn markup (two tokens), the next turn's markup, and
    its own question and tail: it shares every batch up to the reply's start, and
    the reply's one-token batches and the markup after them ride nowhere."""
    turn1 = batch_cuts(332, 128, (317, 320, 330, 332), tile=8)
    stepped = range(333, 341)  # the reply's tokens, the last one its end-of-turn token
    anchors = (317, 320, 330, 332, *stepped, 342, 345, 355, 357)
    turn2 = batch_cuts(357, 128, anchors, tile=8)
    assert ends_through(turn2, 332) == turn1
    assert turn2[turn2.index(332) :] == [332, *stepped, 342, 345, 357]
    # stepped replies and the markup after one stay apart, tail or not
    cuts = batch_cuts(344, 128, (317, 320, 330, 332, 333, 334, 336, 338), tile=8)
    assert cuts[-7:] == [332, 333, 334, 336, 338, 342, 344]
    # the end after a tail that rode stays, even with a tail's length after it
    cuts = batch_cuts(340, 128, (317, 320, 330, 332, 334), tile=8)
    assert cuts[-5:] == [320, 332, 334, 338, 340]


@settings(deadline=None)  # (a loaded machine: its cases are cheap, their timing is not)
@given(
    st.integers(3, 2500),
    st.sampled_from([64, 128, 256]),
    st.lists(st.integers(1, 2500), max_size=6),
    st.integers(0, 12),
    st.lists(st.integers(1, 40), max_size=6),
)
def test_with_a_tile_of_8_a_later_prompt_shares_every_batch_before_its_new_part(
    n: int, chunk: int, anchors: list[int], stepped: int, after: list[int]
) -> None:
    """Whatever rides: a chat prompt (its tail's two ends among its anchors) and the
    next turn's (its anchors, a reply stepped through, more anchors after it) are cut
    alike up to the prompt's end; every batch fits a chunk; and what ``aligned_cuts``
    gives for the prompt as far as it is known is cut so by every longer prompt."""
    tile, mine = 8, sorted({a for a in anchors if a < n - 2} | {n - 2, n})
    cuts = batch_cuts(n, chunk, mine, tile=tile)
    assert cuts[-1] == n and all(0 < b - a <= chunk for a, b in itertools.pairwise([0, *cuts]))
    reply = [n + k for k in range(1, stepped + 1)]
    later = [*reply, *(n + stepped + x for x in itertools.accumulate(after))]
    longer = later[-1] + 5 if later else n + 5
    assert ends_through(batch_cuts(longer, chunk, [*mine, *later], tile=tile), n) == cuts
    end = n + stepped  # a raw completion and its reply, re-prefilled along these
    settled = aligned_cuts(0, end, chunk, mine, tile=tile)
    extra = [end + x for x in itertools.accumulate(after)]
    other = batch_cuts((extra or [end])[-1] + 3, chunk, [*mine, *extra], tile=tile)
    assert set(settled) <= set(other), (settled, other)
