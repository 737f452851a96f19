"""How much memory running a model takes, before running it."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from .config import ModelArgs
from .format import PackedModel

RUNTIME_BASELINE = 110 * 2**20  # Python + numpy + numba + tokenizers, measured at import
CHUNK = 64


@dataclass
class MemoryPlan:
    """Bytes: weights (mapped from the file), KV cache, activation buffers, baseline."""

    context: int
    weights: int
    kv_cache: int
    kv_cache_no_window: int
    buffers: int
    baseline: int = RUNTIME_BASELINE

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache + self.buffers + self.baseline

    def to_json(self) -> dict:
        return {**asdict(self), "total": self.total}


def kv_bytes(args: ModelArgs, context: int, windows: bool = True) -> int:
    """f32 K and V (+ int64 slot positions) for every layer at `context` tokens."""
    per_pos = 2 * args.num_key_value_heads * args.head_dim * 4 + 8
    total = 0
    for i in range(args.num_hidden_layers):
        w = args.layer_window(i) if windows else 0
        total += per_pos * (min(w, context) if w else context)
    return total


def buffer_bytes(args: ModelArgs, inner: int, chunk: int = CHUNK) -> int:
    """Activation buffers for a chunk of tokens, plus one chunk of logits."""
    qd = args.num_attention_heads * args.head_dim
    kvd = args.num_key_value_heads * args.head_dim
    per_row = 2 * args.hidden_size + 2 * qd + 2 * kvd + 3 * inner + args.vocab_size
    return 4 * chunk * per_row + chunk * args.hidden_size * 2


def plan(packed: PackedModel, args: ModelArgs, context: int) -> MemoryPlan:
    """The memory plan of `packed` at `context` tokens."""
    inner = args.intermediate_size
    return MemoryPlan(context, packed.file_size, kv_bytes(args, context),
                      kv_bytes(args, context, windows=False), buffer_bytes(args, inner))


def largest_context(packed: PackedModel, args: ModelArgs, budget: int) -> int:
    """The largest context (a multiple of 256, at most the model's) whose plan fits `budget`."""
    best, ctx = 0, 256
    while ctx <= args.max_position_embeddings and plan(packed, args, ctx).total <= budget:
        best, ctx = ctx, ctx + 256
    return best
