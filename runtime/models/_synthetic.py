"""A Llama GGUF with random weights and a byte-level vocabulary, written offline.

The GPU check runs on a machine that reaches no model hub, and `make bench-peers`
measures at the sizes people run without one, so both make their model: the
geometry of Llama-3-8B or Llama-3.2-1B (or a smaller one for CPU tests), Q8_0
weights drawn once per tensor shape and shared by every layer (the compute costs
the same; the file is written in seconds), and a SentencePiece-style vocabulary of
the 256 byte tokens plus <unk>, <s> and </s>, so any text tokenizes, and Llama 3's
chat markup as control tokens. The replies are noise; the timings are those of a
real model of that size, and the prompt's structure that of a real chat model: a
template of plain text would make warmstart treat it as a model without turns (no
message anchors, replies re-prefilled in whole batches after they are sent), which
no chat model of this size is.

    python installers/gpu/synth_gguf.py OUT.gguf [--geometry llama-8b|llama-1b|tiny]
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ModelNotFound

if TYPE_CHECKING:
    import numpy as np

# Llama 3's markup (its turn headers and end of turn are control tokens, as here)
CONTROL = ("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")
CHAT_TEMPLATE = (
    "{% for message in messages %}<|start_header_id|>{{ message['role'] }}"
    "<|end_header_id|>\n\n{{ message['content'] }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n"
    "{% endif %}"
)
# the version of what `write` produces: a cached file of another one is written again
FORMAT = 2


@dataclass(frozen=True)
class Geometry:
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    n_ff: int
    n_ctx_train: int = 8192

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    def kv_bytes_per_token(self) -> int:
        """f16 K and V of every layer for one token."""
        return 2 * self.n_layer * self.n_head_kv * self.head_dim * 2


GEOMETRIES = {
    # Llama-3-8B: 32 layers, 4096 wide, GQA 32/8, FFN 14336 (about 7.5 GB as Q8_0); the
    # context of Llama-3.1's, so that the restore-or-recompute sweep reaches 16K tokens
    "llama-8b": Geometry(32, 4096, 32, 8, 14336, n_ctx_train=32768),
    # Llama-3.2-1B: 16 layers, 2048 wide, GQA 32/8, FFN 8192 (about 1 GB as Q8_0)
    "llama-1b": Geometry(16, 2048, 32, 8, 8192),
    # the default model's (SmolLM2-135M) shape: figures for it where it cannot be fetched
    "smollm2-135m": Geometry(30, 576, 9, 3, 1536),
    # small enough for a CPU test in a second or two, same shape of model
    "tiny": Geometry(2, 256, 4, 2, 512, n_ctx_train=4096),
}


def vocabulary() -> tuple[list[str], list[float], list[int]]:
    """<unk>, <s>, </s>, the 256 byte tokens (every text tokenizes: byte fallback) and
    the chat markup's control tokens."""
    from gguf import TokenType

    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + list(CONTROL)
    types = [TokenType.UNKNOWN, TokenType.CONTROL, TokenType.CONTROL]
    types += [TokenType.BYTE] * 256 + [TokenType.CONTROL] * len(CONTROL)
    return tokens, [0.0] * len(tokens), [int(t) for t in types]


def _weights(shape: tuple[int, int], rng: np.random.Generator) -> np.ndarray:
    """Q8_0 bytes of a random (rows, cols) matrix, scaled like a trained layer's."""
    import numpy as np
    from gguf import GGMLQuantizationType, quants

    data = rng.standard_normal(shape, dtype=np.float32) * (1.0 / np.sqrt(shape[1]))
    return quants.quantize(data, GGMLQuantizationType.Q8_0)


