"""The engine: a model, one context, its resident sequences and the scratch sequence.

Owned by one thread (the runtime's worker). Offers what the request pipeline needs:
prompt tokens, decode with room-making, chunk capture and restore through the
scratch sequence, sampling, and the calibration probes.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import llama_cpp.llama_cpp as ll
import numpy as np

from ..errors import EngineError
from ..kvstore._keys import common_prefix
from ..types import Request, Sampling
from ._llama import ContextConfig, LlamaContext, LlamaModel, llama_version
from ._sampling import Sampler
from ._template import ChatTemplate

log = logging.getLogger(__name__)


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


@dataclass
class Resident:
    """A conversation living in the context as sequence ``seq``."""

    seq: int
    tokens: list[int] = field(default_factory=list)
    last_used: float = 0.0
    busy: bool = False
    session: str | None = None  # the conversation it holds, when known


@dataclass(frozen=True)
class EngineConfig:
    model_path: Path
    model_digest: str
    n_ctx_total: int  # KV cells shared by every resident conversation
    resident_sequences: int
    n_threads: int = 0
    decode_threads: int = 1
    n_gpu_layers: int = -1
    flash_attn: str = "auto"
    type_kv: str = "f16"
    # (bytes per token, bytes per blob) from the calibration: no probe decode at start
    kv_geometry: tuple[int, int] | None = None


class Engine:
    def __init__(self, config: EngineConfig, model: LlamaModel | None = None) -> None:
        self.config = config
        self.model = model or LlamaModel(config.model_path, config.n_gpu_layers)
        # SWA models keep only a window of cells unless swa_full: chunks need every cell
        self.swa_full = self.model.n_swa > 0
        self.ctx = LlamaContext(
            self.model,
            ContextConfig(
                n_ctx=config.n_ctx_total,
                n_seq_max=config.resident_sequences + 1,
                n_threads=config.n_threads,
                decode_threads=config.decode_threads,
                flash_attn=config.flash_attn,
                type_kv=config.type_kv,
                swa_full=self.swa_full,
            ),
        )
        self.scratch = config.resident_sequences
        self.residents = [Resident(seq) for seq in range(config.resident_sequences)]
        self.bos_text = self.model.token_text(self.model.bos) if self.model.bos >= 0 else ""
        self.template = ChatTemplate(
            self.model.chat_template(),
            self.bos_text,
            self.model.token_text(self.model.eos) if self.model.eos >= 0 else "",
        )
        self.fingerprint = fingerprint_of(
            self.model, config.model_digest, config.type_kv, config.flash_attn
        )
        self.kv_bytes_per_token, self.kv_overhead_bytes = (
            config.kv_geometry or self._measure_kv_geometry()
        )
        self.chunkable = not self.model.recurrent
        if not self.chunkable:
            log.warning(
                "%s is recurrent/hybrid: its state cannot be cut into chunks; "
                "prompts are recomputed",
                config.model_path.name,
            )

    def _measure_kv_geometry(self) -> tuple[int, int]:
        """Bytes of state per cached token and per blob, measured on this very context."""
        probe = self.model.tokenize("warm start " * 8, add_special=False)[:16]
        probe += [probe[-1]] * (16 - len(probe))
        self.decode(probe[:8], self.scratch, 0, want_logits=False)
        size8 = self.ctx.state_size(self.scratch)
        self.decode(probe[8:16], self.scratch, 8, want_logits=False)
        size16 = self.ctx.state_size(self.scratch)
        # the shapes every request uses (a two-token tail with logits, a one-token
        # step) run once here, so a first request after start pays no warm-up
        self.decode(probe[:2], self.scratch, 16)
        self.decode(probe[:1], self.scratch, 18)
        self.ctx.seq_rm(self.scratch)
        per_token = (size16 - size8) // 8
        return per_token, size8 - 8 * per_token

    def blob_bytes(self, n_tokens: int) -> int:
        return self.kv_overhead_bytes + n_tokens * self.kv_bytes_per_token

    # prompts --------------------------------------------------------------------
    def prompt_ids(self, request: Request) -> tuple[list[int], int]:
        """Token ids of the request's prompt, and the anchor: where the leading system
        message ends (0 when there is none or it cannot be located exactly)."""
        if request.prompt is not None:
            return self._tokenize(request.prompt), 0
        ids = self._tokenize(self.template.render(request.messages, add_generation_prompt=True))
        system = [m for m in request.messages[:1] if m.role == "system"]
        if not system or len(request.messages) < 2:
            return ids, 0
        head = self._tokenize(self.template.render(system, add_generation_prompt=False))
        anchor = len(head) if ids[: len(head)] == head else 0
        return ids, anchor

    def _tokenize(self, text: str) -> list[int]:
        add = self.model.add_bos and not (self.bos_text and text.startswith(self.bos_text))
        return self.model.tokenize(text, add_special=add, parse_special=True)

    # residents --------------------------------------------------------------------
    def best_resident(self, ids: Sequence[int]) -> tuple[Resident | None, int]:
        best, best_len = None, 0
        for res in self.residents:
            if res.busy or not res.tokens:
                continue
            n = common_prefix(res.tokens, ids)
            if n > best_len:
                best, best_len = res, n
        return best, best_len

    def evict(self, res: Resident) -> None:
        if res.tokens:
            self.ctx.seq_rm(res.seq)
            res.tokens = []
        res.session = None

    # decode ------------------------------------------------------------------------
    def decode(self, tokens: Sequence[int], seq: int, pos0: int, want_logits: bool = True) -> None:
        """Decodes, evicting idle resident conversations while the KV cells run out."""
        while True:
            if self.ctx.decode(list(tokens), seq, pos0, want_logits) == 0:
                return
            victims = [r for r in self.residents if not r.busy and r.tokens and r.seq != seq]
            if not victims:
                raise EngineError("the context is full: no idle conversation left to evict")
            self.evict(min(victims, key=lambda r: r.last_used))

    def sampler(self, sampling: Sampling) -> Sampler:
        return Sampler(sampling)

    # chunk copies ---------------------------------------------------------------------
    def capture(self, seq: int, c0: int, c1: int, out: np.ndarray) -> int:
        """Copies the KV of positions [c0, c1) of ``seq`` into ``out``; returns bytes."""
        self.ctx.seq_cp(seq, self.scratch, c0, c1)
        try:
            size = self.ctx.state_size(self.scratch)
            if size > out.nbytes:
                raise EngineError(f"chunk of {size} bytes does not fit {out.nbytes}")
            return self.ctx.state_get_into(self.scratch, out)
        finally:
            self.ctx.seq_rm(self.scratch)

    def restore(self, blob: np.ndarray | bytes, dest: int, p0: int, p1: int) -> bool:
        """Loads one chunk blob and gives ``dest`` its cells with positions [p0, p1).
        False (and nothing changed in ``dest``) when llama.cpp refuses the blob."""
        if not self.ctx.state_set(self.scratch, blob):
            return False
        self.ctx.seq_cp(self.scratch, dest, p0, p1)
        self.ctx.seq_rm(self.scratch)
        return True

    # calibration target ------------------------------------------------------------------
    def time_prefill(self, n_tokens: int) -> float:
        ids = (
            self.model.tokenize(
                "The quick brown fox jumps over the lazy dog. " * 64, add_special=False
            )
            * 8
        )[:n_tokens]
        t0 = time.perf_counter()
        self.decode(ids, self.scratch, 0)
        elapsed = time.perf_counter() - t0
        self.ctx.seq_rm(self.scratch)
        return elapsed

    def time_state_roundtrip(self, n_tokens: int) -> tuple[bytes, float, float]:
        ids = (
            self.model.tokenize("Calibration text for a KV state copy. " * 64, add_special=False)
            * 8
        )[:n_tokens]
        self.decode(ids, self.scratch, 0, want_logits=False)
        out = np.empty(self.ctx.state_size(self.scratch), dtype=np.uint8)
        t0 = time.perf_counter()
        n = self.ctx.state_get_into(self.scratch, out)
        t1 = time.perf_counter()
        ok = self.ctx.state_set(self.scratch, out[:n])
        t2 = time.perf_counter()
        self.ctx.seq_rm(self.scratch)
        if not ok:
            raise EngineError("calibration: llama.cpp refused its own state blob")
        return out[:n].tobytes(), t1 - t0, t2 - t1

    def close(self, close_model: bool = True) -> None:
        self.ctx.close()
        if close_model:
            self.model.close()
