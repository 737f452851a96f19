"""BERT-family encoders (transformers' BertModel; RoBERTa / XLM-R position offsets).

    x = LN(word[ids] + position[pos] + token_type[0])                   embeddings
    per layer (post-LayerNorm):
      a = softmax(q k^T / sqrt(Dh)) v   q, k, v = x W + b, within each sequence only
      x = LN(x + a W_o + b_o)
      x = LN(x + gelu(x W_i + b_i) W_out + b_out)                        exact (erf) GELU
    hidden states [T, D] = x (sentence-transformers' token_embeddings)

Task heads, when the checkpoint has them (transformers' *ForSequenceClassification,
*ForTokenClassification; dropout is the identity at inference):
    BERT sequence     logits [n, L] = classifier(tanh(pooler(x[first token])))
    RoBERTa sequence  logits [n, L] = out_proj(tanh(dense(x[first token])))
    token             logits [T, L] = classifier(x)

A batch is packed: the sequences' tokens are concatenated ([T, D], no padding) and
`offsets` [n + 1] marks where each starts, so every linear layer is one matrix product
over all T tokens (the panel/matmul prefill kernels) and attention keeps each sequence to
itself. Positions restart at 0 (RoBERTa: at pad_token_id + 1) in every sequence; every
token has token type 0 (one text per sequence).

The linear layers always take float activations (kernels/panel_gemm.py: each weight group
dequantized once per batch into a panel, then register-tiled over all tokens), whatever
the weights' type. Measured on all-MiniLM-L6-v2 at q8_0 (minimum cosine similarity to
sentence-transformers over tests/fixtures/embed/minilm; float activations: 0.99955):
int8 activations on q/k/v and FFN-up 0.9984, on q/k/v alone 0.9989 (LayerNorm's outlier
channels), on FFN-up alone 0.9991, on the attention output and FFN-down 0.9993; int16
ones 0.99955. On an AVX2 machine without VNNI none of them is faster than the float panel
kernel (near the FMA peak): vpmaddwd does 16 products where an FMA does 8 but runs at
half its rate, and an int8 tile on vpmaddubsw (llama.cpp's sign trick) needs sign,
multiply-add, widening and add per 32 products (measured slower).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ContextError, FormatError, ModelKindError
from ..kernels.encoder import add_layernorm, bias_gelu, packed_attention
from ..kernels.linear import embedding, gemm
from ..modelfile.config import ModelArgs
from ..modelfile.format import PackedModel, Tensor
from .spec import ArchSpec
from .uncached import Uncached

MODEL_TYPES = ("bert", "roberta", "xlm-roberta")
_OFFSET_TYPES = ("roberta", "xlm-roberta")  # positions start after the padding index

# Tensor table for edgellm.validate: name -> (role, shape in named dims, required).
VEC, MAT = "vector", "matrix"
GLOBAL = {
    "embeddings.word_embeddings.weight": (MAT, ("vocab", "hidden"), True),
    "embeddings.position_embeddings.weight": (MAT, ("positions", "hidden"), True),
    "embeddings.token_type_embeddings.weight": (MAT, ("types", "hidden"), True),
    "embeddings.LayerNorm.weight": (VEC, ("hidden",), True),
    "embeddings.LayerNorm.bias": (VEC, ("hidden",), True),
}
LAYER = (  # under "encoder.layer.N."
    ("attention.self.query.weight", MAT, ("q", "hidden")),
    ("attention.self.query.bias", VEC, ("q",)),
    ("attention.self.key.weight", MAT, ("q", "hidden")),
    ("attention.self.key.bias", VEC, ("q",)),
    ("attention.self.value.weight", MAT, ("q", "hidden")),
    ("attention.self.value.bias", VEC, ("q",)),
    ("attention.output.dense.weight", MAT, ("hidden", "q")),
    ("attention.output.dense.bias", VEC, ("hidden",)),
    ("attention.output.LayerNorm.weight", VEC, ("hidden",)),
    ("attention.output.LayerNorm.bias", VEC, ("hidden",)),
    ("intermediate.dense.weight", MAT, ("inter", "hidden")),
    ("intermediate.dense.bias", VEC, ("inter",)),
    ("output.dense.weight", MAT, ("hidden", "inter")),
    ("output.dense.bias", VEC, ("hidden",)),
    ("output.LayerNorm.weight", VEC, ("hidden",)),
    ("output.LayerNorm.bias", VEC, ("hidden",)),
)
# Task heads, kept by the converter when the config's architecture has one (optional: a
# file without them still embeds). name -> (role, shape).
HEADS = {
    "pooler.dense.weight": (MAT, ("hidden", "hidden")),  # BERT sequence classification
    "pooler.dense.bias": (VEC, ("hidden",)),
    "classifier.weight": (MAT, ("labels", "hidden")),  # BERT sequence, any token classifier
    "classifier.bias": (VEC, ("labels",)),
    "classifier.dense.weight": (MAT, ("hidden", "hidden")),  # RoBERTa sequence classification
    "classifier.dense.bias": (VEC, ("hidden",)),
    "classifier.out_proj.weight": (MAT, ("labels", "hidden")),
    "classifier.out_proj.bias": (VEC, ("labels",)),
}
TASKS = {"ForSequenceClassification": "sequence", "ForTokenClassification": "token"}


def task(config: dict) -> str | None:
    """"sequence", "token" or None: the head the config's `architectures` names."""
    archs = config.get("architectures")
    for a in archs if isinstance(archs, list) else []:
        for suffix, kind in TASKS.items():
            if isinstance(a, str) and a.endswith(suffix):
                return kind
    return None


