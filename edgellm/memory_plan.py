"""How much memory running a model takes, before running it.

The plan adds up what a generation at `context` tokens holds resident at its peak (the
process's VmHWM, and the memory cgroup's peak when the page cache starts cold):
  weights    the file's size. It is mapped, never copied, and a generation reads every
             page of it. They are clean file pages: under memory pressure the kernel drops
             them and reads them again, slower but without running out of memory.
  kv_cache   f32 K and V plus each slot's position, for `context` tokens (a sliding-window
             layer holds its window). Pages are committed as tokens arrive: the figure is
             reached once the context is full.
  buffers    the activation buffers of a prefill chunk and a chunk of logits.
  tokenizer  the tokenizers library's tables built from the embedded tokenizer.json.
  baseline   Python with numpy, numba, llvmlite and tokenizers imported, and every kernel
             loaded from the kernel cache.

Measured with scripts/memory-cap.py on x86-64 (Python 3.11, numpy 2.4, numba 0.68 /
llvmlite 0.50, tokenizers 0.23), kernels already cached:
  - a tiny model (weights, cache and tokenizer all < 1 MiB) peaks at 178 MiB: BASELINE.
    Of it, the imports are ~97 MiB and the loaded kernels ~80 MiB.
  - SmolLM2-135M's tokenizer (1.6 MiB of JSON, 49k tokens and 49k merges) takes 34 MiB:
    ~21 bytes per byte of JSON (TOKENIZER_PER_JSON_BYTE).
  - SmolLM2-135M q4_0 at context 2048, filled (a 1984-token prompt, 64 generated):
    VmHWM 396 MiB; this plan: 405 MiB.
The first run on a machine compiles the kernels and needs more than this (LLVM):
scripts/memory-cap.py --cold measures it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from .config import ModelArgs
from .format import PackedModel

MIB = 2**20
BASELINE = 178 * MIB  # Python + numpy + numba + tokenizers imported, kernels loaded
TOKENIZER_PER_JSON_BYTE = 21
CHUNK = 64  # prefill chunk (arch/base.py's default)
DEFAULT_CONTEXT_CAP = 4096  # the runtime's context without --ctx: min(model's, this)


@dataclass
class MemoryPlan:
    """Bytes: weights (mapped from the file), KV cache, activation buffers, tokenizer,
    runtime baseline."""

    context: int
    weights: int
    kv_cache: int
    kv_cache_no_window: int
    buffers: int
    tokenizer: int = 0
    baseline: int = BASELINE

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache + self.buffers + self.tokenizer + self.baseline

    def to_json(self) -> dict:
        return {**asdict(self), "total": self.total}


def default_context(args: ModelArgs) -> int:
    """The context the runtime uses when none is given (as arch/base.py's Transformer)."""
    return min(args.max_position_embeddings, DEFAULT_CONTEXT_CAP)


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


def tokenizer_bytes(packed: PackedModel) -> int:
    """The tokenizer's tables, estimated from the size of its JSON."""
    text = packed.tokenizer_json or ""
    return TOKENIZER_PER_JSON_BYTE * len(text.encode("utf-8"))


def plan(packed: PackedModel, args: ModelArgs, context: int) -> MemoryPlan:
    """The memory plan of `packed` at `context` tokens."""
    inner = args.intermediate_size
    chunk = max(1, min(CHUNK, context // 2))
    return MemoryPlan(context, packed.file_size, kv_bytes(args, context),
                      kv_bytes(args, context, windows=False), buffer_bytes(args, inner, chunk),
                      tokenizer_bytes(packed))


def largest_context(packed: PackedModel, args: ModelArgs, budget: int) -> int:
    """The largest context (a multiple of 256, at most the model's) whose plan fits `budget`;
    0 if not even 256 tokens fit."""
    limit = args.max_position_embeddings
    if limit < 256:  # a model with a short context: all of it or nothing
        return limit if plan(packed, args, limit).total <= budget else 0
    best, lo, hi = 0, 1, limit // 256
    while lo <= hi:  # a plan grows with its context: bisect on the multiples of 256
        mid = (lo + hi) // 2
        if plan(packed, args, mid * 256).total <= budget:
            best, lo = mid * 256, mid + 1
        else:
            hi = mid - 1
    return best
