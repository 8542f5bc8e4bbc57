"""The engine: a model, one context with a KV stream per resident conversation.

Owned by one thread (the runtime's worker). Offers what the request pipeline needs:
claiming a sequence with its reusable live prefix, batch prefill and one-token steps,
chunk capture by cutting a snapshot of the new chunks' cells, restore by assembling
chunks, sampling, and the calibration probes. The prompt work (a request's tokens and
anchors) is its ``prompter``'s (_prompter.py), which the runtime hands to admission.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import llama_cpp.llama_cpp as ll
import numpy as np

from ..errors import EngineError
from ..types import Sampling
from . import _decode_probe, _kvblob
from ._llama import (
    DECODE_ABORTED,
    ContextConfig,
    LlamaContext,
    LlamaModel,
    llama_version,
    on_own_thread,
)
from ._prompt import llama_prompter
from ._residents import KvCells, Resident, Residents
from ._sampling import Sampler

__all__ = ["EngineConfig", "LlamaEngine", "Resident", "fingerprint_of"]

if TYPE_CHECKING:
    from ._protocol import Engine

log = logging.getLogger(__name__)
BLOB_PRETOUCH_BYTES = 256 << 20


def _meta_items(model: LlamaModel) -> list[tuple[str, str]]:
    out = []
    buf = ctypes.create_string_buffer(1024)
    for i in range(ll.llama_model_meta_count(model.ptr)):
        if ll.llama_model_meta_key_by_index(model.ptr, i, buf, len(buf)) < 0:
            continue
        key = buf.value.decode("utf-8", "replace")
        if ll.llama_model_meta_val_str_by_index(model.ptr, i, buf, len(buf)) < 0:
            continue
        out.append((key, buf.value.decode("utf-8", "replace")))
    return out


# llama.cpp's CPU flash attention tiles a batch from this many query tokens up
_UPSTREAM_TILE = 64


def fingerprint_of(model: LlamaModel, digest: str, type_kv: str, flash_attn: str) -> str:
    """Everything a KV blob depends on; a blob never crosses a change in any of it.
    Computable before any context exists (the calibration cache is keyed by it)."""
    rope = sorted(f"{k}={v}" for k, v in _meta_items(model) if "rope" in k or "swa" in k)
    parts = [
        f"model={digest}",
        f"llama_cpp={llama_version()}",
        f"type_kv={type_kv}",
        f"flash_attn={flash_attn}",  # the V layout: transposed without flash attention
        f"swa_full={model.n_swa > 0}",
        f"n_ctx_train={model.n_ctx_train}",
        "lora=none",
        *rope,
    ]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


@dataclass(frozen=True)
class EngineConfig:
    model_path: Path
    model_digest: str
    n_ctx: int  # KV cells of each conversation's stream
    resident_sequences: int
    n_threads: int = 0
    decode_threads: int = 0
    n_gpu_layers: int = -1
    flash_attn: str = "auto"
    type_kv: str = "f16"
    # the KV caches' per-cell layout, kept with the calibration: no probe decode at start
    kv_layout: tuple[_kvblob.CacheLayout, ...] | None = None
    # a prefill steps through earlier replies a token at a time, as they were decoded
    # (see ``kvstore.turn_anchors``); off, a reply is re-prefilled in batches after it is sent
    step_replies: bool = True


class LlamaEngine(Residents):
    """The model, one context, and the conversations resident in it. The only owner of
    "which tokens does each sequence's KV hold": the pipeline uses its verbs (claim,
    restore, prefill, step, trim, snapshot, release) and never touches the context.
    The llama.cpp implementation of the ``Engine`` protocol (_protocol.py)."""

    def __init__(self, config: EngineConfig, model: LlamaModel | None = None) -> None:
        self.config = config
        self.model = model or LlamaModel(config.model_path, config.n_gpu_layers)
        # SWA models keep only a window of cells unless swa_full: chunks need every cell
        self.swa_full = self.model.n_swa > 0
        n_seq = config.resident_sequences
        self.ctx = LlamaContext(
            self.model,
            ContextConfig(
                n_ctx=config.n_ctx * n_seq,
                n_seq_max=n_seq,
                n_threads=config.n_threads,
                decode_threads=config.decode_threads,
                flash_attn=config.flash_attn,
                type_kv=config.type_kv,
                swa_full=self.swa_full,
            ),
        )
        self.n_ctx = int(self.ctx.n_ctx) // n_seq
        self.residents = [Resident(seq) for seq in range(n_seq)]
        self.evictions = 0  # conversations pushed out of the live context
        self.interruptions = 0  # decodes stopped: background work, a prefill its client left
        self.decoding = 0  # tokens of the decode in progress (0: none)
        self.fingerprint = fingerprint_of(
            self.model, config.model_digest, config.type_kv, config.flash_attn
        )
        # the prompt work (admission's, the next turn's): this engine only computes
        self.prompter = llama_prompter(self.model, self.fingerprint, config.step_replies)
        self._blob = np.empty(0, dtype=np.uint8)  # reused for snapshots and restores
        # the calibration keeps the caches' layout: a start then decodes no probe (the
        # stream count is this context's own: one stream per conversation)
        self.layout = (
            _kvblob.BlobLayout(n_seq, config.kv_layout)
            if config.kv_layout is not None
            else on_own_thread(self._measure_layout)
        )
        self.kv_bytes_per_token = self.layout.cell_bytes
        # touched now, once: page faults on fresh memory cost ~1 ms a MB in a VM, and a
        # restore assembles a whole prefix here (a bigger one grows it when needed)
        whole = _kvblob.assembled_bytes(self.layout, self.n_ctx)
        self._blob = np.ones(min(whole, BLOB_PRETOUCH_BYTES), dtype=np.uint8)
        self.chunkable = not self.model.recurrent
        if not self.chunkable:
            log.warning(
                "%s is recurrent/hybrid: its state cannot be cut into chunks; "
                "prompts are recomputed",
                config.model_path.name,
            )

    def _cells(self) -> KvCells:
        return self.ctx

    def _measure_layout(self) -> _kvblob.BlobLayout:
        """The KV layout of this context, read from a real blob of a few tokens."""
        probe = self.model.tokenize("warm start " * 8, add_special=False)[:8]
        probe += [probe[-1]] * (8 - len(probe))
        seq = 0  # before any resident holds anything
        self.ctx.decode(probe, seq, 0, want_logits=False)
        # the shapes every request uses (a two-token tail with logits, a one-token
        # step) run once here, so a first request after start pays no warm-up
        self.ctx.decode(probe[:2], seq, 8)
        self.ctx.decode(probe[:1], seq, 10)
        try:
            layout = self.snapshot(seq)[0]
        finally:
            self.ctx.seq_rm(seq)
        return layout

    def blob_bytes(self, n_tokens: int) -> int:
        """Bytes of a stored chunk of ``n_tokens`` tokens."""
        return self.layout.chunk_bytes(n_tokens)

    # computing ------------------------------------------------------------------------
    def prefill(
        self,
        res: Resident,
        tokens: Sequence[int],
        want_logits: bool,
        ends: Sequence[int] | None = None,
    ) -> bool:
        """Computes ``tokens`` in one decode after what ``res`` holds. ``ends``: the batch
        ends inside it that it stands for (whole chunks merged where that gives the same
        KV bits, see ``Tuning.merge_batch_tokens``); by default it is one batch, and ``[]``
        the first piece of one (it ends no batch: see ``kvstore.piece_end``). False,
        with nothing of it kept, when ``interrupt`` stopped it (background work that a
        request arrived for)."""
        n = len(res.tokens)
        self.decoding = len(tokens)
        try:
            ret = self.ctx.decode(list(tokens), res.seq, n, want_logits)
        finally:
            self.decoding = 0
        if ret == DECODE_ABORTED:
            self.interruptions += 1
            return False
        if ret != 0:
            raise EngineError("the conversation's KV stream is full")
        res.computed(tokens, ends)
        return True

    def keep_logits(self, res: Resident) -> np.ndarray:
        """Keeps (and returns) the logits ``res``'s last decode computed, for the same
        prompt again (``Resident.live_prefix``)."""
        return res.keep_logits(self.ctx.logits())

    def interrupt(self, stop: bool) -> None:
        """``True``: the decode in progress, and any until ``interrupt(False)``, stops
        within one graph node and keeps nothing (callable from any thread)."""
        self.ctx.abort_decode(stop)

    def step(self, res: Resident, token: int) -> None:
        """Decodes one generated token (a batch of its own)."""
        if not self.prefill(res, (token,), want_logits=True):
            raise EngineError("a reply's decode was interrupted")  # only background work is

    def step_many(self, steps: Sequence[tuple[Resident, int]]) -> list[np.ndarray]:
        """Decodes one generated token of each of several replies in one llama.cpp batch
        and returns each one's next-token logits, in order. Only as many as the
        calibration proved get the bits they get alone (``Tuning.decode_batch``): the
        worker never asks for more.

        The batch goes in order of sequence: with a KV stream per sequence, llama.cpp
        puts sequences in one micro-batch only while each one's id follows the last
        one's, so four replies in the worker's order (round robin: sequences 3, 2, 1, 0)
        took four passes over the weights where in order they take one."""
        order = sorted(range(len(steps)), key=lambda i: steps[i][0].seq)
        batch = [(steps[i][0].seq, steps[i][1], len(steps[i][0].tokens)) for i in order]
        self.decoding = len(batch)
        try:
            ret = self.ctx.decode_each(batch)
        finally:
            self.decoding = 0
        if ret != 0:  # nothing of the batch is kept (decode_each removed it)
            raise EngineError("a batched decode step of several replies did not run")
        out: list[np.ndarray] = [np.empty(0)] * len(steps)
        for row, i in enumerate(order):
            res, token = steps[i]
            res.computed((token,))
            out[i] = self.ctx.logits_at(row)
        return out

    def sampler(self, sampling: Sampling) -> Sampler:
        return Sampler(sampling, self.model)

    # chunk copies ---------------------------------------------------------------------
    def snapshot(self, seq: int, c0: int = 0, c1: int = -1) -> list[Any]:
        """Reads ``seq``'s KV state once and parses it: the cells of positions [c0, c1)
        where llama.cpp exports a range (warmstart's build; c1 -1: the whole sequence),
        so a capture costs its new cells, not the conversation; else the whole state,
        from which ``cut`` takes the same bytes. Returns [layout, *views] (views are
        slices of a buffer reused by the next snapshot or restore)."""
        n = 0
        if 0 <= c0 < c1:
            # a range's blob is at most that of its cells assembled (an SWA cache
            # writes only those inside its window); a bigger one (not one stream per
            # conversation) does not fit, and the whole state is read instead
            room = self._room(_kvblob.assembled_bytes(self.layout, c1 - c0))
            n = self.ctx.state_range_into(seq, c0, c1, room)
        if n == 0:
            n = self.ctx.state_get_into(seq, self._room(self.ctx.state_size(seq)))
        layout, views = _kvblob.parse(self._blob[:n], self.model.n_layer, self._n_caches())
        return [layout, *views]

    def _room(self, size: int) -> np.ndarray:
        """The buffer snapshots and restores share, grown to ``size`` bytes if needed."""
        if self._blob.nbytes < size:
            self._blob = np.empty(size, dtype=np.uint8)
        return self._blob

    def _n_caches(self) -> int:
        return 2 if self.model.n_swa > 0 else 1

    def cut(self, snapshot: list[Any], c0: int, c1: int, out: np.ndarray) -> int:
        """Writes the chunk of positions [c0, c1) of a snapshot into ``out``."""
        return _kvblob.cut(snapshot[1:], self.layout, c0, c1, out)

    def restore(
        self, res: Resident, chunks: Sequence[np.ndarray], ids: Sequence[int], bounds: list[int]
    ) -> bool:
        """Replaces what ``res`` holds with ``chunks`` (the KV of ``ids[:bounds[-1]]``,
        one chunk per batch). False, and ``res`` empty, when llama.cpp refuses the
        blob or the positions do not line up."""
        n = bounds[-1]
        if res.copy_pending:
            return False
        res.forget_logits()
        self._room(_kvblob.assembled_bytes(self.layout, n))
        try:
            size = _kvblob.assemble(chunks, self.layout, self._blob)
        except EngineError as exc:
            log.warning("cannot assemble the cached prefix: %s", exc)
            self.evict(res)
            return False
        ok = self.ctx.state_set(res.seq, self._blob[:size])
        if not ok or self.ctx.seq_pos_max(res.seq) != n - 1:
            self.ctx.seq_rm(res.seq)
            res.reset()
            return False
        res.reset(ids[:n], bounds)
        return True

    # calibration target ------------------------------------------------------------------
    def _probe_seq(self) -> int:
        """An emptied sequence for a measurement: the least useful idle resident (in a
        calibration engine, its only one)."""
        res = min(
            (r for r in self.residents if not r.busy), key=lambda r: (bool(r.tokens), r.last_used)
        )
        self.evict(res)
        return res.seq

    def time_prefill(self, n_tokens: int) -> float:
        ids = (
            self.model.tokenize(
                "The quick brown fox jumps over the lazy dog. " * 64, add_special=False
            )
            * 8
        )[:n_tokens]
        seq = self._probe_seq()
        t0 = time.perf_counter()
        self.ctx.decode(ids, seq, 0)
        elapsed = time.perf_counter() - t0
        self.ctx.seq_rm(seq)
        return elapsed

    def time_state_roundtrip(self, n_tokens: int) -> tuple[bytes, float, float]:
        ids = (
            self.model.tokenize("Calibration text for a KV state copy. " * 64, add_special=False)
            * 8
        )[:n_tokens]
        seq = self._probe_seq()
        self.ctx.decode(ids, seq, 0, want_logits=False)
        out = np.empty(self.ctx.state_size(seq), dtype=np.uint8)
        t0 = time.perf_counter()
        n = self.ctx.state_get_into(seq, out)
        t1 = time.perf_counter()
        ok = self.ctx.state_set(seq, out[:n])
        t2 = time.perf_counter()
        self.ctx.seq_rm(seq)
        if not ok:
            raise EngineError("calibration: llama.cpp refused its own state blob")
        return out[:n].tobytes(), t1 - t0, t2 - t1

    def time_state_set(self, src: Resident, dest: Resident, repeats: int = 5) -> tuple[int, float]:
        """Bytes of ``src``'s whole-sequence state and the median seconds one
        llama_state_seq_set_data of them into ``dest`` takes (a benchmark figure: the
        raw rate under every restore). ``dest`` is emptied, before and after."""
        self.evict(dest)
        blob = np.empty(self.ctx.state_size(src.seq), dtype=np.uint8)
        n = self.ctx.state_get_into(src.seq, blob)
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            ok = self.ctx.state_set(dest.seq, blob[:n])
            times.append(time.perf_counter() - t)
            self.ctx.seq_rm(dest.seq)
            if not ok:
                raise EngineError("llama.cpp refused a state blob of its own")
        return n, statistics.median(times)

    def set_decode_threads(self, threads: int | None) -> None:
        """The threads a decode uses (None: what the engine chose at start)."""
        self.ctx.set_threads(threads)

    def invariant_units(self, total: int, units: Sequence[int]) -> tuple[int, ...]:
        """Those of ``units`` (each dividing ``total``) in batches of which tokens get
        the KV bytes that one batch of ``total`` gives them."""
        res, ids = self.residents[self._probe_seq()], self._probe_ids("shapes", total)
        whole = self._probe_kv(res, ids, [total])
        same = tuple(
            u for u in units if np.array_equal(self._probe_kv(res, ids, [u] * (total // u)), whole)
        )
        self.evict(res, counted=False)  # a measurement, not a conversation pushed out
        return same

    def batch_kinds(self, tile: int) -> bool:
        """Does a token get the same KV bytes in every batch of at least ``tile``
        tokens, whatever its size and where it starts, and in every batch of 2 to
        ``tile - 1``? (llama.cpp's CPU flash attention takes a tiled path from 64 query
        tokens up, from 8 in warmstart's build, and a per-row one below it, and neither
        depends on the batch's size.) Checked on one prompt prefilled twice: long then
        short batches of two sizes, the long one past 64 whatever ``tile`` is."""
        # neither a multiple of upstream's tile nor of the pieces, and past that tile
        longer = 2 * _UPSTREAM_TILE + _UPSTREAM_TILE // 2 + 7
        res, ids = self.residents[self._probe_seq()], self._probe_ids("kinds", longer + tile - 1)
        whole = self._probe_kv(res, ids, [longer, tile - 1])
        # the long part as tile and the rest, the short one as 2, a few and the rest
        few = max(2, tile // 6)
        pieces = [tile, longer - tile, 2, few, tile - 3 - few]
        same = np.array_equal(self._probe_kv(res, ids, pieces), whole)
        self.evict(res, counted=False)  # a measurement, not a conversation pushed out
        return same

    def batched_decode(self, counts: Sequence[int]) -> tuple[int, str]:
        """How many replies (of ``counts``) one decode batch may hold with every reply's
        bits what it gets decoded alone, and the first difference in words. Proven on a
        context of its own (runtime/engine/_decode_probe.py), shorter than the test's
        (about 2 s here): prompts up to 272 tokens (past a 256-cell attention chunk), 4
        steps (tests/engine/test_decode_probe.py: 64). ``interrupt`` stops it as it stops
        this engine's own decodes (an EngineError, nothing kept)."""
        checks = _decode_probe.probe_decode(
            self.model, self.ctx.config, counts, steps=4, prompt_tokens=272, abort_with=self.ctx
        )
        return _decode_probe.proven(checks)

    def _probe_ids(self, what: str, n_tokens: int) -> list[int]:
        """A measurement's prompt: a 16-token prefix (so attention has history), then
        ``n_tokens`` more."""
        text = f"Batch {what} and rounding. " * (16 + n_tokens)
        return self.model.tokenize(text, add_special=False)[: 16 + n_tokens]

    def _probe_kv(self, res: Resident, ids: Sequence[int], sizes: Sequence[int]) -> np.ndarray:
        """The KV bytes of ``ids`` after their 16-token prefix, prefilled into ``res``
        (emptied first) in batches of ``sizes``."""
        self.evict(res, counted=False)
        self.prefill(res, ids[:16], want_logits=False)
        for size in sizes:
            n = len(res.tokens)
            self.prefill(res, ids[n : n + size], False)
        out = np.empty(self.blob_bytes(len(res.tokens) - 16), dtype=np.uint8)
        self.cut(self.snapshot(res.seq), 16, len(res.tokens), out)
        return out

    def close(self, close_model: bool = True) -> None:
        self.ctx.close()
        if close_model:
            self.model.close()


if TYPE_CHECKING:  # mypy checks that the llama.cpp engine keeps the protocol
    _IS_AN_ENGINE: type[Engine] = LlamaEngine