def expected_tensors(args: ModelArgs):
    """(name, role, named shape, required) of every tensor, as validate.expected_tensors."""
    for name, (role, shape, required) in GLOBAL.items():
        yield name, role, shape, required
    for name, (role, shape) in HEADS.items():
        yield name, role, shape, False
    for i in range(args.num_hidden_layers):
        for name, role, shape in LAYER:
            yield f"encoder.layer.{i}.{name}", role, shape, True


def dims(args: ModelArgs) -> dict[str, int]:
    """The named dimensions of expected_tensors ("labels": free without id2label)."""
    labels = args.extra.get("id2label")
    return {"vocab": args.vocab_size, "hidden": args.hidden_size,
            "q": args.num_attention_heads * args.head_dim, "inter": args.intermediate_size,
            "positions": args.max_position_embeddings,
            "types": int(args.extra.get("type_vocab_size") or 2),
            "labels": len(labels) if isinstance(labels, dict) and labels else None}


def check_config(where: str, args: ModelArgs) -> None:
    """What the encoder needs of its config beyond ModelArgs' checks."""
    a = args
    if a.num_key_value_heads != a.num_attention_heads or \
            a.head_dim * a.num_attention_heads != a.hidden_size:
        raise FormatError(f"{where}: {a.model_type} config: {a.num_attention_heads} heads do "
                          f"not split hidden_size {a.hidden_size} evenly")
    act = a.hidden_act
    if act not in ("gelu", "gelu_python"):
        raise FormatError(f"{where}: {a.model_type} config: hidden_act {act!r} is not "
                          "supported (gelu)")
    kind = a.extra.get("position_embedding_type", "absolute")
    if kind not in (None, "absolute"):
        raise FormatError(f"{where}: {a.model_type} config: position_embedding_type {kind!r} "
                          "is not supported (absolute)")
    eps = a.extra.get("layer_norm_eps", 1e-12)
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 < eps < 1:
        raise FormatError(f"{where}: {a.model_type} config: layer_norm_eps is {eps!r}")
    pad = a.extra.get("pad_token_id")
    if a.model_type in _OFFSET_TYPES and (isinstance(pad, bool) or not isinstance(pad, int)
                                          or not 0 <= pad < a.max_position_embeddings - 2):
        raise FormatError(f"{where}: {a.model_type} config: pad_token_id is {pad!r}")


@dataclass
class EncoderLayer:
    q: Tensor
    q_bias: np.ndarray
    k: Tensor
    k_bias: np.ndarray
    v: Tensor
    v_bias: np.ndarray
    o: Tensor
    o_bias: np.ndarray
    ln1_w: np.ndarray
    ln1_b: np.ndarray
    up: Tensor
    up_bias: np.ndarray
    down: Tensor
    down_bias: np.ndarray
    ln2_w: np.ndarray
    ln2_b: np.ndarray


class EncoderBuffers:
    """Activations for up to `rows` packed tokens, allocated once per size (grown on demand)."""

    def __init__(self, rows: int, D: int, F: int):
        f32 = np.float32
        self.rows = rows
        self.x = np.zeros((rows, D), f32)  # the hidden states
        self.h = np.zeros((rows, D), f32)  # a layer's output before the residual
        self.q = np.zeros((rows, D), f32)
        self.k = np.zeros((rows, D), f32)
        self.v = np.zeros((rows, D), f32)
        self.attn = np.zeros((rows, D), f32)
        self.ffn = np.zeros((rows, F), f32)


