"""The fused decode step on super-block activations for its K-quant matrices (step/fused.py's
`superblock`): a random llama whose widths split into 256 (hidden 256, ffn 512), converted at
q4_k_m (q4_k and q6_k matrices). Its program quantizes per 256 exactly where a K-quant
matrix reads; its logits follow the float (precise) decode as closely as the blocks of 32
did; the batched step's rows are the single step's bit for bit."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from conftest import TINY
from reference_checks import decode_steps

import edgellm
from edgellm.runtime import simd
from edgellm.step import fused, ops
from edgellm.step.batched import BatchDecoder

IDS = [1, 17, 230, 45, 9, 300, 121, 77, 401, 5, 64, 250]


def _random_llama(src, hidden=256, ffn=512, heads=4, kv_heads=2, head_dim=64, layers=2,
                  vocab=512, seed=0):
    """A random Llama checkpoint folder (config.json + model.safetensors, tied embeddings),
    weights N(0, 0.08): large enough that the layers change the residual. numpy only."""
    from safetensors.numpy import save_file

    cfg = json.loads((TINY / "llama" / "config.json").read_text())
    cfg.update(hidden_size=hidden, intermediate_size=ffn, num_attention_heads=heads,
               num_key_value_heads=kv_heads, head_dim=head_dim, num_hidden_layers=layers,
               vocab_size=vocab)
    src.mkdir(parents=True)
    (src / "config.json").write_text(json.dumps(cfg))
    rng = np.random.default_rng(seed)

    def w(*shape):
        return rng.normal(0.0, 0.08, shape).astype(np.float32)

    t = {"model.embed_tokens.weight": w(vocab, hidden),
         "model.norm.weight": np.ones(hidden, np.float32)}
    for i in range(layers):
        p = f"model.layers.{i}."
        t.update({p + "self_attn.q_proj.weight": w(heads * head_dim, hidden),
                  p + "self_attn.k_proj.weight": w(kv_heads * head_dim, hidden),
                  p + "self_attn.v_proj.weight": w(kv_heads * head_dim, hidden),
                  p + "self_attn.o_proj.weight": w(hidden, heads * head_dim),
                  p + "mlp.gate_proj.weight": w(ffn, hidden),
                  p + "mlp.up_proj.weight": w(ffn, hidden),
                  p + "mlp.down_proj.weight": w(hidden, ffn),
                  p + "input_layernorm.weight": np.ones(hidden, np.float32),
                  p + "post_attention_layernorm.weight": np.ones(hidden, np.float32)})
    save_file(t, str(src / "model.safetensors"))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(TINY / "llama" / name, src / name)


@pytest.fixture(scope="module")
def kq_files(tmp_path_factory):
    """The random llama converted at q4_k_m: {layout: path}, x16 (the default: its q4_k
    matrices interleaved, x16_k.py) and rows."""
    from converter.hf_source import open_hf
    from converter.pack import convert

    root = tmp_path_factory.mktemp("kq")
    _random_llama(root / "hf")
    out = {}
    for layout in ("x16", "rows"):
        out[layout] = root / f"kq-{layout}.edgellm"
        convert(open_hf(root / "hf"), out[layout], "q4_k_m", progress=False,
                layout="" if layout == "rows" else layout)
    return out


@pytest.fixture(scope="module")
def kq_model(kq_files):
    return kq_files["x16"]


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


@pytest.mark.parametrize("act_type, tol, coarser", [("int16", 2e-3, 1.5), ("int8", 0.25, 2.0)])
def test_superblock_step_follows_the_float_decode(kq_files, act_type, tol, coarser,
                                                  monkeypatch):
    """Logits of 12 decoded tokens against the precise (float activation) decode: within
    tol of the logits' spread, and no further than the blocks of 32 were (x coarser: one
    scale per 256 values is coarser, most for int8's 127 levels); int16's top tokens all
    the float decode's. The rows file: blocks of 32 have kernels there only."""
    kq_model = kq_files["rows"]
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
    assert e_sb < coarser * e_32 + 1e-6
    if act_type == "int16":
        np.testing.assert_array_equal(sb.argmax(-1), exact.argmax(-1))


def test_batched_rows_are_the_single_steps(kq_model):
    with edgellm.load(kq_model, threads=1) as llm:
        m = llm.model
        # five rows: the x16 matrices' four-token tile, then the one-token tile
        prompts = [IDS[:5], IDS[5:9], IDS[2:8], IDS[1:4], IDS[3:10]]
        toks = [7, 99, 3, 42, 11]
        caches = [m.new_cache() for _ in prompts]
        solo = []
        for cache, ids in zip(caches, prompts):
            m.cache, m.tokens = cache, []
            m.forward(ids, want="none")
        states = [c.state() for c in caches]
        for state, tok in zip(states, toks):
            m.cache = m.new_cache()
            m.cache.restore(state)
            solo.append(m.fused.step(tok, False).copy())
        stepper = BatchDecoder.build(m, caches)
        for c, state in zip(caches, states):
            c.restore(state)
        rows = stepper.step(list(range(len(toks))), toks)
        for r in range(len(toks)):
            np.testing.assert_array_equal(rows[r], solo[r])


@pytest.mark.parametrize("act_type", ["int16", "int8"])
def test_x16_file_decodes_as_the_rows_file(kq_files, act_type):
    """The x16 file's q4_k and q6_k matrices (x16_k.py's tiles: the same integers a
    super-block, its float work in another order) decode the rows file's logits within
    float rounding and its greedy tokens (a float that differs in the last bit can move the
    next layer's activation by one integer level: int16's moves are small and frequent,
    int8's large and rare, one of the twelve steps here); its prefill (int16: the
    rows' panels, packed from x16) bit for bit on AVX-512 VNNI; the precise path alike."""
    out = {}
    for layout, path in kq_files.items():
        with edgellm.load(path, threads=2, act_type=act_type) as llm:
            assert llm.model.packed.tensors["model.layers.0.mlp.up_proj.weight"].layout == (
                "x16" if layout == "x16" else "")
            out[layout] = decode_steps(llm, IDS), np.asarray(llm.logits(IDS))
        with edgellm.load(path, threads=1, precise=True) as llm:
            out[layout + " precise"] = decode_steps(llm, IDS)
    (a, pa), (b, pb) = out["x16"], out["rows"]
    step = np.abs(a - b).max(-1) / np.abs(b).max()
    if act_type == "int16":  # an int16 level is 1/32767 of a row's largest value
        assert step.max() <= 5e-4
    else:
        assert np.median(step) <= 1e-4 and step.max() <= 0.02
    np.testing.assert_array_equal(a.argmax(-1), b.argmax(-1))
    if act_type == "int16" and simd.VNNI:
        np.testing.assert_array_equal(pa, pb)
    else:
        assert np.abs(pa - pb).max() <= 0.05 * np.abs(pb).max()
    assert np.abs(out["x16 precise"] - out["rows precise"]).max() < 1e-4 * np.abs(b).max()
