"""Batched decode, proven: do N replies decoded in one llama.cpp batch get the bits
each gets decoded alone?

A decode step of one conversation is a batch of one token; several conversations'
steps in one batch (one token each, each in its own KV stream) compute a matrix
product of N rows where one step computes a vector product, and the CPU backend may
take another kernel for it (llamafile's sgemm from 2 rows, the tiled K-quant kernels
from 8, the repacked weights' gemm by 4 rows, AMX tiles), which rounds differently;
its flash attention split a lone step's KV range across threads but not a batch's.
Whatever the build, this probe is the proof: it decodes the same prompts, in lockstep,
as a batch of N and each alone, and compares every step's logits and, at the end, the
KV of every decoded token, bit for bit. Used by the calibration (batched decode is on
only where it holds) and by the GPU check, whose kernels are other ones again.

The prompts share one text and end at different lengths (so the streams' attention
ranges differ, as conversations' do), and every stream is fed the token its lone twin
chose, so that one rounding difference does not make every later step differ too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import EngineError
from . import _kvblob
from ._llama import DECODE_ABORTED, ContextConfig, LlamaContext, LlamaModel

COUNTS = (2, 4, 8)  # replies per batch the probe checks by default
STEPS = 64
PROMPT_TOKENS = 600  # the longest prompt: past 512 cells, where attention splits its work
_CELLS_UNIT = 256  # a stream's cells: the longest prompt and its steps, rounded up to this
_TEXT = (
    "A household server answers several people at once: one asks about a recipe, "
    "another about a train, a third pastes a log. Each of them expects the reply the "
    "model gives when nobody else is using it. "
)


@dataclass(frozen=True)
class DecodeCheck:
    """The result for one batch size: ``steps`` steps of ``n_seqs`` replies."""

    n_seqs: int
    steps: int
    logits_same: bool  # every step's logits bit-identical to each reply's alone
    kv_same: bool  # the decoded tokens' KV too
    first_step: int = -1  # the first step whose logits differ (-1: none)
    max_diff: float = 0.0  # the largest |difference| of any logit at any step

    @property
    def same(self) -> bool:
        return self.logits_same and self.kv_same

    def describe(self) -> str:
        if self.same:
            return f"{self.n_seqs} replies x {self.steps} steps: identical"
        head = f"{self.n_seqs} replies x {self.steps} steps"
        if self.logits_same:
            return f"{head}: the decoded tokens' KV differs"
        return (
            f"{head}: logits differ (first at step {self.first_step}, by up to {self.max_diff:.3g})"
        )


def probe_decode(
    model: LlamaModel,
    base: ContextConfig,
    counts: Sequence[int] = COUNTS,
    steps: int = STEPS,
    prompt_tokens: int = PROMPT_TOKENS,
    abort_with: LlamaContext | None = None,
) -> tuple[DecodeCheck, ...]:
    """One DecodeCheck per batch size in ``counts``, measured on a context of its own
    (``base``'s threads, attention and KV types; one stream per reply). About
    ``max(counts)`` replies decoded alone and once per count in a batch, ``steps``
    steps each, after one prefill of ``prompt_tokens`` tokens. ``abort_with``: the
    context whose ``abort_decode`` stops the probe too (within one graph node: an
    EngineError, nothing of it kept), as it stops that context's own decodes."""
    alone = max(counts)
    cells = -(-(prompt_tokens + steps + 1) // _CELLS_UNIT) * _CELLS_UNIT
    n_seq = alone + sum(counts)
    config = ContextConfig(
        n_ctx=cells * n_seq,
        n_seq_max=n_seq,
        n_threads=base.n_threads,
        decode_threads=base.decode_threads,
        flash_attn=base.flash_attn,
        type_kv=base.type_kv,
        swa_full=base.swa_full,
    )
    ctx = LlamaContext(model, config, abort_with)
    try:
        return _Lockstep(ctx, model, counts, alone, prompt_tokens).run(steps)
    finally:
        ctx.close()


class _Lockstep:
    """Streams 0..alone-1 decode alone; each count's group of streams decodes the
    same prompts (spread over the lengths) in one batch a step."""

    def __init__(
        self, ctx: LlamaContext, model: LlamaModel, counts: Sequence[int], alone: int, n: int
    ) -> None:
        self.ctx, self.model, self.counts = ctx, model, tuple(counts)
        ids = model.tokenize(_TEXT * (1 + n // 16), add_special=False)[: n + 1]
        if len(ids) < n + 1:
            raise EngineError("the probe's text is too short for its prompt")
        self.ids = ids
        # lengths from n down to a fifth of it: attention ranges of every size
        self.lengths = [n - (n * 4 // 5) * i // max(alone - 1, 1) for i in range(alone)]
        self.groups: list[list[tuple[int, int]]] = []  # per count: (stream, prompt) pairs
        stream = alone
        for count in self.counts:
            spread = [round(i * (alone - 1) / max(count - 1, 1)) for i in range(count)]
            self.groups.append([(stream + i, p) for i, p in enumerate(spread)])
            stream += count

    def _fill(self) -> None:
        """The longest prompt once, then copied into every stream and cut to length."""
        _ran(self.ctx.decode(self.ids[: self.lengths[0]], 0, 0, want_logits=False))
        pairs = [(i, i) for i in range(len(self.lengths))]
        for stream, prompt in [*pairs[1:], *(pair for group in self.groups for pair in group)]:
            self.ctx.seq_cp_all(0, stream)
            self.ctx.seq_rm(stream, self.lengths[prompt], -1)

    def run(self, steps: int) -> tuple[DecodeCheck, ...]:
        self._fill()
        tokens = [self.ids[n] for n in self.lengths]  # each prompt's next token first
        first = [-1] * len(self.groups)
        worst = [0.0] * len(self.groups)
        for t in range(steps):
            logits = [self._alone(p, tokens[p], self.lengths[p] + t) for p in range(len(tokens))]
            for g, group in enumerate(self.groups):
                batch = self._batch(group, tokens, t)
                diff = max(_differ(b, logits[p]) for b, (_, p) in zip(batch, group, strict=True))
                if diff and first[g] < 0:
                    first[g] = t
                worst[g] = max(worst[g], diff)
            tokens = [int(np.argmax(x)) for x in logits]
        return tuple(
            DecodeCheck(n, steps, first[g] < 0, self._kv_same(self.groups[g], steps), first[g],
                        worst[g])
            for g, n in enumerate(self.counts)
        )  # fmt: skip

    def _alone(self, stream: int, token: int, pos: int) -> np.ndarray:
        _ran(self.ctx.decode_each([(stream, token, pos)]))
        return self.ctx.logits_at(0)

    def _batch(self, group: list[tuple[int, int]], tokens: list[int], t: int) -> list[np.ndarray]:
        steps = [(s, tokens[p], self.lengths[p] + t) for s, p in group]
        _ran(self.ctx.decode_each(steps))
        return [self.ctx.logits_at(i) for i in range(len(steps))]

    def _kv_same(self, group: list[tuple[int, int]], steps: int) -> bool:
        return all(
            np.array_equal(self._kv(s, self.lengths[p], steps), self._kv(p, self.lengths[p], steps))
            for s, p in group
        )

    def _kv(self, stream: int, start: int, steps: int) -> np.ndarray:
        """The KV of the decoded tokens of ``stream`` (cells [start, start + steps))."""
        blob = np.empty(self.ctx.state_size(stream), dtype=np.uint8)
        n = self.ctx.state_get_into(stream, blob)
        n_caches = 2 if self.model.n_swa > 0 else 1
        layout, views = _kvblob.parse(blob[:n], self.model.n_layer, n_caches)
        out = np.empty(layout.chunk_bytes(steps), dtype=np.uint8)
        size = _kvblob.cut(views, layout, start, start + steps, out)
        return out[:size]


def _ran(ret: int) -> None:
    """A probe decode's return code, as an error unless it ran."""
    if ret == DECODE_ABORTED:  # abort_with's owner has other work: the probe is redone
        raise EngineError("the decode probe was stopped")
    if ret != 0:
        raise EngineError("the probe's decode found no room in its context")


def _differ(a: np.ndarray, b: np.ndarray) -> float:
    """0.0 when ``a`` and ``b`` hold the same bits, else their largest |difference|
    (inf where one holds a NaN or an infinity the other does not)."""
    if np.array_equal(a.view(np.uint32), b.view(np.uint32)):
        return 0.0
    with np.errstate(invalid="ignore", over="ignore"):
        diff = float(np.nanmax(np.abs(a.astype(np.float64) - b.astype(np.float64))))
    return diff if diff > 0 else float("inf")


def proven(checks: Sequence[DecodeCheck]) -> tuple[int, str]:
    """The most replies a batch may hold (every check up to it held; 0: not even the
    first), and the first difference in words ("" when none)."""
    most = 0
    for check in sorted(checks, key=lambda c: c.n_seqs):
        if not check.same:
            return most, check.describe()
        most = check.n_seqs
    return most, ""
