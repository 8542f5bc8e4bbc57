"""A Llama GGUF with random weights and a byte-level vocabulary, written offline.

The GPU check runs on a machine that reaches no model hub, and `make bench-peers`
measures at the sizes people run without one, so both make their model: the
geometry of Llama-3-8B or Llama-3.2-1B (or a smaller one for CPU tests), Q8_0
weights drawn once per tensor shape and shared by every layer (the compute costs
the same; the file is written in seconds), and a SentencePiece-style vocabulary of
the 256 byte tokens plus <unk>, <s> and </s>, so any text tokenizes, and Llama 3's
chat markup as control tokens, padded with unused tokens to the real model's size
(the output layer, a fifth of a 1B model's weights, costs a decode step what the real
one's does). The replies are noise; the timings are those of a real model of that
size, and the prompt's structure that of a real chat model: a template of plain text
would make warmstart treat it as a model without turns (no message anchors, replies
re-prefilled in whole batches after they are sent), which no chat model of this size
is. And its replies come back as a real model's do: the output layer's rows of every
token but the printable ASCII bytes and <|eot_id|> are their mean, never the greedy
pick, so a reply is text that tokenizes again into the tokens it was decoded as (a
byte above 0x7F decoded alone is no text, and a space comes back as the three bytes of
SentencePiece's U+2581): the next turn reuses it, as a chat with a real model does.

With the suffix ``-q4km`` (``synth:llama-1b-q4km``) the layers' weights are K-quants as
in the Q4_K_M files most people run (Q4_K, and Q6_K for ``attn_v`` and ``ffn_down``),
random blocks written as they are (no quantizer: their kernels cost what a real file's
do); the embeddings and the output layer stay Q8_0, the replies as above.

    python installers/gpu/synth_gguf.py OUT.gguf [--geometry llama-8b|llama-1b|tiny]
"""

from __future__ import annotations

import os
from collections.abc import Sequence
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
# (3: the vocabulary padded to the real size, replies of printable ASCII)
FORMAT = 3
# the bytes a reply is made of (those that tokenize back into themselves), and the
# first id of the 256 byte tokens
PRINTABLE = range(0x21, 0x7F)
FIRST_BYTE = 3


@dataclass(frozen=True)
class Geometry:
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    n_ff: int
    n_ctx_train: int = 8192
    n_vocab: int = 0  # the real model's vocabulary, padded to (0: the 262 tokens only)

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    def kv_bytes_per_token(self) -> int:
        """f16 K and V of every layer for one token."""
        return 2 * self.n_layer * self.n_head_kv * self.head_dim * 2


GEOMETRIES = {
    # Llama-3-8B: 32 layers, 4096 wide, GQA 32/8, FFN 14336 (about 7.5 GB as Q8_0); the
    # context of Llama-3.1's, so that the restore-or-recompute sweep reaches 16K tokens
    "llama-8b": Geometry(32, 4096, 32, 8, 14336, n_ctx_train=32768, n_vocab=128_256),
    # Llama-3.2-1B: 16 layers, 2048 wide, GQA 32/8, FFN 8192, Llama 3's 128,256 tokens
    # (about 1.5 GB as Q8_0, the embeddings untied)
    "llama-1b": Geometry(16, 2048, 32, 8, 8192, n_vocab=128_256),
    # the default model's (SmolLM2-135M) shape: figures for it where it cannot be fetched
    "smollm2-135m": Geometry(30, 576, 9, 3, 1536, n_vocab=49_152),
    # small enough for a CPU test in a second or two, same shape of model
    "tiny": Geometry(2, 256, 4, 2, 512, n_ctx_train=4096),
}


def vocabulary(n_vocab: int = 0) -> tuple[list[str], list[float], list[int]]:
    """<unk>, <s>, </s>, the 256 byte tokens (every text tokenizes: byte fallback),
    unused tokens up to ``n_vocab`` in all (no text forms them: none of their pieces
    is a token) and the chat markup's control tokens, <|eot_id|> last."""
    from gguf import TokenType

    base = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    unused = [f"<unused{i}>" for i in range(max(0, n_vocab - len(base) - len(CONTROL)))]
    tokens = base + unused + list(CONTROL)
    types = [TokenType.UNKNOWN, TokenType.CONTROL, TokenType.CONTROL] + [TokenType.BYTE] * 256
    types += [TokenType.UNUSED] * len(unused) + [TokenType.CONTROL] * len(CONTROL)
    return tokens, [0.0] * len(tokens), [int(t) for t in types]