class Bert(Uncached):
    """A BERT-family encoder over packed weights: `encode(ids, offsets)` -> hidden states."""

    generates = False  # LLM refuses generate() on it

    def __init__(self, packed: PackedModel, args: ModelArgs, precise: bool = False,
                 context: int | None = None, chunk: int = 64):
        self.packed, self.args, self.precise = packed, args, precise
        check_config(str(packed.path), args)
        extra = args.extra
        self.eps = float(extra.get("layer_norm_eps", 1e-12))
        self.position_offset = int(extra["pad_token_id"]) + 1 \
            if args.model_type in _OFFSET_TYPES else 0
        self.context = args.max_position_embeddings - self.position_offset  # longest sequence
        if context is not None:
            self.context = min(self.context, int(context))
        self.word = self._matrix("embeddings.word_embeddings.weight")
        self.position = self._matrix("embeddings.position_embeddings.weight")
        types = self._matrix("embeddings.token_type_embeddings.weight")
        self.type_table = np.zeros((types.shape[0], args.hidden_size), np.float32)  # [types, D]
        embedding(types, np.arange(types.shape[0], dtype=np.int64), self.type_table)
        self.type0 = self.type_table[0]
        self.zero = np.zeros(args.hidden_size, np.float32)
        self.ln_w = self._vector("embeddings.LayerNorm.weight")
        self.ln_b = self._vector("embeddings.LayerNorm.bias")
        self.layers = [self._layer(i) for i in range(args.num_hidden_layers)]
        self.scale = 1.0 / float(np.sqrt(args.head_dim))
        self.buffers: EncoderBuffers | None = None
        self.task = task(packed.config)
        self.head = self._head() if self.task else None

    def _matrix(self, name: str) -> Tensor:
        return self.packed.tensor(name)

    def _vector(self, name: str) -> np.ndarray:
        t = self.packed.tensor(name)
        if t.type != "f32" or len(t.shape) != 1:
            raise FormatError(f"{self.packed.path}: tensor {name} must be an f32 vector")
        return t.data

    def _layer(self, i: int) -> EncoderLayer:
        p = f"encoder.layer.{i}."
        m, v = self._matrix, self._vector
        return EncoderLayer(
            q=m(p + "attention.self.query.weight"), q_bias=v(p + "attention.self.query.bias"),
            k=m(p + "attention.self.key.weight"), k_bias=v(p + "attention.self.key.bias"),
            v=m(p + "attention.self.value.weight"), v_bias=v(p + "attention.self.value.bias"),
            o=m(p + "attention.output.dense.weight"),
            o_bias=v(p + "attention.output.dense.bias"),
            ln1_w=v(p + "attention.output.LayerNorm.weight"),
            ln1_b=v(p + "attention.output.LayerNorm.bias"),
            up=m(p + "intermediate.dense.weight"), up_bias=v(p + "intermediate.dense.bias"),
            down=m(p + "output.dense.weight"), down_bias=v(p + "output.dense.bias"),
            ln2_w=v(p + "output.LayerNorm.weight"), ln2_b=v(p + "output.LayerNorm.bias"))

    def _head(self) -> dict | None:
        """The task head's tensors by role, or None when the file has not all of them."""
        p = self.packed
        if self.task == "token":
            names = {"out": "classifier.weight", "out_bias": "classifier.bias"}
        elif "classifier.out_proj.weight" in p:
            names = {"dense": "classifier.dense.weight", "dense_bias": "classifier.dense.bias",
                     "out": "classifier.out_proj.weight", "out_bias": "classifier.out_proj.bias"}
        else:
            names = {"dense": "pooler.dense.weight", "dense_bias": "pooler.dense.bias",
                     "out": "classifier.weight", "out_bias": "classifier.bias"}
        if not all(n in p for n in names.values()):
            return None
        return {role: self._vector(n) if role.endswith("bias") else self._matrix(n)
                for role, n in names.items()}

    @property
    def num_labels(self) -> int:
        return self.head["out"].shape[0] if self.head else 0

    def classify(self, ids: np.ndarray, offsets: np.ndarray,
                 types: np.ndarray | None = None) -> np.ndarray:
        """Logits float32 [n, labels] of each sequence of a packed batch (as encode; the
        sequence head on each sequence's first token)."""
        assert self.task == "sequence" and self.head is not None
        x = self.encode(ids, offsets, types)
        first = np.ascontiguousarray(x[np.asarray(offsets[:-1], np.int64)])  # [n, D]
        h = self.head
        pooled = np.empty_like(first)
        gemm(h["dense"], first, pooled)
        np.tanh(pooled + h["dense_bias"], out=pooled)
        logits = np.empty((first.shape[0], self.num_labels), np.float32)
        gemm(h["out"], pooled, logits)
        return logits + h["out_bias"]

    def tag(self, ids: np.ndarray, offsets: np.ndarray) -> np.ndarray:
        """Logits float32 [T, labels] of every token of a packed batch (as encode)."""
        assert self.task == "token" and self.head is not None
        x = self.encode(ids, offsets)
        logits = np.empty((x.shape[0], self.num_labels), np.float32)
        gemm(self.head["out"], x, logits)
        return logits + self.head["out_bias"]

    def _buffers(self, T: int) -> EncoderBuffers:
        b = self.buffers
        if b is None or b.rows < T:
            rows = max(T, 2 * b.rows if b is not None else 0)
            b = self.buffers = EncoderBuffers(rows, self.args.hidden_size,
                                              self.args.intermediate_size)
        return b

    def encode(self, ids: np.ndarray, offsets: np.ndarray,
               types: np.ndarray | None = None) -> np.ndarray:
        """Hidden states float32 [T, D] of a packed batch (a view of an internal buffer,
        valid until the next call). ids: int64 [T], the sequences one after another;
        offsets: int64 [n + 1], sequence s is ids[offsets[s]:offsets[s + 1]]; types: int64
        [T] token types (None: all 0)."""
        ids = np.ascontiguousarray(ids, dtype=np.int64).reshape(-1)
        offsets = np.ascontiguousarray(offsets, dtype=np.int64).reshape(-1)
        T = ids.size
        lengths = np.diff(offsets)
        if offsets.size < 2 or offsets[0] != 0 or offsets[-1] != T or (lengths <= 0).any():
            raise ContextError("offsets must rise strictly from 0 to the number of tokens")
        if lengths.max() > self.context:
            raise ContextError(f"a sequence of {int(lengths.max())} tokens is longer than "
                               f"the model's {self.context} positions")
        bad = (ids < 0) | (ids >= self.args.vocab_size)
        if bad.any():
            raise ContextError(f"token id {int(ids[bad][0])} is outside the vocabulary "
                               f"(0..{self.args.vocab_size - 1})")
        a, b = self.args, self._buffers(T)
        x, h = b.x[:T], b.h[:T]
        # each token's position within its own sequence
        positions = np.arange(T, dtype=np.int64) - np.repeat(offsets[:-1], lengths)
        embedding(self.word, ids, x)
        embedding(self.position, positions + self.position_offset, h)
        if types is None:
            add_layernorm(x, h, self.type0, self.ln_w, self.ln_b, self.eps)
        else:
            h += self.type_table[self._types(types, T)]
            add_layernorm(x, h, self.zero, self.ln_w, self.ln_b, self.eps)
        H, Dh = a.num_attention_heads, a.head_dim
        q, k, v, attn, ffn = b.q[:T], b.k[:T], b.v[:T], b.attn[:T], b.ffn[:T]
        for w in self.layers:
            gemm(w.q, x, q)
            gemm(w.k, x, k)
            gemm(w.v, x, v)
            q += w.q_bias
            k += w.k_bias
            v += w.v_bias
            packed_attention(q.reshape(T, H, Dh), k.reshape(T, H, Dh), v.reshape(T, H, Dh),
                             offsets, self.scale, attn.reshape(T, H, Dh))
            gemm(w.o, attn, h)
            add_layernorm(x, h, w.o_bias, w.ln1_w, w.ln1_b, self.eps)
            gemm(w.up, x, ffn)
            bias_gelu(ffn, w.up_bias)
            gemm(w.down, ffn, h)
            add_layernorm(x, h, w.down_bias, w.ln2_w, w.ln2_b, self.eps)
        return x

    def _types(self, types, T: int) -> np.ndarray:
        types = np.asarray(types, dtype=np.int64).reshape(-1)
        if types.size != T or types.min() < 0 or types.max() >= len(self.type_table):
            raise ContextError(f"token types must be {T} values in 0..{len(self.type_table) - 1}")
        return types

    # what LLM calls on every model -------------------------------------------------------
    def forward(self, tokens, want: str = "all", shift: bool = True):
        raise ModelKindError(f"{self.packed.path}: {self.args.model_type} is an encoder: it "
                             "computes embeddings (embed()), not next-token logits")

    def warmup(self, between=None) -> None:
        """Run the encoder once (compiles or loads every kernel it uses); then `between()`
        (as Transformer.warmup's)."""
        self.encode(np.zeros(4, np.int64), np.array([0, 2, 4], np.int64))
        if between is not None:
            between()


SPEC = ArchSpec(model_types=MODEL_TYPES, family="bert", model=Bert, tensors=(),
                expected=expected_tensors, dims=dims, check=check_config)
