import itertools

from hypothesis import given
from hypothesis import strategies as st
from warmstart.runtime.kvstore._keys import chunk_key, common_prefix, cut_points, root_key


def test_keys_chain_names_the_whole_prefix() -> None:
    root = root_key("model-a")
    k1 = chunk_key(root, [1, 2, 3])
    assert chunk_key(root, [1, 2, 3]) == k1
    assert chunk_key(k1, [4]) != chunk_key(chunk_key(root, [9, 2, 3]), [4])
    assert root_key("model-b") != root
    assert chunk_key(root_key("model-b"), [1, 2, 3]) != k1


def test_cuts_every_chunk_without_anchor() -> None:
    assert cut_points(600, 256) == [256, 512, 600]
    assert cut_points(512, 256) == [256, 512]
    assert cut_points(10, 256) == [10]
    assert cut_points(0, 256) == []


def test_cuts_fall_on_the_anchor_without_slivers() -> None:
    # a 257-token system prompt: two even parts, not 256 + a 1-token sliver
    assert cut_points(300, 256, anchor=257) == [128, 257, 300]
    assert cut_points(900, 256, anchor=100) == [100, 356, 612, 868, 900]


@given(st.integers(1, 5000), st.integers(16, 512), st.integers(0, 5000))
def test_cuts_are_increasing_bounded_and_end_at_n(n: int, chunk: int, anchor: int) -> None:
    cuts = cut_points(n, chunk, anchor)
    assert cuts[-1] == n
    assert cuts == sorted(set(cuts))
    edges = [0, *cuts]
    assert all(0 < b - a <= chunk for a, b in itertools.pairwise(edges))
    if 0 < anchor <= n:
        assert anchor in cuts


def test_common_prefix() -> None:
    assert common_prefix([1, 2, 3], [1, 2, 4]) == 2
    assert common_prefix([], [1]) == 0
    assert common_prefix([5, 6], [5, 6]) == 2