def _rows(n_vocab: int, picks: dict[int, int], distinct: np.ndarray, rest: int) -> np.ndarray:
    """An (n_vocab, ...) matrix of ``distinct``'s (quantized) rows: token ``t`` gets
    row ``picks[t]``, every other token row ``rest`` (the file is written in seconds
    whatever the vocabulary: 128K rows are copies, not draws)."""
    import numpy as np

    index = np.full(n_vocab, rest, dtype=np.int64)
    index[list(picks)] = list(picks.values())
    return distinct[index]


def _embeddings(
    tokens: list[str],
    types: list[int],
    n_embd: int,
    rng: np.random.Generator,
    reply_bytes: Sequence[int] = PRINTABLE,
) -> tuple[np.ndarray, np.ndarray]:
    """The token embeddings (a row each but for the unused tokens, which no prompt
    holds) and the output layer, whose rows are the mean of the ``reply_bytes``' and
    <|eot_id|>'s for every other token (never the greedy pick: see the module's doc)."""
    import numpy as np
    from gguf import GGMLQuantizationType, TokenType, quants

    used = [i for i, t in enumerate(types) if t != TokenType.UNUSED]
    embd = _rows(
        len(tokens), {t: k for k, t in enumerate(used)}, _weights((len(used), n_embd), rng), 0
    )
    sampled = [FIRST_BYTE + b for b in reply_bytes] + [tokens.index("<|eot_id|>")]
    rows = rng.standard_normal((len(sampled), n_embd), dtype=np.float32) / np.sqrt(n_embd)
    distinct = np.vstack([rows, rows.mean(axis=0, keepdims=True)])
    q = quants.quantize(distinct, GGMLQuantizationType.Q8_0)
    return embd, _rows(len(tokens), {t: k for k, t in enumerate(sampled)}, q, len(sampled))


def _weights(shape: tuple[int, int], rng: np.random.Generator) -> np.ndarray:
    """Q8_0 bytes of a random (rows, cols) matrix, scaled like a trained layer's."""
    import numpy as np
    from gguf import GGMLQuantizationType, quants

    data = rng.standard_normal(shape, dtype=np.float32) * (1.0 / np.sqrt(shape[1]))
    return quants.quantize(data, GGMLQuantizationType.Q8_0)


# the K-quant mix's suffix, and the bytes of a K-quant block of 256 weights
K_MIX = "-q4km"
_QK_K = 256


