"""Embeddings against sentence-transformers: the tiny BERT fixtures (mean + Normalize, CLS),
tiny decoder embedding models (last-token / mean pooling over a qwen3), the encoder kernels
against numpy, the sentence-transformers config reader, and the errors."""

import json
import math
import os
import stat
import subprocess
import sys

import numpy as np
import pytest
from conftest import FIXTURES, TINY

import edgellm
from edgellm.errors import ArgumentError, ContextError, EdgeLLMError, ModelKindError, SourceError

EMBED = FIXTURES / "embed"


def _cases(name):
    with np.load(EMBED / name / "reference.npz") as z:
        ref = {k: z[k] for k in z.files}
    return json.loads((EMBED / name / "cases.json").read_text("utf-8")), ref


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    from converter.hf_source import open_hf
    from converter.pack import convert

    root = tmp_path_factory.mktemp("embed")
    done = {}

    def get(name, quant="f32"):
        if (name, quant) not in done:
            out = root / f"{name}-{quant}.edgellm"
            convert(open_hf(EMBED / name), out, quant, progress=False)
            done[name, quant] = out
        return done[name, quant]
    return get


@pytest.mark.parametrize("name", ["bert-tiny", "bert-tiny-cls"])
def test_bert_tiny_matches_sentence_transformers(packed, name):
    cases, ref = _cases(name)
    with edgellm.load(packed(name)) as llm:
        got = llm.embed(cases["sentences"], batch_size=3)  # batches of 3, 3 and 1 texts
        assert got.dtype == np.float32 and got.shape == ref["embeddings"].shape
        assert np.abs(got - ref["embeddings"]).max() < 1e-4
        tokens = llm.token_embeddings(cases["sentences"][0])
        assert np.abs(tokens - ref["token_embeddings"]).max() < 1e-4
        assert llm.embedder.tokenize(cases["sentences"][:1])[0] == ref["input_ids_0"].tolist()
        one = llm.embed(cases["sentences"][1])  # a single string: [D]
        assert one.shape == (64,) and np.abs(one - ref["embeddings"][1]).max() < 1e-4
        empty = llm.embed("")  # [CLS] [SEP] only, as sentence-transformers embeds it
        assert np.abs(empty - ref["embeddings"][4]).max() < 1e-4
    norms = np.linalg.norm(got, axis=1)
    if cases["normalize"]:
        assert np.allclose(norms, 1, atol=1e-5)
    else:
        assert not np.allclose(norms, 1, atol=1e-2)


def test_packed_batches_do_not_mix_sequences(packed):
    """One batch of every text equals each text alone: no sequence sees another's tokens."""
    cases, _ = _cases("bert-tiny")
    with edgellm.load(packed("bert-tiny")) as llm:
        batched = llm.embed(cases["sentences"], batch_size=64)
        alone = np.stack([llm.embed(t) for t in cases["sentences"]])
        raw = llm.embed(cases["sentences"], normalize=False)
    assert np.abs(batched - alone).max() < 1e-6
    assert not np.allclose(np.linalg.norm(raw, axis=1), 1, atol=1e-3)


def test_header_keeps_pooling_and_length(packed):
    from edgellm.modelfile.format import PackedModel

    with PackedModel(packed("bert-tiny")) as p:
        assert p.header["embedding"] == {"pooling": "mean", "normalize": True,
                                         "max_seq_length": 128}
    with PackedModel(packed("bert-tiny-cls")) as p:
        assert p.header["embedding"]["pooling"] == "cls"
        assert p.header["embedding"]["normalize"] is False


def test_long_texts_are_truncated_to_max_seq_length(packed):
    text = " ".join(["numbers and words"] * 200)
    with edgellm.load(packed("bert-tiny")) as llm:
        ids = llm.embedder.tokenize([text])[0]
        assert len(ids) == 128 and ids[0] == 2 and ids[-1] == 3  # [CLS] ... [SEP]
        assert np.isfinite(llm.embed(text)).all()


