"""Checks every architecture's tests share: a model file against transformers' reference
outputs (tests/fixtures/tiny/<name>/reference.npz), through prefill and decode."""

from __future__ import annotations

import numpy as np
from conftest import reference

import edgellm
from edgellm.modelfile import format as fmt
from edgellm.modelfile import quant


def decode_steps(llm, ids) -> np.ndarray:
    """Logits [T, vocab] of feeding `ids` one token at a time from an empty cache."""
    llm.model.reset()
    return np.stack([llm.model.forward([t], want="last").copy() for t in ids])


def decode_fused_or_not(llm, ids, fused: bool) -> np.ndarray:
    """decode_steps through the fused step (where the model has one) or the per-operation
    path."""
    m = llm.model
    keep, m.fused = m.fused, (m.fused if fused else None)
    try:
        return decode_steps(llm, ids)
    finally:
        m.fused = keep


def check_fused_equals_per_operation(path, name: str, threads: int | None = None) -> None:
    """The model decodes through the fused step, and it computes what the per-operation
    path computes: within 1e-4 with float activations (precise); with int8 activations the
    two paths round the same values, so their top-1 tokens agree closely. (f32 KV: the
    steps' f16 caches are compared in test_fused_kv_types.py.)"""
    ids = reference(name)["input_ids"]
    with edgellm.load(path, precise=True, threads=threads, kv_type="f32") as llm:
        assert llm.model.fused is not None
        a, b = decode_fused_or_not(llm, ids, True), decode_fused_or_not(llm, ids, False)
        assert np.abs(a - b).max() < 1e-4
    with edgellm.load(path, threads=threads) as llm:
        assert llm.model.fused is not None
        a, b = decode_fused_or_not(llm, ids, True), decode_fused_or_not(llm, ids, False)
        assert (a.argmax(-1) == b.argmax(-1)).mean() >= 0.9


def greedy(llm, prompt, n: int) -> list[int]:
    """n greedy tokens after `prompt`, decoded one at a time."""
    llm.model.reset()
    last, out = llm.model.forward(prompt, want="last"), []
    for _ in range(n):
        out.append(int(last.argmax()))
        last = llm.model.forward([out[-1]], want="last")
    return out


def dequantized_copy(src, dst):
    """An f32 file holding the oracle's dequantization of every tensor of `src`."""
    from converter.pack import convert
    from converter.source import Source, SourceTensor

    packed = fmt.PackedModel(src)

    def tensors():
        for name, info in packed.tensors.items():
            t = packed.tensor(name)
            yield SourceTensor(name, info.shape, "f32", t.dequantize)

    convert(Source(str(src), packed.config, tensors), dst, "f32", progress=False)
    return dst


def check_f32_matches_transformers(path, name: str, tol: float = 1e-3) -> None:
    """Prefill and decode logits within `tol` of the reference; greedy ids equal (an f32 KV
    cache: the default f16's rounding is tested in test_kv_types.py)."""
    ref = reference(name)
    with edgellm.load(path, kv_type="f32") as llm:
        assert np.abs(llm.logits(ref["input_ids"]) - ref["logits"]).max() < tol
        assert np.abs(decode_steps(llm, ref["input_ids"]) - ref["logits"]).max() < tol
        assert greedy(llm, ref["input_ids"], len(ref["greedy_ids"])) == list(ref["greedy_ids"])


def check_precise_is_exact(path, name: str, tmp_path, tol: float = 1e-3) -> None:
    """The precise path on quantized weights equals the f32 forward on their dequantization
    (prefill and decode)."""
    ids = reference(name)["input_ids"]
    with edgellm.load(dequantized_copy(path, tmp_path / "dq.edgellm"), kv_type="f32") as llm:
        want = llm.logits(ids)
    with edgellm.load(path, precise=True, kv_type="f32") as llm:
        assert np.abs(llm.logits(ids) - want).max() < tol
        assert np.abs(decode_steps(llm, ids) - want).max() < tol


def top1_agreement(converted, name: str) -> dict[str, float]:
    """Per quantized type: the share of positions whose default-path top-1 token is the
    reference's."""
    ref = reference(name)
    top_ref = ref["logits"].argmax(-1)
    agree = {}
    for kind in quant.SIZED_TYPES:
        with edgellm.load(converted(name, kind)) as llm:
            agree[kind] = float((llm.logits(ref["input_ids"]).argmax(-1) == top_ref).mean())
    print(name, agree)
    return agree
