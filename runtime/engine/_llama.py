"""The only module that calls llama.cpp: one model, one context with one KV stream per sequence.

Every call here runs on the runtime's worker thread; nothing in this module is
thread-safe on its own. llama.cpp's return codes become EngineError here.
"""

from __future__ import annotations

import atexit
import ctypes
import logging
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import llama_cpp
import llama_cpp.llama_cpp as ll
import numpy as np

from ..errors import Cancelled, EngineError, ModelError
from . import _native_log

log = logging.getLogger(__name__)


@atexit.register
def _close_llama_cpp_devnull() -> None:
    """llama_cpp._utils opens /dev/null twice at import and never closes it, which
    Python reports as a ResourceWarning at exit; close them on its behalf."""
    from llama_cpp import _utils

    for name in ("outnull_file", "errnull_file"):
        f = getattr(_utils, name, None)
        if f is not None and not f.closed:
            f.close()


_FLASH = {
    "auto": ll.LLAMA_FLASH_ATTN_TYPE_AUTO,
    "on": ll.LLAMA_FLASH_ATTN_TYPE_ENABLED,
    "off": ll.LLAMA_FLASH_ATTN_TYPE_DISABLED,
}
_GGML_TYPES = {"f16": 1, "q8_0": 8}  # ggml_type values: GGML_TYPE_F16, GGML_TYPE_Q8_0
_DECODE_NO_SLOT = 1
ABORTED = 2  # llama_decode and llama_encode: the abort callback said stop
DECODE_ABORTED = ABORTED


def _abort_callback() -> Any:
    """A C function for llama.cpp's abort callback that reads a flag without Python.

    llama.cpp asks the callback between two graph nodes, from its compute thread. A
    Python callback would take the GIL there, many times per decode; libc's
    ``strlen`` on a two-byte buffer answers the same question with no Python at all:
    b"\\1\\0" is length 1 (true, stop), b"\\0" length 0 (false). A ``bool`` return is
    the low byte of the register a ``size_t`` comes back in on x86-64 and arm64.
    None where no C library is found: background batches then run to their end."""
    import ctypes.util

    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        strlen = ctypes.CDLL(name).strlen
    except (OSError, AttributeError):
        return None
    address = ctypes.cast(strlen, ctypes.c_void_p).value
    return ll.ggml_abort_callback(address) if address else None


_ABORT_CALLBACK = _abort_callback()


def set_mmap(params: Any, mmap: bool) -> None:
    """Model params that map the file or read it: ``load_mode`` at llama-cpp-python
    0.3.36 (llama.cpp's loader modes), ``use_mmap`` before it."""
    names = {name for name, _ in type(params)._fields_}
    if "load_mode" in names:
        params.load_mode = ll.LLAMA_LOAD_MODE_MMAP if mmap else ll.LLAMA_LOAD_MODE_NONE
    elif "use_mmap" in names:
        params.use_mmap = mmap


