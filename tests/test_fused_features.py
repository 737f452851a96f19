"""The fused step compiled for a model's own ops (step/fused.py: features): it is given
exactly the matrix types, KV type, MoE and LoRA the program has, and computes what the
step compiled with every op computes, bit for bit (the suite runs that one: conftest)."""

import numpy as np
import pytest
from conftest import reference

import edgellm
from edgellm.step import decode_step as ds
from edgellm.step import fused


def _named(feats) -> set:
    return {name for name, f in zip(ds.FEATURES, feats) if f is not None}


def _kinds(prog) -> set:
    return {ds.KINDS[list(ds.KIND_CODE.values()).index(int(m[ds.MAT_KIND]))]
            for m in prog.mats}


@pytest.mark.parametrize("name, quant, kv_type", [("llama", "q4_1", "f32"),
                                                   ("qwen3-moe", "q8_0", "f16"),
                                                   ("gemma3", "q4_0", "q8_0")])
def test_features_name_what_the_program_runs(converted, name, quant, kv_type):
    with edgellm.load(converted(name, quant), kv_type=kv_type) as llm:
        f = llm.model.fused
        prog = f.program
        want = {k if k in ds.KIND_FEATURES else "kquant" for k in _kinds(prog)}
        want.add("kv_" + kv_type)
        ops = {row[0] for row in prog.ops}
        if ds.MOE in ops:
            want.add("moe")
        if any(m[ds.MAT_LAYOUT] == ds.LAYOUT_X16 for m in prog.mats):  # q4_0/q4_1 as converted
            want.add("x16")
        assert _named(fused.features(prog, kv_type)) == want
        assert ("moe" in want) == (name == "qwen3-moe")
        assert _named(fused.ALL_FEATURES) == set(ds.FEATURES)
        assert f.feats is fused.ALL_FEATURES  # the suite's setting (conftest)


def test_pruned_step_computes_the_full_steps_logits(converted, monkeypatch):
    """llama at q4_1 (q4_1 matrices in the x16 layout and q8_0 ones, an f32 cache, no MoE or
    LoRA): its pruned serial step, in both precisions, gives the full step's logits bit for
    bit."""
    ids = [int(t) for t in reference("llama")["input_ids"][:5]]
    with edgellm.load(converted("llama", "q4_1"), threads=1, kv_type="f32") as llm:
        m = llm.model
        full = m.fused
        monkeypatch.setattr(fused.FusedDecoder, "prune", True)
        pruned = fused.FusedDecoder.build(m, 1, m.act_dtype)
        assert _named(pruned.feats) <= {"q4_1", "q8_0", "kv_f32", "x16"}
        for precise in (False, True):
            m.precise = precise
            out = []
            for step in (full, pruned):
                m.reset()
                m.fused = step
                out.append([m.forward([t], want="last").copy() for t in ids])
            m.fused = full
            for a, b in zip(*out):
                np.testing.assert_array_equal(a, b)
