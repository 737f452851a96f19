"""The memory plan (`edgellm info --ctx N`) adds up what the runtime really allocates.

Each component is checked against the loaded model's own arrays on tiny fixtures: the KV
cache (full and sliding-window layers), the activation buffers (prefill chunk, logits, the
fused decode step's scratch) and the weights (the mapped file). The baseline and tokenizer
constants are measured figures (scripts/memory-cap.py); here only their use is checked.
"""

from __future__ import annotations

import numpy as np
import pytest

import edgellm
from edgellm import memory_plan
from edgellm.modelfile.format import PackedModel
from edgellm.validate import check_model


def _array_bytes(obj) -> int:
    """Bytes of the numpy arrays an object holds (attributes, tuples and lists of them)."""
    seen: set[int] = set()

    def walk(x) -> int:
        if isinstance(x, np.ndarray):
            if id(x) in seen:
                return 0
            seen.add(id(x))
            return x.nbytes
        if isinstance(x, (list, tuple)):
            return sum(walk(y) for y in x)
        if hasattr(x, "__slots__"):  # a class's slots and its bases' (ActQ8 extends Act)
            slots = {s for c in type(x).__mro__ for s in getattr(c, "__slots__", ())}
            return sum(walk(getattr(x, s, None)) for s in sorted(slots))
        return 0

    return sum(walk(v) for v in vars(obj).values())


def _fused_bytes(f) -> int:
    """The fused decode step's own arrays (blob and the matrices view the file)."""
    return f.nbytes


def _runtime_buffers(model) -> int:
    """What arch/base.py and step/fused.py allocate besides weights and KV cache."""
    total = _array_bytes(model.buffers) + model.logit_buf.nbytes
    if model.cache.f32_rows is not None:  # an f16 cache's rows for prefill (kv_cache.py)
        total += model.cache.f32_rows.nbytes
    return total + (_fused_bytes(model.fused) if model.fused is not None else 0)


@pytest.mark.parametrize("name,context", [("llama", 256), ("llama", 40), ("qwen3", 128),
                                          ("mistral-swa", 200), ("gemma3", 100)])
def test_plan_matches_the_runtime_allocations(converted, name, context):
    path = converted(name, "q8_0")
    with PackedModel(path) as packed:
        args = check_model(packed)
        plan = memory_plan.plan(packed, args, context)
        file_size = packed.file_size
    with edgellm.load(path, threads=2, context=context) as llm:
        model = llm.model
        cache = model.cache
        assert plan.kv_cache == cache.nbytes
        full = sum(2 * context * layer.k.shape[1] * layer.k.shape[2] * layer.k.itemsize
                   + 8 * context for layer in cache.layers)
        assert plan.kv_cache_no_window == full
        if any(layer.window for layer in cache.layers):
            assert plan.kv_cache < plan.kv_cache_no_window
        chunk = _array_bytes(model.buffers) + model.logit_buf.nbytes
        assert chunk == memory_plan.chunk_buffer_bytes(args, args.intermediate_size,
                                                       model.chunk)
        if model.fused is not None:  # planned for PLAN_THREADS; the runtime has its own
            step = _fused_bytes(model.fused)
            planned = memory_plan.decode_buffer_bytes(args, args.intermediate_size, context,
                                                      threads=model.fused.nt)
            # an upper bound: over at most by the per-thread scratch, whose layout moves
            # with the step's kernels; a buffer the plan does not know of would fail it
            nt, cap = model.fused.nt, int(model.cache.caps.max())
            group = args.num_attention_heads // args.num_key_value_heads
            slack = 4 * nt * ((group + 2) * cap + group * args.head_dim)
            slack += memory_plan.fused_table_bytes(args)  # the program tables: a bound
            assert step <= planned <= step + slack, (planned, step, slack)
        assert plan.buffers >= _runtime_buffers(model)
        assert model.cache.f32_rows.nbytes == memory_plan.prefill_rows_bytes(args, context)
    assert plan.weights == file_size == path.stat().st_size


def test_fused_decode_is_planned_for_llama(converted):
    """The exact-match branch above must really run: tiny llama has the fused step."""
    with edgellm.load(converted("llama", "q8_0"), threads=2, context=64) as llm:
        assert llm.model.fused is not None


def test_total_and_default_context(converted):
    path = converted("llama", "q4_0")
    with PackedModel(path) as packed:
        args = check_model(packed)
        p = memory_plan.plan(packed, args, 128)
        assert p.total == (p.weights + p.kv_cache + p.buffers + p.tokenizer
                           + memory_plan.BASELINE)
        assert p.to_json()["total"] == p.total
        stored = packed.tokenizer_stored  # the tiny llama's 512 tokens and 253 merges
        assert (stored["kind"], stored["tokens"], stored["merges"]) == ("bpe", 512, 253)
        assert p.tokenizer == (memory_plan.TOKENIZER_PER_TOKEN * 512
                               + memory_plan.TOKENIZER_PER_MERGE * 253)
        default = memory_plan.default_context(args)
    with edgellm.load(path) as llm:
        assert llm.model.context == default


def test_largest_context_is_the_largest_that_fits(converted):
    path = converted("llama", "q8_0")  # 256 positions: a short-context model
    with PackedModel(path) as packed:
        args = check_model(packed)
        whole = memory_plan.plan(packed, args, args.max_position_embeddings).total
        assert memory_plan.largest_context(packed, args, whole) == args.max_position_embeddings
        assert memory_plan.largest_context(packed, args, whole - 1) == 0
        # a longer-context model: bisect on multiples of 256
        args.max_position_embeddings = 8192
        for budget in (whole, whole + 3 * 2**20, whole + 40 * 2**20):
            ctx = memory_plan.largest_context(packed, args, budget)
            assert ctx % 256 == 0
            assert ctx == 0 or memory_plan.plan(packed, args, ctx).total <= budget
            if ctx < 8192:
                assert memory_plan.plan(packed, args, ctx + 256).total > budget
