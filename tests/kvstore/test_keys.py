from warmstart.runtime.kvstore._keys import chunk_key, root_key


def test_keys_chain_names_the_whole_prefix() -> None:
    root = root_key("model-a")
    k1 = chunk_key(root, [1, 2, 3])
    assert chunk_key(root, [1, 2, 3]) == k1
    assert chunk_key(k1, [4]) != chunk_key(chunk_key(root, [9, 2, 3]), [4])
    assert root_key("model-b") != root
    assert chunk_key(root_key("model-b"), [1, 2, 3]) != k1


def test_a_stepped_chunk_has_its_own_key() -> None:
    root = root_key("m")
    assert chunk_key(root, [1, 2], stepped=True) != chunk_key(root, [1, 2])