class LlamaModel:
    """A loaded GGUF model and its vocabulary."""

    def __init__(
        self,
        path: Path,
        n_gpu_layers: int = -1,
        *,
        extra_buffers: bool = False,
        mmap: bool | None = None,
    ) -> None:
        """``extra_buffers``: llama.cpp's extra buffer types (weight repacking, AMX); off
        unless engine._smoke found them safe here (on AMX CPUs they can die by SIGILL).
        ``mmap``: map the file (True) or read it (False); None leaves llama.cpp's own
        choice (engine._loader proves whichever is used in a child first)."""
        _native_log.install()  # before llama.cpp says anything
        ll.llama_backend_init()
        params = ll.llama_model_default_params()
        params.n_gpu_layers = 10**6 if n_gpu_layers < 0 else n_gpu_layers
        params.use_extra_bufts = extra_buffers
        if mmap is not None:
            set_mmap(params, mmap)
        self.extra_buffers = extra_buffers
        self.mmap = mmap
        self.n_gpu_layers = n_gpu_layers
        self.path = path
        self.ptr = ll.llama_model_load_from_file(str(path).encode(), params)
        if not self.ptr:
            raise ModelError(f"llama.cpp could not load {path} (not a GGUF model it supports?)")
        self.vocab = ll.llama_model_get_vocab(self.ptr)
        self.n_ctx_train = int(ll.llama_model_n_ctx_train(self.ptr))
        self.n_layer = int(ll.llama_model_n_layer(self.ptr))
        self.n_swa = int(ll.llama_model_n_swa(self.ptr))
        self.recurrent = bool(
            ll.llama_model_is_recurrent(self.ptr) or ll.llama_model_is_hybrid(self.ptr)
        )
        self.add_bos = bool(ll.llama_vocab_get_add_bos(self.vocab))
        self.bos = int(ll.llama_vocab_bos(self.vocab))
        self.eos = int(ll.llama_vocab_eos(self.vocab))
        self.n_vocab = int(ll.llama_vocab_n_tokens(self.vocab))
        self.n_embd = int(ll.llama_model_n_embd(self.ptr))
        self.n_head = int(ll.llama_model_n_head(self.ptr))
        self.n_head_kv = int(ll.llama_model_n_head_kv(self.ptr))
        self.size_bytes = int(ll.llama_model_size(self.ptr))

    def kv_bytes_per_token_estimate(self, type_kv: str) -> int:
        """K and V of every layer for one token, before any context exists to measure."""
        head_dim = self.n_embd // max(self.n_head, 1)
        elem = 2.0 if type_kv == "f16" else 34 / 32  # q8_0: 34 bytes per 32 values
        return int(2 * self.n_layer * self.n_head_kv * head_dim * elem)

    def meta(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(4096)
        n = ll.llama_model_meta_val_str(self.ptr, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", "replace") if n >= 0 else None

    def describe(self) -> str:
        """llama.cpp's one-line description: architecture, size and type ("llama 135M Q4_1")."""
        buf = ctypes.create_string_buffer(256)
        n = ll.llama_model_desc(self.ptr, buf, len(buf))
        return buf.value.decode("utf-8", "replace") if n >= 0 else ""

    @property
    def n_params(self) -> int:
        return int(ll.llama_model_n_params(self.ptr))

    def chat_template(self) -> str | None:
        raw = ll.llama_model_chat_template(self.ptr, None)
        return raw.decode("utf-8") if raw else None

    def tokenize(self, text: str, add_special: bool, parse_special: bool = True) -> list[int]:
        data = text.encode("utf-8")
        cap = len(data) + 16
        buf = (ll.llama_token * cap)()
        n = ll.llama_tokenize(self.vocab, data, len(data), buf, cap, add_special, parse_special)
        if n < 0:  # buffer too small: -n is the size needed
            cap = -n
            buf = (ll.llama_token * cap)()
            n = ll.llama_tokenize(self.vocab, data, len(data), buf, cap, add_special, parse_special)
        if n < 0:
            raise EngineError(f"tokenization failed ({n})")
        return list(buf[:n])

    def piece(self, token: int, special: bool = False) -> bytes:
        """The token's bytes; ``special``: a control token's own text (``<|im_end|>``)
        where a reply shows nothing."""
        buf = ctypes.create_string_buffer(64)
        n = ll.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = ll.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
        return buf.raw[: max(n, 0)]

    def token_text(self, token: int) -> str:
        raw = ll.llama_vocab_get_text(self.vocab, token)
        return raw.decode("utf-8", "replace") if raw else ""

    def is_eog(self, token: int) -> bool:
        return bool(ll.llama_vocab_is_eog(self.vocab, token))

    def close(self) -> None:
        if self.ptr:
            ll.llama_model_free(self.ptr)
            self.ptr = None


def builtin_chat_templates() -> list[str]:
    """The names of the chat templates llama.cpp has built in ("gemma", "llama3", ...)."""
    n = int(ll.llama_chat_builtin_templates(None, 0))
    names = (ctypes.c_char_p * n)()
    ll.llama_chat_builtin_templates(names, n)
    return [name.decode() for name in names if name]


def apply_builtin_template(name: str, turns: list[tuple[str, str]], add_generation: bool) -> str:
    """``turns`` ((role, content) pairs) rendered by llama.cpp's built-in template ``name``."""
    keep = [(role.encode(), content.encode()) for role, content in turns]
    chat = (ll.llama_chat_message * max(len(keep), 1))()
    for i, (role, content) in enumerate(keep):
        chat[i].role, chat[i].content = role, content
    cap = 2 * sum(len(r) + len(c) for r, c in keep) + 256
    for _ in range(2):  # a second call when the first buffer was too small
        buf = ctypes.create_string_buffer(cap)
        n = ll.llama_chat_apply_template(name.encode(), chat, len(keep), add_generation, buf, cap)
        if n < 0:
            raise ModelError(f"llama.cpp does not know the chat template {name!r}")
        if n <= cap:
            return buf.raw[:n].decode("utf-8")
        cap = n
    raise EngineError(f"the chat template {name!r} kept growing")


T = TypeVar("T")


def on_own_thread(fn: Callable[[], T]) -> T:
    """Runs ``fn`` on a thread that ends when it returns, and returns its result.

    llama.cpp's CPU backend runs its threads through OpenMP, which keeps a team of
    threads for every thread that ever decoded. With a second team alive (say, the
    calibration's, on the main thread) there are more OpenMP threads than cores, and
    libgomp then makes every barrier sleep instead of spin: the serving worker decoded
    at one-thread speed in the process that calibrated, with 750 voluntary context
    switches per token against 5. A thread that ends takes its team with it, so every
    decode outside the runtime's worker thread (calibration, the layout probe) runs
    through this."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:
            box["error"] = exc

    thread = threading.Thread(target=run, name="llama-probe")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]  # type: ignore[no-any-return]


def _range_export() -> Any:
    """warmstart's build exports a sequence's state for a range of positions
    (``llama_state_seq_get_data_range``, installers/llama_patches.py), which no
    llama-cpp-python binds; None with a llama.cpp without it, where a capture reads
    the whole sequence."""
    fn = getattr(ll._lib, "llama_state_seq_get_data_range", None)
    if fn is not None:
        fn.argtypes = [
            ll.llama_context_p_ctypes,
            ctypes.POINTER(ctypes.c_uint8),
            ctypes.c_size_t,
            ll.llama_seq_id,
            ll.llama_pos,
            ll.llama_pos,
        ]
        fn.restype = ctypes.c_size_t
    return fn


_GET_RANGE = _range_export()


@dataclass(frozen=True)
class ContextConfig:
    n_ctx: int  # KV cells of every stream together: n_seq_max streams of n_ctx / n_seq_max
    n_seq_max: int
    n_batch: int = 512
    n_threads: int = 0  # prefill threads; 0: all cores
    decode_threads: int = 0  # one-token decode threads; 0: all cores
    flash_attn: str = "auto"
    type_kv: str = "f16"
    swa_full: bool = False


class LlamaContext:
    """One llama.cpp context with one KV stream per sequence (``kv_unified=false``).

    Each sequence's cells start at the beginning of its own stream in token order and
    its attention covers only them, so what one conversation computes never depends on
    what the others hold (see DESIGN.md, "Numerics")."""

    def __init__(
        self, model: LlamaModel, config: ContextConfig, abort_with: LlamaContext | None = None
    ) -> None:
        """``abort_with``: another context whose abort flag this one shares, so that
        ``abort_decode`` on that one stops this one's decodes too (a measurement's own
        context, stopped as its engine's work is)."""
        self.model = model
        self.config = config
        params = ll.llama_context_default_params()
        params.n_ctx = config.n_ctx
        params.n_batch = config.n_batch
        params.n_ubatch = config.n_batch
        params.n_seq_max = config.n_seq_max
        # With a stream per sequence, a decode step attends over its own conversation's
        # cells only: its rounding no longer depends on the others, so it can use every
        # core without making replies depend on what else is resident.
        params.n_threads = config.decode_threads or os.cpu_count() or 1
        params.n_threads_batch = config.n_threads or os.cpu_count() or 1
        params.flash_attn_type = _FLASH[config.flash_attn]
        params.type_k = _GGML_TYPES[config.type_kv]
        params.type_v = _GGML_TYPES[config.type_kv]
        params.swa_full = config.swa_full
        params.kv_unified = False
        params.no_perf = True
        self.ptr = ll.llama_init_from_model(model.ptr, params)
        if not self.ptr:
            raise EngineError("llama.cpp could not create a context (out of memory?)")
        self.mem = ll.llama_get_memory(self.ptr)
        self.n_ctx = int(ll.llama_n_ctx(self.ptr))
        # b"\0": go on; b"\1": abort the decode
        self._stop: ctypes.Array[ctypes.c_char] = (
            abort_with._stop if abort_with is not None else ctypes.create_string_buffer(2)
        )
        if _ABORT_CALLBACK is not None:
            ll.llama_set_abort_callback(self.ptr, _ABORT_CALLBACK, ctypes.addressof(self._stop))
        self._batch = ll.llama_batch_init(config.n_batch, 0, 1)
        self.n_vocab = model.n_vocab
        self.exports_ranges = _GET_RANGE is not None
        self.state_bytes_read = 0  # by every state export, whole or of a range

    def set_threads(self, decode: int | None) -> None:
        """Decode threads from now on (None: as configured); prefill threads unchanged."""
        n = decode or self.config.decode_threads or os.cpu_count() or 1
        ll.llama_set_n_threads(self.ptr, n, self.config.n_threads or os.cpu_count() or 1)

    def abort_decode(self, stop: bool) -> None:
        """Makes the decode in progress, and every later one until ``stop`` is False
        again, end early with DECODE_ABORTED (safe from any thread)."""
        self._stop[0] = b"\1" if stop else b"\0"

    # sequences -------------------------------------------------------------
    def seq_rm(self, seq: int, p0: int = -1, p1: int = -1) -> None:
        if not ll.llama_memory_seq_rm(self.mem, seq, p0, p1):
            raise EngineError(f"could not remove [{p0}, {p1}) from sequence {seq}")

    def seq_cp_all(self, src: int, dst: int) -> None:
        """Copies all of ``src``'s stream into ``dst``'s (llama.cpp aborts on a partial
        copy between streams; trim the copy with seq_rm afterwards)."""
        ll.llama_memory_seq_cp(self.mem, src, dst, -1, -1)

    def seq_pos_max(self, seq: int) -> int:
        return int(ll.llama_memory_seq_pos_max(self.mem, seq))

    # decoding --------------------------------------------------------------
    def decode(self, tokens: list[int], seq: int, pos0: int, want_logits: bool = True) -> int:
        """Feeds ``tokens`` at positions ``pos0...`` of ``seq``; the last one's logits are
        kept when ``want_logits``. Returns llama.cpp's code for "no KV slot" (1) so that
        the caller can make room and retry, and DECODE_ABORTED (2, nothing kept) when
        ``abort_decode`` stopped it; other failures raise."""
        batch = self._batch
        step = self.config.n_batch
        for start in range(0, len(tokens), step):
            part = tokens[start : start + step]
            last_part = start + step >= len(tokens)
            for i, tok in enumerate(part):
                batch.token[i] = tok
                batch.pos[i] = pos0 + start + i
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = seq
                batch.logits[i] = 1 if (want_logits and last_part and i == len(part) - 1) else 0
            batch.n_tokens = len(part)
            ret = ll.llama_decode(self.ptr, batch)
            if ret == DECODE_ABORTED:  # nothing of this call is kept, earlier parts neither
                self.seq_rm(seq, pos0, -1)
                return ret
            if ret == _DECODE_NO_SLOT:
                self.seq_rm(seq, pos0 + start, -1)
                return ret
            if ret != 0:
                self.seq_rm(seq, pos0 + start, -1)
                raise EngineError(f"llama_decode failed with code {ret}")
        return 0

    def decode_each(self, steps: Sequence[tuple[int, int, int]]) -> int:
        """One llama.cpp batch of one token for each of several sequences: ``steps`` are
        (sequence, token, position); every token's logits are kept (``logits_at(i)``).
        Returns 0, or llama.cpp's code for "no KV slot" / DECODE_ABORTED with nothing
        kept; other failures raise."""
        batch = self._batch
        for i, (seq, tok, pos) in enumerate(steps):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = tok, pos, 1
            batch.seq_id[i][0], batch.logits[i] = seq, 1
        batch.n_tokens = len(steps)
        ret = ll.llama_decode(self.ptr, batch)
        if ret in (DECODE_ABORTED, _DECODE_NO_SLOT):
            for seq, _, pos in steps:  # llama.cpp may have kept some of the batch's cells
                self.seq_rm(seq, pos, -1)
            return int(ret)
        if ret != 0:
            for seq, _, pos in steps:
                self.seq_rm(seq, pos, -1)
            raise EngineError(f"llama_decode failed with code {ret}")
        return 0

    def logits_at(self, i: int) -> np.ndarray:
        """A copy of the logits of the ``i``-th token of the last ``decode_each``."""
        ptr = ll.llama_get_logits_ith(self.ptr, i)
        if not ptr:
            raise EngineError(f"no logits for token {i} of the last batch")
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)).copy()

    def logits(self) -> np.ndarray:
        """A copy of the logits of the last token decoded with want_logits."""
        view = self.logits_view()
        if view is None:
            raise EngineError("no logits available")
        return view.copy()

    def logits_view(self) -> np.ndarray | None:
        """Those logits in llama.cpp's own buffer (None: there are none), valid until
        the next decode."""
        ptr = ll.llama_get_logits_ith(self.ptr, -1)
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)) if ptr else None

    # state copies -----------------------------------------------------------
    def state_size(self, seq: int) -> int:
        return int(ll.llama_state_seq_get_size(self.ptr, seq))

    def state_get_into(self, seq: int, out: np.ndarray) -> int:
        """Copies ``seq``'s KV into ``out`` (uint8, large enough); returns bytes written."""
        ptr = out.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8))
        n = int(ll.llama_state_seq_get_data(self.ptr, ptr, out.nbytes, seq))
        if n == 0:
            raise EngineError(f"llama_state_seq_get_data failed for sequence {seq}")
        self.state_bytes_read += n
        return n

    def state_range_into(self, seq: int, p0: int, p1: int, out: np.ndarray) -> int:
        """Copies ``seq``'s KV at positions [p0, p1) into ``out``, in the format of a
        whole export holding only those cells; returns bytes written, 0 when this
        llama.cpp cannot (no range export, or ``out`` too small)."""
        if _GET_RANGE is None:
            return 0
        ptr = out.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8))
        n = int(_GET_RANGE(self.ptr, ptr, out.nbytes, seq, p0, p1))
        self.state_bytes_read += n
        return n

    def state_set(self, seq: int, blob: np.ndarray | bytes | memoryview) -> bool:
        """Loads a blob into ``seq`` (which llama.cpp clears first). True only when every
        byte was consumed; on any failure the sequence is cleared again."""
        arr = np.frombuffer(blob, dtype=np.uint8) if not isinstance(blob, np.ndarray) else blob
        ptr = arr.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8))
        n = int(ll.llama_state_seq_set_data(self.ptr, ptr, arr.nbytes, seq))
        if n != arr.nbytes:
            ll.llama_memory_seq_rm(self.mem, seq, -1, -1)
            return False
        return True

    def close(self) -> None:
        if self.ptr:
            ll.llama_batch_free(self._batch)
            ll.llama_free(self.ptr)
            self.ptr = None


