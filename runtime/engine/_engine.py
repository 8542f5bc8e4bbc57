"""The engine: a model, one context with a KV stream per resident conversation.

Owned by one thread (the runtime's worker). Offers what the request pipeline needs:
prompt tokens, claiming a sequence with its reusable live prefix, batch prefill and
one-token steps, chunk capture by cutting a snapshot of the new chunks' cells,
restore by assembling chunks, sampling, and the calibration probes.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import json
import logging
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import llama_cpp.llama_cpp as ll
import numpy as np

from ..errors import EngineError, RequestError
from ..kvstore import common_prefix, turn_anchors
from ..types import Message, Request, Sampling
from . import _decode_probe, _kvblob, _tools
from ._llama import (
    DECODE_ABORTED,
    ContextConfig,
    LlamaContext,
    LlamaModel,
    llama_version,
    on_own_thread,
)
from ._prompt import PromptTokenizer
from ._residents import KvCells, Resident, Residents

__all__ = ["EngineConfig", "LlamaEngine", "Resident", "fingerprint_of"]
from ._sampling import Sampler, check_grammar, check_logit_bias
from ._template import template_for

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
    # (see ``_turn_starts``); off, a reply is re-prefilled in batches after it is sent
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
        self.bos_text = self.model.token_text(self.model.bos) if self.model.bos >= 0 else ""
        self.prompter = PromptTokenizer(self.model)
        # the system message's ids on its own: the same few system prompts come with
        # every request, and tokenizing one of thousands of tokens again takes ms
        self._head_ids = functools.lru_cache(maxsize=16)(self.prompter.ids)
        self.template = template_for(
            self.model,
            self.prompter,
            self.bos_text,
            self.model.token_text(self.model.eos) if self.model.eos >= 0 else "",
        )
        self.tool_format = _tools.detect_format(self.template.source)
        self.opener = self._find_opener()
        self.user_header = self._find_user_header()
        self.fingerprint = fingerprint_of(
            self.model, config.model_digest, config.type_kv, config.flash_attn
        )
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

    # prompts --------------------------------------------------------------------
    def prompt_ids(
        self,
        request: Request,
        generation: bool = True,
        plan: _tools.ToolPlan | Literal["plan it"] | None = "plan it",
    ) -> tuple[list[int], tuple[int, ...]]:
        """Token ids of the request's prompt, and its anchors: where each message of the
        conversation starts (the template's turn-opening control token) and where the
        leading system message ends. Prefill batches end at the anchors, so the next
        turn, whose prompt holds these messages at the same places, computes the same
        batches up to its new message, and reuses them all (see ``batch_cuts``).
        ``generation=False``: without the assistant's opening (the history as the next
        turn's prompt will hold it, once the reply is one of its messages).
        Message contents are plain text: only the template's markup holds control
        tokens (a raw completion prompt is the client's own markup, parsed whole).
        ``plan``: the request's tool plan, when admission already made it."""
        if request.prompt is not None:
            ids = self.prompter.ids([(request.prompt, True)])
            return ids, self._turn_starts(ids)
        if isinstance(plan, str):  # "plan it"
            plan = self.tool_plan(request)
        messages = plan.messages if plan else request.messages
        tools = plan.tools if plan else None
        if plan and plan.format != "generic":
            self._check_native_tools(plan)
        parts = _tools.render_parts(self.template, plan, messages, generation)
        ids = self.prompter.chat_ids(parts, messages)
        anchors = set(self._turn_starts(ids))
        system = [m for m in messages[:1] if m.role == "system"]
        if system and len(messages) >= 2:
            head_parts = self.template.render_parts(
                system, add_generation_prompt=False, tools=tools
            )
            # templates such as Gemma's put the system text in the first user turn
            head = self._head_ids(tuple(head_parts)) if head_parts else []
            if head and ids[: len(head)] == head:
                anchors.add(len(head))
        return ids, tuple(sorted(anchors))

    def least_tokens(self, request: Request, reach: int) -> int:
        """A lower bound on the prompt's token count, proven without tokenizing it
        (``PromptTokenizer.least_tokens``): admission refuses a prompt over the context
        by it, where tokenizing a megabyte takes seconds of a core. 0 when the text is
        too short for the bound to reach ``reach`` (then nothing is rendered)."""
        texts = [request.prompt or "", *(m.content for m in request.messages)]
        if 4 * sum(map(len, texts)) < reach * self.prompter.longest_piece:  # <= 4 B a char
            return 0
        if request.prompt is not None:
            return self.prompter.least_tokens([(request.prompt, True)])
        plan = self.tool_plan(request)
        messages = plan.messages if plan else request.messages
        return self.prompter.least_tokens(
            _tools.render_parts(self.template, plan, messages, generation=True)
        )

    def _turn_starts(self, ids: Sequence[int]) -> tuple[int, ...]:
        """Where the prompt's batches end besides every ``chunk_tokens``: its turns, as
        this model's template opens them (``kvstore.turn_anchors``)."""
        header, is_control = self.user_header, self.prompter.is_control
        return turn_anchors(ids, self.opener, header, is_control, self.config.step_replies)

    def _find_opener(self) -> list[int]:
        """The assistant's opening, which the template adds to a prompt (ChatML's
        ``<|im_start|>assistant\\n``), when it starts with a control token (which only
        the template's markup holds); [] otherwise."""
        probe = (Message("user", "x"),)
        try:
            bare = self.prompter.ids(self.template.render_parts(probe, False))
            opened = self.prompter.ids(self.template.render_parts(probe, True))
        except RequestError:
            return []
        if len(opened) <= len(bare) or opened[: len(bare)] != bare:
            return []
        opener = opened[len(bare) :]
        return opener if self.prompter.is_control(opener[0]) else []

    def _find_user_header(self) -> list[int]:
        """What opens a user's turn up to its text (ChatML's ``<|im_start|>user\n``),
        when the assistant's opening starts with a control token; [] otherwise."""
        if not self.opener:
            return []
        try:
            a, b = (
                self.prompter.ids(self.template.render_parts((Message("user", t),), False))
                for t in ("x", "y")
            )
        except RequestError:
            return []
        n = common_prefix(a, b)
        starts = [i for i in range(n) if a[i] == self.opener[0]]
        return list(a[starts[-1] : n]) if starts else []

    def check_sampling(self, sampling: Sampling) -> None:
        """This model's own rules of a sampling: logit biases name its tokens, a
        grammar parses over its vocabulary (only the vocabulary is read, fixed once
        loaded: safe off the worker thread)."""
        check_logit_bias(self.model, sampling)
        if sampling.grammar is not None:
            check_grammar(self.model, sampling.grammar)

    def tool_plan(self, request: Request) -> _tools.ToolPlan | None:
        """How the request's tools and tool turns reach this model (None: it has none)."""
        return _tools.plan(request, self.tool_format)

    def _check_native_tools(self, plan: _tools.ToolPlan) -> None:
        """A native template writes tool definitions and call arguments as JSON in
        its own markup (trusted): control-token text in them is refused, not parsed."""
        texts = [json.dumps(plan.tools or [], ensure_ascii=False)]
        texts += [c.name + c.arguments for m in plan.messages for c in m.tool_calls]
        texts += [m.name or "" for m in plan.messages]
        if any(self.prompter.has_control_text(t) for t in texts):
            raise RequestError(
                "tool definitions and tool-call arguments must not hold this model's "
                "control-token text",
                param="tools",
            )

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
        res.copy_pending = False
        res.tokens.extend(tokens)
        res.bounds.extend((len(res.tokens),) if ends is None else ends)
        return True

    def keep_logits(self, res: Resident) -> np.ndarray:
        """Keeps (and returns) the logits ``res``'s last decode computed, for the same
        prompt again (``Resident.live_prefix``)."""
        res.logits, res.logits_at = self.ctx.logits(), len(res.tokens)
        return res.logits

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
        worker never asks for more."""
        batch = [(res.seq, token, len(res.tokens)) for res, token in steps]
        self.decoding = len(batch)
        try:
            ret = self.ctx.decode_each(batch)
        finally:
            self.decoding = 0
        if ret != 0:  # nothing of the batch is kept (decode_each removed it)
            raise EngineError("a batched decode step of several replies did not run")
        out = []
        for i, (res, token) in enumerate(steps):
            res.copy_pending = False
            res.tokens.append(token)
            res.bounds.append(len(res.tokens))
            out.append(self.ctx.logits_at(i))
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
            res.tokens, res.bounds = [], []
            return False
        res.tokens, res.bounds = list(ids[:n]), list(bounds)
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
