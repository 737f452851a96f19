"""How much memory running a model takes, before running it.

The plan predicts the peak resident set of a generation at `context` tokens: the process's
VmHWM (anonymous memory, the KV cache's shared mapping, and the pages of the files it maps:
the weights and the libraries). What a board must have free for it.
  weights    the file's size. It is mapped, never copied, and a generation reads every
             page of it. They are clean file pages: under memory pressure the kernel drops
             them and reads them again, slower but without running out of memory.
  kv_cache   K and V as the cache stores them (f16, the default; f32: twice; q8_0: 34
             bytes per 32 values) plus each slot's position, for `context` tokens (a
             sliding-window layer holds its window). Pages are committed as tokens
             arrive: the figure is reached once the context is full.
  buffers    the activation buffers: a prefill chunk's rows and logits, and the one-token
             decode step's rows and per-thread scratch (for PLAN_THREADS threads); with an
             f16 cache, one layer's K and V as float32 for a prefill chunk's attention.
  tokenizer  the tokenizers library's tables, built from the file's stored tokenizer
             (tokenizer_store.py); for a file with the tokenizer.json text in its header
             (format version 1), that text as well, which the header keeps.
  baseline   Python with numpy, numba, llvmlite and tokenizers imported, and every kernel
             loaded from the kernel cache, as the command line loads them: the tokenizer
             first, the fused step's kernel before any weight is read, and LLVM's library
             pages that loading kernels touches (~66 MiB, clean file pages) released
             before and after the weights are (kernels/warmup.py: release_compiler_pages).
             A program of its own that loads kernels without releasing them: ~66 MiB more.

A memory cgroup's peak (memory.peak, v1 memory.max_usage_in_bytes) is another figure: it
also counts the page cache of the files the run read (Python's modules, the kernel cache,
readahead), ~150 MiB more, which the kernel reclaims first; and on a shared machine it
leaves out file pages that other processes touched first. Under a cap it fills up to the
cap without an OOM kill. scripts/memory-cap.py reports both.

Measured on x86-64 (Python 3.11, numpy 2.4, numba 0.68 / llvmlite 0.50, tokenizers 0.23),
kernels already cached:
  - the imports: Python 10 MiB, numpy +15, numba +65 (36 of them libllvmlite.so's pages,
    touched by LLVM's start-up), edgellm +12; loading the kernels from the cache +~13 MiB
    of heap (numba_loading.py: without numba's registries and the libraries' parsed
    linking modules; +~28 MiB before) and ~35 more of LLVM's pages. SmolLM2-135M (q4_1,
    fused step, 2 threads) generating 64 tokens after 119 at --ctx 512 peaks at 204 MiB
    (VmHWM; load average 0.3): the weights 92.6, the KV cache's 183 tokens 8.1, buffers
    (planned 14.7, ~6 touched), tokenizer 12.0, and ~76-85 of runtime; BASELINE (88 MiB)
    keeps a few MiB of slack over that. Before numba_loading.py: 219 MiB; before the
    release and the tokenizer-first order: 314 MiB.
  - the tokenizer (benchmarks/tokenizer_memory.py), built from its stored tables
    (tokenizer_store.py: tokenizers.models.BPE, then malloc_trim): SmolLM2-135M's (49k
    tokens, 49k merges) 11-12 MiB, Gemma 3's (262k tokens, 514k merges) 72 MiB, of which
    the merges 2.2 and 15.3 MiB: ~224 bytes per token (TOKENIZER_PER_TOKEN) and ~32 per
    merge (TOKENIZER_PER_MERGE). Built from a stored tokenizer.json (kind "json"): ~8
    bytes per byte of JSON; from the header's text of a version 1 file, which the header
    keeps in memory too: ~11 (Gemma 3's 15.2 MiB of JSON: 161 MiB). Before format
    version 2, the header's JSON and the parse's transient left in the heap cost SmolLM2
    41 MiB and Gemma 3 421 MiB.
  - SmolLM2-135M q4_0 at context 2048, filled (a 1984-token prompt, 64 generated):
    VmHWM 386 MiB, its plan 392 MiB (+1.7%), both before the release above (not
    measured again since).
tests/test_memory_plan.py checks the KV cache and buffer terms against the arrays the
runtime allocates. The first run on a machine compiles the kernels and needs more than
this (LLVM): scripts/memory-cap.py --cold measures it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from .cache.kv_types import DEFAULT_KV_TYPE, kv_row_bytes
from .modelfile.config import ModelArgs
from .modelfile.format import PackedModel

MIB = 2**20
BASELINE = 88 * MIB  # Python + numpy + numba + tokenizers imported, kernels loaded (CLI)
TOKENIZER_PER_TOKEN = 224  # tables built from stored "bpe" tables
TOKENIZER_PER_MERGE = 32
TOKENIZER_PER_JSON_BYTE = 8  # built from a stored tokenizer.json
TOKENIZER_PER_HEADER_JSON_BYTE = 11  # built from the header's text, which stays in memory
CHUNK = 128  # prefill chunk, tokens (the default of arch/base.py and LLM)
LOGIT_ROWS = 64  # rows of arch/base.py's logits scratch (want="all" runs the head in pieces)
DEFAULT_CONTEXT_CAP = 4096  # the runtime's context without --ctx: min(model's, this)
PLAN_THREADS = 4  # decode scratch is per thread: planned for a Pi's 4 cores


@dataclass
class MemoryPlan:
    """Bytes: weights (mapped from the file), KV cache, activation buffers, tokenizer,
    runtime baseline."""

    context: int
    kv_type: str
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


def kv_bytes(args: ModelArgs, context: int, windows: bool = True,
             kv_type: str = DEFAULT_KV_TYPE) -> int:
    """K and V stored as kv_type (+ int64 slot positions) for every layer at `context`
    tokens."""
    per_pos = 2 * args.num_key_value_heads * kv_row_bytes(kv_type, args.head_dim) + 8
    total = 0
    for i in range(args.num_hidden_layers):
        w = args.layer_window(i) if windows else 0
        total += per_pos * (min(w, context) if w else context)
    return total


def prefill_rows_bytes(args: ModelArgs, context: int, kv_type: str = DEFAULT_KV_TYPE) -> int:
    """An f16 cache's float32 rows for a prefill chunk's attention (kv_cache.F32Rows): one
    layer's K and V at its largest capacity; 0 for the other types."""
    if kv_type != "f16":
        return 0
    caps = [min(w, context) if w else context
            for w in (args.layer_window(i) for i in range(args.num_hidden_layers))]
    return 2 * max(caps) * args.num_key_value_heads * args.head_dim * 4


