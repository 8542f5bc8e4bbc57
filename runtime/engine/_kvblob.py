"""llama.cpp's sequence-state blob, cut into chunks and put back together (pure: numpy only).

With one KV stream per conversation (``kv_unified=false``), a conversation's cells sit
at the start of its own stream in token order, and ``llama_state_seq_get_data`` writes
(src/llama-context.cpp ``state_seq_get_data``, src/llama-kv-cache.cpp ``state_write``)
u32 magic (0xaf143cd8), i32 seq_id, then for each KV cache of the model (one, or two
for SWA models: the base cache then the SWA cache):

    u32 n_stream; then per stream: u32 cell_count, and when it is not 0:
        per cell: i32 pos, u32 n_seq_id (1), [12-byte cell ext], i32 seq_id
        u32 v_trans, u32 n_layer
        per layer: i32 K type, u64 K row bytes, the K rows of all cells
        per layer: i32 V type, u64 V row bytes, the V rows      (v_trans == 0)
               or: i32 V type, u32 element bytes, u32 n_embd_v,
                   per V dimension the elements of all cells     (v_trans == 1)

So the KV of cells [c0, c1) is their metadata plus a slice of every layer's rows:
:func:`cut` takes that slice into a *chunk* (our own format, independent of how many
streams the context has), :func:`assemble` concatenates chunks into a blob that
``llama_state_seq_set_data`` loads into any stream of a context of the same model.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import EngineError

CHUNK_MAGIC = b"WSKV"
CHUNK_VERSION = 1
_CHUNK_HEADER = struct.Struct("<4sHHI8s")  # magic, version, reserved, n_cells, layout id
CELL_EXT_BYTES = 12  # llama_kv_cell_ext: x, y, tok
STATE_SEQ_MAGIC = 0xAF143CD8  # llama-context.cpp io_magic


@dataclass(frozen=True)
class CacheLayout:
    """The per-cell shape of one KV cache in the blob (a model has one, SWA models two)."""

    meta_bytes: int  # per cell
    v_trans: bool
    n_layer: int
    k: tuple[tuple[int, int], ...]  # per layer: (ggml type, row bytes)
    v: tuple[tuple[int, int, int], ...]  # per layer: (type, row or element bytes, n_embd_v)

    @property
    def cell_bytes(self) -> int:
        v = sum(size * (n if self.v_trans else 1) for _, size, n in self.v)
        return self.meta_bytes + sum(size for _, size in self.k) + v


@dataclass(frozen=True)
class BlobLayout:
    """Everything about a blob but its cells: what chunks of a model have in common."""

    n_stream: int
    caches: tuple[CacheLayout, ...]

    @property
    def cell_bytes(self) -> int:
        return sum(c.cell_bytes for c in self.caches)

    @property
    def ident(self) -> bytes:
        """Names the layout (not the stream count): a chunk restores only into its own."""
        return hashlib.blake2b(repr(self.caches).encode(), digest_size=8).digest()

    def chunk_bytes(self, n_cells: int) -> int:
        return _CHUNK_HEADER.size + n_cells * self.cell_bytes


@dataclass(frozen=True)
class _CacheView:
    layout: CacheLayout
    n_cells: int
    meta: np.ndarray  # (n_cells, meta_bytes)
    k: tuple[np.ndarray, ...]  # per layer (n_cells, row bytes)
    v: tuple[np.ndarray, ...]  # per layer (n_cells, row) or (n_embd_v, n_cells, el)


class _Reader:
    def __init__(self, buf: np.ndarray) -> None:
        self.buf, self.at = buf, 0

    def take(self, n: int) -> np.ndarray:
        if self.at + n > self.buf.size:
            raise ValueError("blob ends early")
        out = self.buf[self.at : self.at + n]
        self.at += n
        return out

    def u32(self) -> int:
        return int(self.take(4).view("<u4")[0])

    def i32(self) -> int:
        return int(self.take(4).view("<i4")[0])

    def u64(self) -> int:
        return int(self.take(8).view("<u8")[0])


def _parse_cache(r: _Reader, n_layer: int, ext: bool) -> tuple[int, _CacheView | None]:
    n_stream = r.u32()
    view = None
    for _ in range(n_stream):
        cells = r.u32()
        if cells == 0:
            continue
        if view is not None:
            raise ValueError("cells in more than one stream")
        view = _parse_stream(r, cells, n_layer, ext)
    return n_stream, view


def _parse_stream(r: _Reader, cells: int, n_layer: int, ext: bool) -> _CacheView:
    meta_bytes = 12 + (CELL_EXT_BYTES if ext else 0)
    meta = r.take(cells * meta_bytes).reshape(cells, meta_bytes)
    v_trans, layers = r.u32(), r.u32()
    if v_trans not in (0, 1) or not 0 < layers <= n_layer:  # SWA models split the layers
        raise ValueError("not a layer table")
    k_layout: list[tuple[int, int]] = []
    k_rows: list[np.ndarray] = []
    for _ in range(layers):
        kind, row = r.i32(), r.u64()
        k_layout.append((kind, row))
        k_rows.append(r.take(cells * row).reshape(cells, row))
    v_layout: list[tuple[int, int, int]] = []
    v_rows: list[np.ndarray] = []
    for _ in range(layers):
        kind = r.i32()
        if v_trans:
            el, n_embd = r.u32(), r.u32()
            v_layout.append((kind, el, n_embd))
            v_rows.append(r.take(n_embd * cells * el).reshape(n_embd, cells, el))
        else:
            row = r.u64()
            v_layout.append((kind, row, 1))
            v_rows.append(r.take(cells * row).reshape(cells, row))
    layout = CacheLayout(meta_bytes, bool(v_trans), layers, tuple(k_layout), tuple(v_layout))
    return _CacheView(layout, cells, meta, tuple(k_rows), tuple(v_rows))


def parse(blob: np.ndarray, n_layer: int, n_caches: int) -> tuple[BlobLayout, list[_CacheView]]:
    """Reads a one-sequence blob of a model with ``n_layer`` layers and ``n_caches`` KV
    caches. Whether cells carry an ext is not written in the blob: the reading that
    consumes every byte is the right one. Raises EngineError on anything else."""
    errors = []
    for ext in (False, True):
        r = _Reader(blob)
        try:
            if r.u32() != STATE_SEQ_MAGIC:
                raise ValueError("no sequence state magic")
            r.i32()  # the sequence it came from: set_data ignores it
            parts = [_parse_cache(r, n_layer, ext) for _ in range(n_caches)]
            if r.at != blob.size:
                raise ValueError(f"{blob.size - r.at} bytes left over")
        except ValueError as exc:
            errors.append(str(exc))
            continue
        views = [view for _, view in parts if view is not None]
        if len(views) not in (0, n_caches):
            raise EngineError("the KV caches of the blob hold different sequences")
        layout = BlobLayout(parts[0][0], tuple(v.layout for v in views))
        return layout, views
    raise EngineError(f"not a KV state blob llama.cpp wrote: {'; '.join(errors)}")


def positions(view: _CacheView) -> np.ndarray:
    return view.meta[:, :4].copy().view("<i4").reshape(-1)


def _row_of(view: _CacheView, c0: int, c1: int) -> int:
    """The row of position ``c0``; rows up to ``c1`` must hold c0..c1-1 in order. (An
    SWA cache writes only the cells inside the window, so its rows may start later.)"""
    pos = positions(view)
    found = np.flatnonzero(pos == c0)
    i0 = int(found[0]) if found.size else -1
    want = np.arange(c0, c1, dtype=np.int32)
    if i0 < 0 or not np.array_equal(pos[i0 : i0 + c1 - c0], want):
        raise EngineError(f"cells [{c0}, {c1}) are not in the state in token order")
    return i0


def cut(views: Sequence[_CacheView], layout: BlobLayout, c0: int, c1: int, out: np.ndarray) -> int:
    """Writes the chunk of cells [c0, c1) into ``out``; returns its size in bytes.
    The cells must hold positions c0..c1-1 in order (one stream per conversation)."""
    n = c1 - c0
    size = layout.chunk_bytes(n)
    if out.nbytes < size:
        raise EngineError(f"a chunk of {size} bytes does not fit {out.nbytes}")
    header = _CHUNK_HEADER.pack(CHUNK_MAGIC, CHUNK_VERSION, 0, n, layout.ident)
    out[: _CHUNK_HEADER.size] = np.frombuffer(header, dtype=np.uint8)
    at = _CHUNK_HEADER.size
    for view in views:
        i0 = _row_of(view, c0, c1)
        meta = out[at : at + n * view.layout.meta_bytes].reshape(n, view.layout.meta_bytes)
        for part in (view.meta, *view.k, *view.v):
            piece = part[:, i0 : i0 + n] if part.ndim == 3 else part[i0 : i0 + n]
            out[at : at + piece.nbytes].reshape(piece.shape)[...] = piece
            at += piece.nbytes
        # a cell's last meta field is the sequence it was in, which set_data ignores:
        # a chunk is the same bytes whichever sequence computed it
        meta[:, -4:] = 0
    return at


def _chunk_cells(chunk: np.ndarray, layout: BlobLayout) -> int:
    if chunk.nbytes < _CHUNK_HEADER.size:
        raise EngineError("chunk too short")
    magic, version, _, n, ident = _CHUNK_HEADER.unpack(chunk[: _CHUNK_HEADER.size].tobytes())
    if magic != CHUNK_MAGIC or version != CHUNK_VERSION or ident != layout.ident:
        raise EngineError("chunk of another format or KV layout")
    if chunk.nbytes != layout.chunk_bytes(n):
        raise EngineError("chunk size does not match its cell count")
    return int(n)


def assembled_bytes(layout: BlobLayout, n_cells: int) -> int:
    """The size of the blob :func:`assemble` writes for ``n_cells`` cells."""
    # per cache: n_stream and one cell count per stream, v_trans and n_layer, and a
    # 12-byte header per layer for K and for V (type + row size, or type + element
    # size + n_embd when V is transposed)
    headers = 8 + sum(4 + 4 * layout.n_stream + 8 + 24 * c.n_layer for c in layout.caches)
    return headers + n_cells * layout.cell_bytes


def assemble(chunks: Sequence[np.ndarray], layout: BlobLayout, out: np.ndarray) -> int:
    """Writes one blob holding the cells of ``chunks`` in order into ``out``; returns
    its size. Raises EngineError for a chunk of another layout."""
    counts = [_chunk_cells(c, layout) for c in chunks]
    total = sum(counts)
    if total == 0:
        raise EngineError("nothing to assemble")
    size = assembled_bytes(layout, total)
    if out.nbytes < size:
        raise EngineError(f"a blob of {size} bytes does not fit {out.nbytes}")
    w = _Writer(out)
    w.u32(STATE_SEQ_MAGIC)
    w.i32(0)
    offsets = [_CHUNK_HEADER.size] * len(chunks)
    for cache in layout.caches:
        w.u32(layout.n_stream)
        w.u32s([0] * (layout.n_stream - 1))  # the other streams are empty: the cells
        w.u32(total)  # land in the destination sequence's stream whichever this is
        offsets = _copy_part(w, chunks, counts, offsets, cache.meta_bytes)
        w.u32(int(cache.v_trans))
        w.u32(cache.n_layer)
        for kind, row in cache.k:
            w.i32(kind)
            w.u64(row)
            offsets = _copy_part(w, chunks, counts, offsets, row)
        for kind, size_, n_embd in cache.v:
            w.i32(kind)
            if cache.v_trans:
                w.u32(size_)
                w.u32(n_embd)
                offsets = _copy_trans(w, chunks, counts, offsets, n_embd, size_)
            else:
                w.u64(size_)
                offsets = _copy_part(w, chunks, counts, offsets, size_)
    if w.at != size:
        raise EngineError(f"assembled {w.at} bytes, expected {size}")
    return size


class _Writer:
    def __init__(self, out: np.ndarray) -> None:
        self.out, self.at = out, 0

    def raw(self, data: bytes | np.ndarray) -> None:
        arr = np.frombuffer(data, dtype=np.uint8) if isinstance(data, bytes) else data
        self.out[self.at : self.at + arr.nbytes] = arr.reshape(-1)
        self.at += arr.nbytes

    def u32(self, v: int) -> None:
        self.raw(struct.pack("<I", v))

    def u32s(self, vs: list[int]) -> None:
        if vs:
            self.raw(struct.pack(f"<{len(vs)}I", *vs))

    def i32(self, v: int) -> None:
        self.raw(struct.pack("<i", v))

    def u64(self, v: int) -> None:
        self.raw(struct.pack("<Q", v))


def _copy_part(
    w: _Writer, chunks: Sequence[np.ndarray], counts: list[int], offsets: list[int], row: int
) -> list[int]:
    """Appends every chunk's next part (``count`` rows of ``row`` bytes each)."""
    out = []
    for chunk, n, at in zip(chunks, counts, offsets, strict=True):
        nbytes = n * row
        w.raw(chunk[at : at + nbytes])
        out.append(at + nbytes)
    return out


def _copy_trans(
    w: _Writer,
    chunks: Sequence[np.ndarray],
    counts: list[int],
    offsets: list[int],
    n_embd: int,
    el: int,
) -> list[int]:
    """A transposed V layer: per V dimension, the elements of every chunk's cells."""
    total = sum(counts)
    dest = w.out[w.at : w.at + n_embd * total * el].reshape(n_embd, total, el)
    col, out = 0, []
    for chunk, n, at in zip(chunks, counts, offsets, strict=True):
        nbytes = n_embd * n * el
        dest[:, col : col + n] = chunk[at : at + nbytes].reshape(n_embd, n, el)
        col += n
        out.append(at + nbytes)
    w.at += n_embd * total * el
    return out
