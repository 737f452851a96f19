"""Mixture-of-experts models (qwen3_moe, mixtral) against transformers' outputs; routing;
the expert bytes a decode step reads."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import TINY, reference
from reference_checks import (
    check_f32_matches_transformers,
    check_precise_is_exact,
    decode_steps,
    top1_agreement,
)

import edgellm
import edgellm.arch.moe as moe_mod
from converter.hf_source import open_hf
from converter.names import sanitize
from converter.pack import convert
from converter.source import Source, SourceTensor
from edgellm.errors import SourceError
from edgellm.kernels.moe import route
from edgellm.modelfile.format import PackedModel

NAMES = ["qwen3-moe", "mixtral"]


@pytest.mark.parametrize("name", NAMES)
def test_f32_matches_transformers(name, converted):
    check_f32_matches_transformers(converted(name, "f32"), name)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("kind", ["q8_0", "q4_0"])
def test_precise_path_is_exact_on_quantized_weights(name, kind, converted, tmp_path):
    check_precise_is_exact(converted(name, kind), name, tmp_path)


@pytest.mark.parametrize("name", NAMES)
def test_default_path_top1_agreement(name, converted, record_property):
    """Reported, not a gate: a routing flip under int8 noise moves a whole expert."""
    agree = top1_agreement(converted, name)
    record_property("top1", agree)
    assert agree["q8_0"] >= 0.5


# ------------------------------------------------------------------------------ routing

@pytest.mark.parametrize("renorm", [True, False])
def test_route_is_softmax_top_k(renorm):
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((50, 8)).astype(np.float32) * 3
    idx = np.zeros((50, 2), np.int64)
    w = np.zeros((50, 2), np.float32)
    route(logits, 2, renorm, idx, w)
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    want_idx = np.argsort(-p, axis=1, kind="stable")[:, :2]
    want_w = np.take_along_axis(p, want_idx, 1)
    if renorm:
        want_w /= want_w.sum(1, keepdims=True)
    assert np.array_equal(idx, want_idx)
    np.testing.assert_allclose(w, want_w, rtol=1e-6)


# ----------------------------------------------------------- expert bytes read per token

@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("kind", ["q4_0", "q8_0"])
def test_decode_reads_only_the_selected_experts(name, kind, converted, monkeypatch,
                                                record_property):
    """Expert bytes handed to the kernels per decode token = top_k / num_experts of all
    expert bytes, counted by the model and, independently, from the linear calls."""
    path = converted(name, kind)
    touched = []
    real = moe_mod.linear
    monkeypatch.setattr(moe_mod, "linear", lambda w, *a, **k: (touched.append(w),
                                                               real(w, *a, **k)))
    ids = reference(name)["input_ids"]
    with edgellm.load(path, fused=False) as llm:  # the per-operation path's linear calls
        m = llm.model
        m.reset()
        m.expert_bytes_read = 0
        per_token = []
        for t in ids:
            touched.clear()
            m.forward([t], want="last")
            per_token.append(sum(w.data.nbytes for w in touched if ".experts." in w.name))
        with PackedModel(path) as p:
            total = sum(t.nbytes for n, t in p.tensors.items() if ".experts." in n)
        assert m.expert_bytes == total
        assert m.expert_bytes_read == sum(per_token)
        ratio = np.array(per_token) / total
        assert np.allclose(ratio, m.top_k / m.n_experts)
        # Prefill reads each expert at most once per chunk.
        m.reset()
        m.expert_bytes_read = 0
        m.forward(ids, want="last")
        assert m.expert_bytes_read <= total
        prefill_ratio = m.expert_bytes_read / total
    stats = {"expert_bytes_total": total, "decode_bytes_per_token": float(np.mean(per_token)),
             "decode_fraction": float(ratio.mean()), "top_k/num_experts":
             m.top_k / m.n_experts, "prefill_40_tokens_fraction": prefill_ratio}
    record_property("expert_bytes", stats)
    print(name, kind, stats)


@pytest.mark.parametrize("name", NAMES)
def test_fused_decode_reads_the_experts_the_per_operation_path_reads(name, converted):
    """The fused step counts the experts its routing picked: per token the same bytes as
    the per-operation path hands to its kernels (precise: the same routing)."""
    path = converted(name, "q8_0")
    ids = reference(name)["input_ids"]
    counts = {}
    for fused in (True, False):
        with edgellm.load(path, precise=True, fused=fused) as llm:
            m = llm.model
            assert (m.fused is not None) == fused
            m.reset()
            seen = []
            for t in ids:
                before = m.expert_bytes_read
                m.forward([t], want="last")
                seen.append(m.expert_bytes_read - before)
            counts[fused] = seen
    assert counts[True] == counts[False]
    assert np.allclose(np.array(counts[True]) / m.expert_bytes, m.top_k / m.n_experts)


# ------------------------------------------------------------------- names, dense layers

def test_experts_are_stored_one_tensor_each_and_routers_stay_f32(converted):
    with PackedModel(converted("mixtral", "q4_0")) as p:
        assert p.tensors["model.layers.0.block_sparse_moe.gate.weight"].type == "f32"
        for e in range(4):
            for m, shape in (("w1", (128, 64)), ("w3", (128, 64)), ("w2", (64, 128))):
                t = p.tensors[f"model.layers.0.block_sparse_moe.experts.{e}.{m}.weight"]
                assert t.type == "q4_0" and t.shape == shape
    with PackedModel(converted("qwen3-moe", "q4_0")) as p:
        assert p.tensors["model.layers.2.mlp.gate.weight"].type == "f32"
        assert p.tensors["model.layers.2.mlp.experts.7.down_proj.weight"].type == "q4_0"


def test_stacked_expert_tensors_are_refused():
    with pytest.raises(SourceError, match="stacked"):
        sanitize("model.layers.0.mlp.experts.gate_up_proj", {})


def test_qwen3_moe_dense_layers(tmp_path):
    """mlp_only_layers=[1]: layer 1 runs a dense MLP. With expert 0's matrices as that MLP,
    the model equals the all-sparse one whose layer-1 experts are all copies of expert 0
    (normalized top-k weights sum to 1)."""
    base = open_hf(TINY / "qwen3-moe")
    tensors = {t.name: t.load() for t in base.tensors()}
    expert0 = {m: tensors[f"model.layers.1.mlp.experts.0.{m}_proj.weight"]
               for m in ("gate", "up", "down")}

    def write(out, config, weights):
        src = Source(str(out), config, lambda: (SourceTensor(n, x.shape, "f32",
                                                             lambda x=x: x)
                                                for n, x in weights.items()),
                     base.tokenizer_json, base.tokenizer_config)
        convert(src, out, "f32", progress=False)
        return out

    dense = {n: x for n, x in tensors.items() if not n.startswith("model.layers.1.mlp.")}
    dense.update({f"model.layers.1.mlp.{m}_proj.weight": x for m, x in expert0.items()})
    copies = dict(tensors)
    copies.update({f"model.layers.1.mlp.experts.{e}.{m}_proj.weight": x
                   for e in range(8) for m, x in expert0.items()})
    a = write(tmp_path / "dense.edgellm", {**base.config, "mlp_only_layers": [1]}, dense)
    b = write(tmp_path / "copies.edgellm", base.config, copies)
    ids = reference("qwen3-moe")["input_ids"]
    with edgellm.load(a, kv_type="f32") as la, edgellm.load(b, kv_type="f32") as lb:
        assert [w.experts is None for w in la.model.layers] == [False, True, False]
        want = lb.logits(ids)
        assert np.abs(la.logits(ids) - want).max() < 1e-4
        assert np.abs(decode_steps(la, ids) - want).max() < 1e-4
