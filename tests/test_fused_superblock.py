"""The fused decode step on super-block activations for its K-quant matrices (step/fused.py's
`superblock`): a random llama whose widths split into 256 (hidden 256, ffn 512), converted at
q4_k_m (q4_k and q6_k matrices). Its program quantizes per 256 exactly where a K-quant
matrix reads; its logits follow the float (precise) decode as closely as the blocks of 32
did; the batched step's rows are the single step's bit for bit."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from conftest import TINY
from reference_checks import decode_steps

import edgellm
from edgellm.step import fused, ops
from edgellm.step.batched import BatchDecoder

IDS = [1, 17, 230, 45, 9, 300, 121, 77, 401, 5, 64, 250]


@pytest.fixture(scope="module")
def kq_model(tmp_path_factory):
    """The random llama converted at q4_k_m (path)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from converter.hf_source import open_hf
    from converter.pack import convert

    root = tmp_path_factory.mktemp("kq")
    src = root / "hf"
    cfg = LlamaConfig(hidden_size=256, intermediate_size=512, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=64, num_hidden_layers=2, vocab_size=512,
                      max_position_embeddings=256, tie_word_embeddings=True, bos_token_id=1,
                      eos_token_id=2, pad_token_id=0)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():  # weights large enough that the layers change the residual
        for p in model.parameters():
            if p.ndim == 2:
                p.normal_(0.0, 0.08)
    model.save_pretrained(src)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(TINY / "llama" / name, src / name)
    out = root / "kq.edgellm"
    convert(open_hf(src), out, "q4_k_m", progress=False)
    return out


def _types(llm) -> set:
    return {t.type for t in llm.model.packed.tensors.values()}


def _with_superblock(m, on: bool, monkeypatch):
    monkeypatch.setattr(fused.Program, "superblock", on)
    return fused.FusedDecoder.build(m, 1, m.act_dtype)


def test_program_quantizes_per_256_where_a_kquant_matrix_reads(kq_model):
    with edgellm.load(kq_model, threads=1) as llm:
        assert {"q4_k", "q6_k"} <= _types(llm)
        prog = llm.model.fused.program
        quant_sb = {}  # slot -> sb of its last QUANT
        n = 0
        for row in prog.ops:
            if row[0] == ops.QUANT:
                o = dict(zip(ops.OPERANDS[ops.QUANT], row[1:]))
                quant_sb[o["slot"]] = o["sb"]
            elif row[0] == ops.PROJ:
                o = dict(zip(ops.OPERANDS[ops.PROJ], row[1:]))
                kind = [k for k, c in fused.ds.KIND_CODE.items()
                        if c == prog.mats[o["mat"]][fused.ds.MAT_KIND]][0]
                assert o["sb"] == int(kind in fused.SB_TYPES)
                assert quant_sb[o["slot"]] == o["sb"]
                n += o["sb"]
        assert n >= 2 * 7  # every projection of both layers (and the head)


@pytest.mark.parametrize("act_type, tol", [("int16", 2e-3), ("int8", 0.25)])
def test_superblock_step_follows_the_float_decode(kq_model, act_type, tol, monkeypatch):
    """Logits of 12 decoded tokens against the precise (float activation) decode: within
    tol of the logits' spread, and no further than the blocks of 32 were (x 1.5: per 256
    values is a coarser scale); int16's top tokens all the float decode's."""
    with edgellm.load(kq_model, threads=1, precise=True) as llm:
        exact = decode_steps(llm, IDS)
    with edgellm.load(kq_model, threads=1, act_type=act_type) as llm:
        m = llm.model
        m.fused = _with_superblock(m, True, monkeypatch)
        sb = decode_steps(llm, IDS)
        m.fused = _with_superblock(m, False, monkeypatch)
        b32 = decode_steps(llm, IDS)
    spread = exact.std()
    e_sb, e_32 = np.abs(sb - exact).max() / spread, np.abs(b32 - exact).max() / spread
    assert e_sb < tol
    assert e_sb < 1.5 * e_32 + 1e-6
    if act_type == "int16":
        np.testing.assert_array_equal(sb.argmax(-1), exact.argmax(-1))


def test_batched_rows_are_the_single_steps(kq_model):
    with edgellm.load(kq_model, threads=1) as llm:
        m = llm.model
        caches = [m.new_cache() for _ in range(2)]
        prompts = [IDS[:5], IDS[5:9]]
        solo = []
        for cache, ids in zip(caches, prompts):
            m.cache, m.tokens = cache, []
            m.forward(ids, want="none")
        states = [c.state() for c in caches]
        for state, tok in zip(states, (7, 99)):
            m.cache = m.new_cache()
            m.cache.restore(state)
            solo.append(m.fused.step(tok, False).copy())
        stepper = BatchDecoder.build(m, caches)
        for c, state in zip(caches, states):
            c.restore(state)
        rows = stepper.step([0, 1], [7, 99])
        for r in range(2):
            np.testing.assert_array_equal(rows[r], solo[r])