@pytest.mark.parametrize("name", ["qwen3-embed", "qwen3-embed-mean"])
def test_decoder_embedding_matches_transformers_hidden_states(packed, name):
    """A qwen3 decoder saved as its base model (bare tensor names, as Qwen3-Embedding),
    last-token + Normalize or mean pooling: against sentence-transformers and against
    transformers' last_hidden_state pooled by hand."""
    cases, ref = _cases(name)
    with edgellm.load(packed(name)) as llm:
        got = llm.embed(cases["sentences"])
    assert np.abs(got - ref["embeddings"]).max() < 1e-4
    assert np.abs(got - ref["hidden_pooled"]).max() < 1e-4


def test_roberta_positions_start_after_the_padding_index(packed):
    """RoBERTa (and XLM-R) number positions from pad_token_id + 1; two sequences packed in
    one batch against transformers' RobertaModel run on each."""
    with np.load(EMBED / "roberta-tiny" / "reference.npz") as z:
        ids, want = z["input_ids"], z["hidden"]
    with edgellm.load(packed("roberta-tiny")) as llm:
        got = llm.model.encode(ids.reshape(-1), np.array([0, 9, 18]))
    assert np.abs(got.reshape(want.shape) - want).max() < 1e-4


def test_encoder_refuses_to_generate_and_plain_decoder_to_embed(packed, converted):
    with edgellm.load(packed("bert-tiny")) as llm:
        with pytest.raises(ModelKindError, match="encoder"):
            llm.generate("hello")
        with pytest.raises(ModelKindError, match="encoder"):
            llm.logits([2, 3])
        with pytest.raises(ArgumentError, match=r"texts\[0\] must be a str"):
            llm.embed([1, 2])
        with pytest.raises(ArgumentError, match=r"texts\[1\] is not valid Unicode"):
            llm.embed(["ok", "\udcff"])  # a lone surrogate: the tokenizer's TypeError before
        with pytest.raises(ArgumentError, match="text is not valid Unicode"):
            llm.token_embeddings("\udcff")
        with pytest.raises(ArgumentError, match="progress"):
            llm.embed(["a"], progress=5)  # refused before the work, not after it
        with pytest.raises(ArgumentError, match="blocking"):
            llm.embed("a", blocking="no")
        with pytest.raises(EdgeLLMError, match="batch_size"):
            llm.embed(["a"], batch_size=0)
        with pytest.raises(ContextError, match="vocabulary"):
            llm.model.encode(np.array([2, 10_000]), np.array([0, 2]))
    with edgellm.load(converted("llama")) as llm:
        with pytest.raises(ModelKindError, match="no pooling"):
            llm.embed("hello")


# kernels ---------------------------------------------------------------------------------

def test_erf_and_gelu_are_exact_to_float32():
    from edgellm.kernels.encoder import bias_gelu

    x = np.linspace(-7, 7, 20001, dtype=np.float32)[None, :].copy()
    bias = np.zeros(x.shape[1], np.float32)
    want = np.array([0.5 * v * (1 + math.erf(v / math.sqrt(2))) for v in x[0].tolist()])
    bias_gelu(x, bias)
    assert np.abs(x[0] - want).max() < 2e-6


def test_attention_exp_is_float32_close():
    """exp_fast, the tiled attention's softmax exp, over the shifted scores' range: the
    error of x log2(e) rounded to float32 grows with |x| (weights below e^-16 are 1e-7 of
    the largest)."""
    from numba import njit

    from edgellm.kernels.encoder import exp_fast

    x = np.linspace(-87, 0, 200001, dtype=np.float32)
    got = njit(lambda a: np.array([exp_fast(v) for v in a], np.float32))(x)
    want = np.exp(x.astype(np.float64))
    rel = np.abs(got - want) / want
    assert (rel / (3e-7 + 1e-7 * np.abs(x))).max() < 1
    assert got[-1] == 1.0