def _k_blocks(shape: tuple[int, int], qtype: Any, rng: np.random.Generator) -> np.ndarray:
    """Random Q4_K or Q6_K blocks of a (rows, cols) matrix, as bytes: the quantized
    values and sub-block scales drawn at random, each block's fp16 scale set so that a
    weight is about as large as a trained layer's (1/sqrt(cols))."""
    import numpy as np
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    rows, cols = shape
    block, nbytes = GGML_QUANT_SIZES[qtype]
    assert block == _QK_K and cols % _QK_K == 0, (shape, qtype)
    out = rng.integers(0, 256, size=(rows, cols // _QK_K, nbytes), dtype=np.uint8)
    unit = 1.0 / np.sqrt(cols)
    if qtype == GGMLQuantizationType.Q4_K:  # d, dmin, 12 bytes of 6-bit scales, 128 of nibbles
        d = unit / (31.5 * 4.6)  # a sub-block's scale about 31.5, a nibble's spread 4.6
        out[..., 0:2] = np.frombuffer(np.float16(d).tobytes(), dtype=np.uint8)
        out[..., 2:4] = np.frombuffer(np.float16(7.5 * d).tobytes(), dtype=np.uint8)
    else:  # Q6_K: 128 bytes of low bits, 64 of high bits, 16 int8 scales, d
        out[..., 192:208] = rng.integers(1, 32, size=16, dtype=np.uint8)
        d = unit / (16.0 * 18.5)  # a scale about 16, a 6-bit value's spread 18.5
        out[..., 208:210] = np.frombuffer(np.float16(d).tobytes(), dtype=np.uint8)
    return out.reshape(rows, -1)


def _describe(
    w: Any,
    g: Geometry,
    tokens: list[str],
    scores: list[float],
    types: list[int],
    k_mix: bool = False,
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
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_M if k_mix else gguf.LlamaFileType.MOSTLY_Q8_0)
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


def write(
    path: Path,
    geometry: Geometry,
    seed: int = 0,
    reply_bytes: Sequence[int] = PRINTABLE,
    k_mix: bool = False,
) -> Path:
    """Writes the model to ``path`` (replacing it, whole or not at all: a file that
    exists is complete, and a later step may reuse it) and returns ``path``.
    ``reply_bytes``: the bytes its replies are made of (a test of what a reply of
    UTF-8 lead bytes does asks for those). ``k_mix``: the layers' weights as a Q4_K_M
    file's (see the module's doc)."""
    import gguf
    import numpy as np

    g, rng = geometry, np.random.default_rng(seed)
    tokens, scores, types = vocabulary(g.n_vocab)
    part = path.with_name(path.name + ".part")
    w = gguf.GGUFWriter(str(part), "llama")
    _describe(w, g, tokens, scores, types, k_mix)

    q8 = gguf.GGMLQuantizationType.Q8_0
    q4k, q6k = gguf.GGMLQuantizationType.Q4_K, gguf.GGMLQuantizationType.Q6_K
    kv = g.n_head_kv * g.head_dim
    shared: dict[tuple[int, int, Any], np.ndarray] = {}

    def matrix(rows: int, cols: int, k_type: Any = q4k) -> tuple[np.ndarray, Any]:
        # one draw per shape, shared by every layer: same compute, seconds to write
        qtype = k_type if k_mix else q8
        if (rows, cols, qtype) not in shared:
            shared[(rows, cols, qtype)] = (
                _weights((rows, cols), rng) if qtype == q8 else _k_blocks((rows, cols), qtype, rng)
            )
        return shared[(rows, cols, qtype)], qtype

    def add(name: str, weights: tuple[np.ndarray, Any]) -> None:
        w.add_tensor(name, weights[0], raw_dtype=weights[1])

    ones = np.ones(g.n_embd, dtype=np.float32)
    embd, output = _embeddings(tokens, types, g.n_embd, rng, reply_bytes)
    w.add_tensor("token_embd.weight", embd, raw_dtype=q8)
    for i in range(g.n_layer):
        b = f"blk.{i}."
        w.add_tensor(b + "attn_norm.weight", ones)
        add(b + "attn_q.weight", matrix(g.n_embd, g.n_embd))
        add(b + "attn_k.weight", matrix(kv, g.n_embd))
        add(b + "attn_v.weight", matrix(kv, g.n_embd, q6k))
        add(b + "attn_output.weight", matrix(g.n_embd, g.n_embd))
        w.add_tensor(b + "ffn_norm.weight", ones)
        add(b + "ffn_gate.weight", matrix(g.n_ff, g.n_embd))
        add(b + "ffn_up.weight", matrix(g.n_ff, g.n_embd))
        add(b + "ffn_down.weight", matrix(g.n_embd, g.n_ff, q6k))
    w.add_tensor("output_norm.weight", ones)
    w.add_tensor("output.weight", output, raw_dtype=q8)

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
    shape = geometry.removesuffix(K_MIX)
    if shape not in GEOMETRIES:
        known = ", ".join(PREFIX + name for name in sorted(GEOMETRIES))
        raise ModelNotFound(
            f"no synthetic model {PREFIX}{geometry}: choose from {known} "
            f"(each also as Q4_K_M: {PREFIX}<name>{K_MIX})"
        )
    k_mix, g = geometry.endswith(K_MIX), GEOMETRIES[shape]
    if k_mix and (g.n_embd % _QK_K or g.n_ff % _QK_K):
        raise ModelNotFound(
            f"no synthetic model {PREFIX}{geometry}: its rows ({g.n_embd}, {g.n_ff} wide) "
            f"are no whole K-quant blocks of {_QK_K}"
        )
    path = folder / f"synthetic-{geometry}-v{FORMAT}.gguf"
    if path.is_file():
        return path
    return write(path, g, k_mix=k_mix)
