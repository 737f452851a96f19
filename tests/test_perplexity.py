"""Perplexity as llama.cpp computes it: chunking, BOS, second-half scoring, the standard
error, the `edgellm perplexity` command, and one short check on the real SmolLM2."""

import json
from pathlib import Path

import numpy as np
import pytest

import edgellm
from edgellm.cli import main as edgellm_main
from edgellm.errors import EdgeLLMError
from edgellm.llm import LLM
from edgellm.perplexity import (
    bos_for,
    chunk_nll,
    evaluate,
    make_chunks,
    perplexity,
    scored_logits,
    summarize,
)

TINY_REF = Path(__file__).parent / "fixtures" / "tiny" / "llama" / "reference.npz"
TEXT = ("The quick brown fox jumps over the lazy dog. " * 3 +
        "A tiny random model still gives every token a probability. " * 6) * 4


def test_chunks_are_consecutive_with_bos_first():
    ids = np.arange(100, 200)
    ch = make_chunks(ids, 16, bos_id=1)
    assert ch.shape == (6, 16)  # 100 // 16, the tail dropped
    assert (ch[:, 0] == 1).all()
    assert (ch[:, 1:] == ids[:96].reshape(6, 16)[:, 1:]).all()
    assert make_chunks(ids, 16, chunks=2).tolist() == ids[:32].reshape(2, 16).tolist()
    assert make_chunks(ids, 16, chunks=50).shape == (6, 16)


@pytest.mark.parametrize("kwargs, msg", [
    ({"ids": np.arange(31), "ctx": 16}, "at least 32"),
    ({"ids": np.arange(64), "ctx": 2}, "at least 4"),
    ({"ids": np.arange(64), "ctx": 16, "chunks": 0}, "at least 1"),
])
def test_chunk_errors(kwargs, msg):
    with pytest.raises(EdgeLLMError, match=msg):
        make_chunks(**kwargs)


def test_second_half_is_scored_against_the_next_token():
    rng = np.random.default_rng(0)
    ctx, vocab = 10, 7
    logits = rng.standard_normal((ctx, vocab)).astype(np.float32)
    chunk = rng.integers(0, vocab, ctx)
    nll = chunk_nll(logits, chunk)
    want = []
    for t in range(ctx // 2, ctx - 1):  # positions 5..8 predict tokens 6..9
        p = np.exp(logits[t].astype(np.float64))
        want.append(-np.log(p[chunk[t + 1]] / p.sum()))
    np.testing.assert_allclose(nll, want, rtol=1e-10)
    # logits of only the last positions (the scored half and after) give the same numbers
    np.testing.assert_allclose(chunk_nll(logits[5:], chunk), want, rtol=1e-10)
    with pytest.raises(EdgeLLMError, match="10 positions"):
        chunk_nll(logits[6:], chunk)


def test_matches_transformers_reference(converted):
    """The tiny llama fixture's transformers logits, scored by hand in numpy (one chunk of
    20 of its 40 prompt ids: positions 10..18 predict ids 11..19), against edgellm's
    perplexity of the same ids through the runtime's second-half path."""
    ref = np.load(TINY_REF)
    ids, logits = ref["input_ids"], ref["logits"].astype(np.float64)
    logp = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) \
        - logits.max(-1, keepdims=True)
    nll = np.array([-logp[t, ids[t + 1]] for t in range(10, 19)])
    ppl = np.exp(nll.mean())
    stderr = ppl * np.sqrt(((nll ** 2).mean() - nll.mean() ** 2) / (nll.size - 1))
    with LLM(converted("llama", "f32"), context=20, precise=True, chunk=4,
             kv_type="f32") as llm:
        res = evaluate(lambda c: scored_logits(llm, c), make_chunks(ids, 20, 1))
    assert (res.tokens, res.chunks, res.ctx) == (9, 1, 20)
    assert res.ppl == pytest.approx(ppl, rel=1e-4)
    assert res.ppl_stderr == pytest.approx(stderr, rel=1e-3)


@pytest.mark.parametrize("quant, precise", [("q8_0", False), ("q4_0", False), ("f32", True)])
def test_scored_logits_are_those_of_a_whole_forward(converted, quant, precise):
    """The first half runs without the output head, in the same prefill pieces: the scored
    logits are bit for bit those of llm.logits (int8 activations included)."""
    ids = np.load(TINY_REF)["input_ids"][:32]
    with LLM(converted("llama", quant), context=32, precise=precise, chunk=8) as llm:
        full = llm.logits(ids)
        part = scored_logits(llm, ids)
        for ctx in (32, 30, 17):
            tail = scored_logits(llm, ids[:ctx])
            assert ctx - ctx // 2 <= tail.shape[0] <= ctx
            np.testing.assert_array_equal(tail, llm.logits(ids[:ctx])[ctx - tail.shape[0]:])
    assert part.shape[0] == 16  # positions 16..31: 16 is a multiple of the piece (8)
    np.testing.assert_array_equal(part, full[16:])