@pytest.mark.parametrize("Dh, lengths", [(8, [1, 5, 13]), (32, [1, 5, 13, 16, 17, 40])])
def test_packed_attention_matches_numpy(Dh, lengths):
    """Dh 8: the row-at-a-time kernel; Dh 32: the register-tile one (lengths around its
    16-key panels and 6-query tiles)."""
    from edgellm.kernels.encoder import packed_attention

    rng = np.random.default_rng(0)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    T, H = int(offsets[-1]), 3
    q, k, v = (rng.standard_normal((T, H, Dh), dtype=np.float32) for _ in range(3))
    out = np.zeros_like(q)
    packed_attention(q, k, v, offsets, 0.3, out)
    for s in range(len(lengths)):
        a, b = offsets[s], offsets[s + 1]
        sc = np.einsum("thd,uhd->htu", q[a:b], k[a:b]) * 0.3
        p = np.exp(sc - sc.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        assert np.abs(np.einsum("htu,uhd->thd", p, v[a:b]) - out[a:b]).max() < 1e-5
    if Dh != 8:
        return
    for bad in ([0, 5, 5, 19], [1, 19], [0, 20], [0, 7]):
        with pytest.raises(ValueError, match="offsets"):
            packed_attention(q, k, v, np.array(bad, np.int64), 0.3, out)
    with pytest.raises(ValueError, match="shape"):
        packed_attention(q, k, v[:, :2].copy(), offsets, 0.3, out)


@pytest.mark.parametrize("T", [1, 47, 48, 49, 150])
def test_one_sequence_attention_equals_the_packed_kernel(T):
    """A single sequence (Whisper's 1,500 frames) runs its heads and blocks of 48 queries in
    parallel: the same tiles and softmax per row as the packed kernel, so the same bits."""
    from edgellm.kernels.encoder import _packed_attention_tiles, packed_attention

    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((T, 3, 32), dtype=np.float32) for _ in range(3))
    offsets = np.array([0, T], np.int64)
    out, ref = np.zeros_like(q), np.zeros_like(q)
    packed_attention(q, k, v, offsets, 0.3, out)
    _packed_attention_tiles(q, k, v, offsets, 0.3, ref)
    assert np.array_equal(out, ref)


# the sentence-transformers reader ----------------------------------------------------------

def _st_dir(tmp_path, modules, pooling):
    (tmp_path / "1_Pooling").mkdir(parents=True)
    (tmp_path / "modules.json").write_text(json.dumps(
        [{"idx": i, "name": str(i), "path": p, "type": t} for i, (t, p) in enumerate(modules)]))
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    return tmp_path


def test_reader_takes_both_formats_and_refuses_what_it_cannot_run(tmp_path):
    from converter import sentence_transformers as st

    old = [("sentence_transformers.models.Transformer", ""),
           ("sentence_transformers.models.Pooling", "1_Pooling"),
           ("sentence_transformers.models.Normalize", "2_Normalize")]
    d = _st_dir(tmp_path / "a", old, {"pooling_mode_cls_token": False,
                                      "pooling_mode_mean_tokens": False,
                                      "pooling_mode_max_tokens": True})
    assert st.read(d)[1] == {"pooling": "max", "normalize": True, "max_seq_length": None}
    assert st.default_length(st.read(d)[1], {"max_position_embeddings": 512},
                             {"model_max_length": 256})["max_seq_length"] == 256
    d = _st_dir(tmp_path / "b", old[:2] + [("sentence_transformers.models.Dense", "2_Dense")],
                {"pooling_mode": "lasttoken"})
    with pytest.raises(SourceError, match="Dense"):
        st.read(d)
    d = _st_dir(tmp_path / "c", old[:2], {"pooling_mode_cls_token": True,
                                          "pooling_mode_mean_tokens": True})
    with pytest.raises(SourceError, match="exactly one"):
        st.read(d)
    assert st.read(tmp_path) is None  # no modules.json: a plain Hugging Face directory


def test_plain_bert_directory_pools_by_mean(tmp_path, packed):
    """Without sentence-transformers files an encoder pools by mean, no Normalize, as
    sentence-transformers does for a plain Hugging Face model."""
    import shutil

    from converter.hf_source import open_hf
    from converter.pack import convert

    src = tmp_path / "plain"
    src.mkdir()
    for f in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(EMBED / "bert-tiny" / f, src / f)
    convert(open_hf(src), tmp_path / "plain.edgellm", "f32", progress=False)
    cases, ref = _cases("bert-tiny")
    with edgellm.load(tmp_path / "plain.edgellm") as llm:
        raw = llm.embed(cases["sentences"])
    unit = raw / np.linalg.norm(raw, axis=1, keepdims=True)
    assert np.abs(unit - ref["embeddings"]).max() < 1e-4