def _describe(
    w: Any, g: Geometry, tokens: list[str], scores: list[float], types: list[int]
) -> None:
    """The header's metadata: the geometry, the tokenizer and the chat template."""
    import gguf

    w.add_name(f"warmstart synthetic llama {g.n_layer}x{g.n_embd}")
    w.add_context_length(g.n_ctx_train)
    w.add_embedding_length(g.n_embd)
    w.add_block_count(g.n_layer)
    w.add_feed_forward_length(g.n_ff)
    w.add_head_count(g.n_head)
    w.add_head_count_kv(g.n_head_kv)
    w.add_rope_dimension_count(g.head_dim)
    w.add_rope_freq_base(500000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_eot_token_id(tokens.index("<|eot_id|>"))
    w.add_add_bos_token(True)
    w.add_chat_template(CHAT_TEMPLATE)


def write(path: Path, geometry: Geometry, seed: int = 0) -> Path:
    """Writes the model to ``path`` (replacing it, whole or not at all: a file that
    exists is complete, and a later step may reuse it) and returns ``path``."""
    import gguf
    import numpy as np

    g, rng = geometry, np.random.default_rng(seed)
    tokens, scores, types = vocabulary()
    part = path.with_name(path.name + ".part")
    w = gguf.GGUFWriter(str(part), "llama")
    _describe(w, g, tokens, scores, types)

    q8 = gguf.GGMLQuantizationType.Q8_0
    n_vocab, kv = len(tokens), g.n_head_kv * g.head_dim
    shared: dict[tuple[int, int], np.ndarray] = {}

    def matrix(rows: int, cols: int) -> np.ndarray:
        # one draw per shape, shared by every layer: same compute, seconds to write
        if (rows, cols) not in shared:
            shared[(rows, cols)] = _weights((rows, cols), rng)
        return shared[(rows, cols)]

    ones = np.ones(g.n_embd, dtype=np.float32)
    w.add_tensor("token_embd.weight", matrix(n_vocab, g.n_embd), raw_dtype=q8)
    for i in range(g.n_layer):
        b = f"blk.{i}."
        w.add_tensor(b + "attn_norm.weight", ones)
        w.add_tensor(b + "attn_q.weight", matrix(g.n_embd, g.n_embd), raw_dtype=q8)
        w.add_tensor(b + "attn_k.weight", matrix(kv, g.n_embd), raw_dtype=q8)
        w.add_tensor(b + "attn_v.weight", matrix(kv, g.n_embd), raw_dtype=q8)
        w.add_tensor(b + "attn_output.weight", matrix(g.n_embd, g.n_embd), raw_dtype=q8)
        w.add_tensor(b + "ffn_norm.weight", ones)
        w.add_tensor(b + "ffn_gate.weight", matrix(g.n_ff, g.n_embd), raw_dtype=q8)
        w.add_tensor(b + "ffn_up.weight", matrix(g.n_ff, g.n_embd), raw_dtype=q8)
        w.add_tensor(b + "ffn_down.weight", matrix(g.n_embd, g.n_ff), raw_dtype=q8)
    w.add_tensor("output_norm.weight", ones)
    w.add_tensor("output.weight", matrix(n_vocab, g.n_embd), raw_dtype=q8)

    path.parent.mkdir(parents=True, exist_ok=True)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(part, path)
    return path


PREFIX = "synth:"  # how a model name asks for one of these, e.g. synth:llama-1b


def synthetic_name(name: str) -> str | None:
    """The geometry a model name asks for (``synth:llama-1b``), or None if it names none."""
    return name[len(PREFIX) :] if name.startswith(PREFIX) else None


def synthetic_model(geometry: str, folder: Path) -> Path:
    """The synthetic model of that geometry in ``folder``, written on first use (about a
    second a GB) and reused after; the file's name carries FORMAT, so a file written
    by another version of this module is never taken for this one's."""
    if geometry not in GEOMETRIES:
        known = ", ".join(PREFIX + name for name in sorted(GEOMETRIES))
        raise ModelNotFound(f"no synthetic model {PREFIX}{geometry}: choose from {known}")
    path = folder / f"synthetic-{geometry}-v{FORMAT}.gguf"
    return path if path.is_file() else write(path, GEOMETRIES[geometry])