def buffer_bytes(args: ModelArgs, inner: int, chunk: int = CHUNK, context: int = 0,
                 threads: int = PLAN_THREADS) -> int:
    """Activation buffers: a prefill chunk's and the one-token decode step's."""
    return (chunk_buffer_bytes(args, inner, chunk)
            + decode_buffer_bytes(args, inner, context, threads))


def chunk_buffer_bytes(args: ModelArgs, inner: int, chunk: int) -> int:
    """As arch/base.py allocates them: a prefill chunk's f32 rows (x, h, q, k, v, attn,
    gate, up, ffn), its int16 copy of x, and the logits scratch (LOGIT_ROWS rows at most)."""
    D, F, V = args.hidden_size, inner, args.vocab_size
    qd = args.num_attention_heads * args.head_dim
    kvd = args.num_key_value_heads * args.head_dim
    total = 4 * chunk * (2 * D + 2 * qd + 2 * kvd + 3 * F) + 4 * min(chunk, LOGIT_ROWS) * V
    return total + (_act_bytes(chunk, D) if D % 32 == 0 else 0)


def decode_buffer_bytes(args: ModelArgs, inner: int, context: int,
                        threads: int = PLAN_THREADS) -> int:
    """As step/fused.py allocates them (where a model has the fused step; planned for every
    model with int8 activations): the arena of the step's rows (shared, and one normed row
    per thread), the per-thread int16 activation slots and attention scratch, and its tables (the
    program, matrix table and the copies of the norms and biases: bounded, ~32 operations
    per layer)."""
    D, F, V, Dh = args.hidden_size, inner, args.vocab_size, args.head_dim
    if D % 32:
        return 0
    qd = args.num_attention_heads * Dh
    kvd = args.num_key_value_heads * Dh
    L = args.num_hidden_layers
    cap = min(context, max((args.layer_window(i) or context) for i in range(L)))
    Hq, Hkv = args.num_attention_heads, args.num_key_value_heads
    rows = 2 * _pad(D) + 2 * _pad(qd) + 2 * _pad(kvd) + 3 * _pad(F) + _pad(V)
    total = 4 * (rows + threads * _pad(D))  # x h q attn k v gate up ffn logits; private h
    kmax = max(D, qd, F)
    # two act slots per thread: per block of 32 a scale, xds and two sums (ActK's per 16)
    total += threads * 2 * (ACT_ITEM * kmax + 16 * (kmax // 32))
    # per thread: k heads, q heads, a tile of 16 decoded cache rows (dots.LANES); scores
    total += 4 * threads * ((Hkv + Hq + 16) * Dh + (Hq + 1) * max(cap, Hq)) + 24
    return total + fused_table_bytes(args)


def fused_table_bytes(args: ModelArgs) -> int:
    """A bound on the fused step's tables: program rows (step.ops.WIDTH int64 each),
    matrix table, constants, norm and bias copies, layer table and RoPE rows."""
    D, Dh, L = args.hidden_size, args.head_dim, args.num_hidden_layers
    qd = args.num_attention_heads * Dh
    kvd = args.num_key_value_heads * Dh
    ops = 32 * L + 8
    vectors = L * (4 * _pad(D) + _pad(qd) + 2 * _pad(kvd) + 2 * _pad(Dh)) + _pad(D)
    return (8 * 14 * ops + 40 * (8 * L + 1) + 8 * (3 * L + 8) + 4 * vectors
            + 8 * (16 + Dh) + 40 * L + 8 * Dh)


def _pad(n: int) -> int:
    """step/fused.py's regions: whole 64-byte lines of float32."""
    return (n + 15) // 16 * 16


ACT_ITEM = 2  # bytes per activation value: the default int16 blocks (arch/base.py)


def _act_bytes(rows: int, k: int) -> int:
    """kernels/linear.py's ActQ8: int16 rows plus three 4-byte values per block of 32."""
    return rows * k * ACT_ITEM + 3 * 4 * rows * (k // 32)


def tokenizer_bytes(packed: PackedModel) -> int:
    """The tokenizer's tables, estimated from its counts of tokens and merges (or its JSON's
    size), as the header gives them."""
    stored = packed.tokenizer_stored
    if stored is None:
        text = (packed.header.get("tokenizer") or {}).get("json") or ""
        return TOKENIZER_PER_HEADER_JSON_BYTE * len(text.encode("utf-8"))
    if stored["kind"] == "json":
        return TOKENIZER_PER_JSON_BYTE * stored["size"]
    return TOKENIZER_PER_TOKEN * stored["tokens"] + TOKENIZER_PER_MERGE * stored["merges"]


def plan(packed: PackedModel, args: ModelArgs, context: int,
         kv_type: str = DEFAULT_KV_TYPE) -> MemoryPlan:
    """The memory plan of `packed` at `context` tokens with a kv_type cache."""
    inner = args.intermediate_size
    chunk = max(1, min(CHUNK, context // 2))
    return MemoryPlan(context, kv_type, packed.file_size, kv_bytes(args, context, True, kv_type),
                      kv_bytes(args, context, False, kv_type),
                      buffer_bytes(args, inner, chunk, context)
                      + prefill_rows_bytes(args, context, kv_type), tokenizer_bytes(packed))


def largest_context(packed: PackedModel, args: ModelArgs, budget: int,
                    kv_type: str = DEFAULT_KV_TYPE) -> int:
    """The largest context (a multiple of 256, at most the model's) whose plan fits `budget`;
    0 if not even 256 tokens fit."""
    limit = args.max_position_embeddings
    if limit < 256:  # a model with a short context: all of it or nothing
        return limit if plan(packed, args, limit, kv_type).total <= budget else 0
    best, lo, hi = 0, 1, limit // 256
    while lo <= hi:  # a plan grows with its context: bisect on the multiples of 256
        mid = (lo + hi) // 2
        if plan(packed, args, mid * 256, kv_type).total <= budget:
            best, lo = mid * 256, mid + 1
        else:
            hi = mid - 1
    return best