# the command line ----------------------------------------------------------------------------

def _cli(*args, stdin=None):
    return subprocess.run([sys.executable, "-m", "edgellm", *map(str, args)], input=stdin,
                          capture_output=True, timeout=300)


def test_embed_command(packed, tmp_path):
    cases, ref = _cases("bert-tiny")
    model = packed("bert-tiny")
    r = _cli("embed", "-m", model, *cases["sentences"][:2])
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in r.stdout.decode().splitlines()]
    assert [row["text"] for row in rows] == cases["sentences"][:2]
    assert np.abs(np.array([row["embedding"] for row in rows]) - ref["embeddings"][:2]).max() \
        < 1e-4
    text = "\n".join(cases["sentences"]) + "\n"
    r = _cli("embed", "-m", model, "--format", "npy", "-o", tmp_path / "e.npy",
             stdin=text.encode())
    assert r.returncode == 0, r.stderr
    assert np.abs(np.load(tmp_path / "e.npy") - ref["embeddings"]).max() < 1e-4
    os.mkfifo(tmp_path / "fifo")  # a device or FIFO is refused, not replaced by the rename
    for bad in (["-f", tmp_path / "missing.txt"], ["-o", tmp_path / "no" / "dir.npy", "x"],
                ["-o", tmp_path / "fifo", "x"]):
        r = _cli("embed", "-m", model, *bad)
        assert r.returncode == 1 and len(r.stderr.decode().strip().splitlines()) == 1, r.stderr
    assert stat.S_ISFIFO((tmp_path / "fifo").lstat().st_mode)
    (tmp_path / "link.npy").symlink_to(tmp_path / "e.npy")  # written through, the link kept
    old = os.umask(0o022)
    try:
        r = _cli("embed", "-m", model, "--format", "npy", "-o", tmp_path / "link.npy", "x")
    finally:
        os.umask(old)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "link.npy").is_symlink() and np.load(tmp_path / "e.npy").shape[0] == 1
    assert (tmp_path / "e.npy").stat().st_mode & 0o777 == 0o644  # the umask's, not 0600
    r = _cli("generate", "-m", model, "-p", "hello")
    assert r.returncode == 1 and b"encoder" in r.stderr.splitlines()[-1]
    (tmp_path / "t.txt").write_text(text * 20)  # perplexity too: an error, not a bug
    r = _cli("perplexity", "-m", model, "-f", tmp_path / "t.txt", "--ctx", "64")
    assert r.returncode == 1 and b"encoder" in r.stderr.splitlines()[-1], r.stderr
    assert not (TINY / "bert-tiny").exists()  # the decoder fixtures' loops never see these


def test_texts_of_a_wrong_type_are_refused_not_iterated(packed):
    """A dict embedded its keys, a set its members in no stated order, a generator was
    used up: each is now an ArgumentError naming the type; a nested list names its item."""
    with edgellm.load(packed("bert-tiny")) as llm:
        one = llm.embed(["a"])
        for bad, words in (({"a": 1}, "got dict"), ({"a", "b"}, "got set"),
                           ((t for t in ["a"]), "got generator"), (b"a", "decode bytes"),
                           (bytearray(b"a"), "decode bytes"), (5, "got int"),
                           (None, "got NoneType"), ({"a": 1}.keys(), "got dict_keys"),
                           ([["a"]], r"texts\[0\] must be a str"),
                           (["a", b"b"], r"texts\[1\] must be a str")):
            with pytest.raises(ArgumentError, match=words):
                llm.embed(bad)
        assert np.array_equal(llm.embed(("a",)), one)  # a tuple is a list of texts
        assert llm.embed([]).shape == (0, llm.args.hidden_size)