class LlamaEmbedder:
    """A small context of its own on a loaded model, for pooled sentence embeddings.

    Separate from the chat context (which it shares the weights with), so that an
    embedding request never touches a conversation's KV. One text at a time, in one
    batch: pooling needs all of a sequence's tokens in the same micro-batch. Such a
    batch is up to n_ctx tokens (a minute on one busy CPU core), so a ``stop`` set
    meanwhile aborts it: llama.cpp asks an abort callback between graph nodes."""

    def __init__(self, model: LlamaModel, n_ctx: int, n_threads: int = 0) -> None:
        self.model = model
        self.ptr = self._context(n_ctx, n_threads, ll.LLAMA_POOLING_TYPE_UNSPECIFIED)
        if int(ll.llama_pooling_type(self.ptr)) == ll.LLAMA_POOLING_TYPE_NONE:
            # A chat model declares no pooling: average its token states, as
            # llama-server --embeddings --pooling mean does.
            ll.llama_free(self.ptr)
            self.ptr = self._context(n_ctx, n_threads, ll.LLAMA_POOLING_TYPE_MEAN)
        self.n_ctx = int(ll.llama_n_ctx(self.ptr))
        self.mem = ll.llama_get_memory(self.ptr)
        self._stop: threading.Event | None = None  # the running text's
        # kept as an attribute: llama.cpp holds only the C pointer
        self._abort = ll.ggml_abort_callback(lambda _data: self._stopped())
        ll.llama_set_abort_callback(self.ptr, self._abort, None)
        self._batch = ll.llama_batch_init(self.n_ctx, 0, 1)
        # encoder-only models (T5-like) encode; the rest, BERT included, decode
        self._encode = bool(
            ll.llama_model_has_encoder(model.ptr) and not ll.llama_model_has_decoder(model.ptr)
        )

    def _context(self, n_ctx: int, n_threads: int, pooling: int) -> Any:
        params = ll.llama_context_default_params()
        params.n_ctx = params.n_batch = params.n_ubatch = n_ctx
        params.n_seq_max = 1
        params.embeddings = True
        params.pooling_type = pooling
        params.n_threads = params.n_threads_batch = n_threads or os.cpu_count() or 1
        params.no_perf = True
        ptr = ll.llama_init_from_model(self.model.ptr, params)
        if not ptr:
            raise EngineError("llama.cpp could not create an embedding context (out of memory?)")
        return ptr

    def _stopped(self) -> bool:
        stop = self._stop
        return stop is not None and stop.is_set()

    def embed(self, tokens: list[int], stop: threading.Event | None = None) -> np.ndarray:
        """The pooled embedding of ``tokens`` (at most n_ctx of them), L2-normalised;
        Cancelled when ``stop`` is set before it is done."""
        if not 0 < len(tokens) <= self.n_ctx:
            raise EngineError(f"{len(tokens)} tokens do not fit the embedding context")
        ll.llama_memory_clear(self.mem, True)
        batch = self._batch
        for i, tok in enumerate(tokens):
            batch.token[i] = tok
            batch.pos[i] = i
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = 1
        batch.n_tokens = len(tokens)
        run = ll.llama_encode if self._encode else ll.llama_decode
        self._stop = stop
        try:
            ret = run(self.ptr, batch)
        finally:
            self._stop = None
        if ret == ABORTED or (ret != 0 and stop is not None and stop.is_set()):
            raise Cancelled("the embedding was stopped")
        if ret != 0:
            raise EngineError(f"embedding failed with code {ret}")
        ptr = ll.llama_get_embeddings_seq(self.ptr, 0)
        if not ptr:
            raise EngineError("llama.cpp returned no pooled embedding")
        n_embd = int(ll.llama_model_n_embd(self.model.ptr))
        vector = np.ctypeslib.as_array(ptr, shape=(n_embd,)).astype(np.float64)
        norm = float(np.linalg.norm(vector))
        return vector / norm if norm > 0 else vector

    def close(self) -> None:
        if self.ptr:
            ll.llama_batch_free(self._batch)
            ll.llama_free(self.ptr)
            self.ptr = None


def llama_version() -> str:
    return str(llama_cpp.__version__)