def test_stderr_is_llama_cpp_formula():
    nll = np.array([1.0, 2.0, 4.0, 3.0])
    r = summarize(nll, chunks=2, ctx=6)
    mean = nll.mean()
    var = (nll ** 2).mean() - mean ** 2
    assert r.ppl == pytest.approx(np.exp(mean))
    assert r.ppl_stderr == pytest.approx(np.exp(mean) * np.sqrt(var / 3))
    assert r.to_json() == {"ppl": r.ppl, "ppl_stderr": r.ppl_stderr, "tokens": 4,
                           "chunks": 2, "ctx": 6}


def test_perplexity_of_tiny_model_matches_manual(converted):
    with edgellm.load(converted("llama", "f32"), context=32, precise=True) as llm:
        res = perplexity(llm, TEXT, ctx=32, chunks=3)
        assert bos_for(llm.tokenizer) is None  # this tokenizer adds no BOS to texts
        ids = llm.tokenizer.encode(TEXT)
        nll = []
        for i in range(3):
            chunk = np.array(ids[i * 32:(i + 1) * 32])
            logp = llm.logits(chunk).astype(np.float64)
            logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
            nll += [-logp[t, chunk[t + 1]] for t in range(16, 31)]
        always = perplexity(llm, TEXT, ctx=32, chunks=3, bos="always")
    assert (res.tokens, res.chunks, res.ctx) == (45, 3, 32)
    assert res.ppl == pytest.approx(np.exp(np.mean(nll)), rel=1e-6)
    assert always.ppl != res.ppl  # BOS replaced each chunk's first token
    assert 1 < res.ppl < 10 * 512  # random weights: around uniform over the 512 ids


def test_evaluate_reports_progress():
    seen = []
    ch = make_chunks(np.arange(40) % 5, 8, chunks=3)
    uniform = evaluate(lambda c: np.zeros((8, 5), np.float32), ch,
                       lambda i, n, p: seen.append((i, n, round(p, 6))))
    assert uniform.ppl == pytest.approx(5.0)
    assert seen == [(1, 3, 5.0), (2, 3, 5.0), (3, 3, 5.0)]


def test_cli_json_and_text(converted, tmp_path, capsys):
    f = tmp_path / "t.txt"
    f.write_text(TEXT)
    model = str(converted("llama", "q8_0"))
    assert edgellm_main(["perplexity", "-m", model, "-f", str(f), "--ctx", "32", "--chunks",
                         "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"ppl", "ppl_stderr", "tokens", "chunks", "ctx"}
    assert (out["chunks"], out["ctx"], out["tokens"]) == (2, 32, 30)
    assert edgellm_main(["perplexity", "-m", model, "-f", str(f), "--ctx", "32",
                         "--chunks", "1"]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("perplexity ")
    assert "[1/1]" in captured.err


@pytest.mark.parametrize("args, text, msg", [
    (["--ctx", "4"], TEXT, "--ctx must be at least 8"),
    (["--chunks", "0"], TEXT, "--chunks must be at least 1"),
    (["--ctx", "64"], "too short", "needs at least 128"),
])
def test_cli_errors(args, text, msg, converted, tmp_path, capsys):
    f = tmp_path / "t.txt"
    f.write_text(text)
    model = str(converted("llama", "f32"))
    assert edgellm_main(["perplexity", "-m", model, "-f", str(f), *args]) == 1
    assert msg in capsys.readouterr().err


def test_cli_missing_file(converted, tmp_path, capsys):
    model = str(converted("llama", "f32"))
    assert edgellm_main(["perplexity", "-m", model, "-f", str(tmp_path / "no.txt")]) == 1
    err = capsys.readouterr().err
    assert "cannot read" in err and len(err.strip().splitlines()) == 1


def test_real_smollm2_short(tmp_path, smollm2):
    """SmolLM2-135M on 2 chunks of 128 tokens of Python's documentation: a sane perplexity,
    and the q8_0 model within 1% of the float model (precise path, same chunks). The "keep"
    file is the session's `smollm2` fixture (the same conversion)."""
    from pydoc_data.topics import topics

    from realmodel import smollm2_gguf_path

    from converter.gguf_source import open_gguf
    from converter.pack import convert

    text = "\n\n".join(topics[k] for k in sorted(topics))[:20000]
    files = {"keep": smollm2, "q8_0": tmp_path / "q8_0.edgellm"}
    convert(open_gguf(smollm2_gguf_path()), files["q8_0"], "q8_0", progress=False)
    res = {}
    for recipe, out in files.items():
        with edgellm.load(out, context=128, precise=True) as llm:
            res[recipe] = perplexity(llm, text, ctx=128, chunks=2)
    assert 3 < res["keep"].ppl < 40
    assert res["q8_0"].ppl == pytest.approx(res["keep"].ppl, rel=0.01)
