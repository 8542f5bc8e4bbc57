"""The state-blob codec on blobs built here, in llama.cpp's layout (no model needed)."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from warmstart.runtime.engine import _kvblob
from warmstart.runtime.errors import EngineError

MAGIC = _kvblob.STATE_SEQ_MAGIC


def cache_section(
    n_stream: int, stream: int, pos: list[int], layers: int, k_row: int, v: tuple[bool, int, int]
) -> bytes:
    """One KV cache's part of a sequence blob, its cells in stream ``stream``."""
    v_trans, v_size, n_embd = v
    out = [struct.pack("<I", n_stream)]
    for s in range(n_stream):
        if s != stream:
            out.append(struct.pack("<I", 0))
            continue
        n = len(pos)
        out.append(struct.pack("<I", n))
        out += [struct.pack("<iIi", p, 1, stream) for p in pos]
        out.append(struct.pack("<II", int(v_trans), layers))
        for layer in range(layers):
            out.append(struct.pack("<iQ", 1, k_row))
            out += [bytes([(p * 7 + layer + j) % 251 for j in range(k_row)]) for p in pos]
        for layer in range(layers):
            if v_trans:
                out.append(struct.pack("<iII", 1, v_size, n_embd))
                for d in range(n_embd):
                    out += [
                        bytes([(p + 3 * d + layer + j) % 241 for j in range(v_size)]) for p in pos
                    ]
            else:
                out.append(struct.pack("<iQ", 1, v_size))
                out += [bytes([(p * 5 + layer + j) % 239 for j in range(v_size)]) for p in pos]
    return b"".join(out)


def blob(
    n: int, n_stream: int = 3, stream: int = 1, v_trans: bool = False, caches: int = 1
) -> np.ndarray:
    v = (True, 2, 3) if v_trans else (False, 6, 1)
    body = b"".join(cache_section(n_stream, stream, list(range(n)), 2, 4, v) for _ in range(caches))
    return np.frombuffer(struct.pack("<Ii", MAGIC, stream) + body, dtype=np.uint8).copy()


@pytest.mark.parametrize("v_trans", [False, True])
@pytest.mark.parametrize("caches", [1, 2])
def test_chunks_of_a_blob_assemble_into_the_same_cells(v_trans: bool, caches: int) -> None:
    whole = blob(10, v_trans=v_trans, caches=caches)
    layout, views = _kvblob.parse(whole, n_layer=2, n_caches=caches)
    chunks = []
    for c0, c1 in ((0, 4), (4, 8), (8, 10)):
        out = np.empty(layout.chunk_bytes(c1 - c0), dtype=np.uint8)
        assert _kvblob.cut(views, layout, c0, c1, out) == out.nbytes
        chunks.append(out)
    # into a context with another number of streams, the cells in its first stream
    other = _kvblob.BlobLayout(5, layout.caches)
    dest = np.empty(_kvblob.assembled_bytes(other, 10), dtype=np.uint8)
    size = _kvblob.assemble(chunks, other, dest)
    expected = blob(10, n_stream=5, stream=4, v_trans=v_trans, caches=caches)
    again, again_views = _kvblob.parse(dest[:size], n_layer=2, n_caches=caches)
    want_layout, want_views = _kvblob.parse(expected, n_layer=2, n_caches=caches)
    assert again == want_layout
    for got, want in zip(again_views, want_views, strict=True):
        for a, b in zip(
            (got.meta[:, :4], *got.k, *got.v), (want.meta[:, :4], *want.k, *want.v), strict=True
        ):
            np.testing.assert_array_equal(a, b)


def test_a_prefix_of_the_chunks_is_a_shorter_conversation() -> None:
    layout, views = _kvblob.parse(blob(8), n_layer=2, n_caches=1)
    first = np.empty(layout.chunk_bytes(4), dtype=np.uint8)
    _kvblob.cut(views, layout, 0, 4, first)
    dest = np.empty(_kvblob.assembled_bytes(layout, 4), dtype=np.uint8)
    size = _kvblob.assemble([first], layout, dest)
    _, short = _kvblob.parse(dest[:size], n_layer=2, n_caches=1)
    assert list(_kvblob.positions(short[0])) == [0, 1, 2, 3]
    np.testing.assert_array_equal(short[0].k[1], views[0].k[1][:4])


def test_bad_input_is_an_engine_error() -> None:
    with pytest.raises(EngineError):
        _kvblob.parse(blob(4)[:-3], n_layer=2, n_caches=1)
    layout, views = _kvblob.parse(blob(4), n_layer=2, n_caches=1)
    out = np.empty(layout.chunk_bytes(2), dtype=np.uint8)
    with pytest.raises(EngineError):  # positions 5..6 are not in the state
        _kvblob.cut(views, layout, 5, 7, out)
    _kvblob.cut(views, layout, 0, 2, out)
    foreign = _kvblob.BlobLayout(
        layout.n_stream, (layout.caches[0].__class__(12, True, 2, ((1, 4),) * 2, ((1, 2, 3),) * 2),)
    )
    with pytest.raises(EngineError):  # a chunk of another layout never loads
        _kvblob.assemble([out], foreign, np.empty(1 << 16, dtype=np.uint8))
