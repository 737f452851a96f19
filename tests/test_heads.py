"""Task heads of BERT-family encoders against the libraries they follow, on tiny random
checkpoints (tests/fixtures/heads, made by scripts/make_heads_fixtures.py with the
references): rerank against sentence-transformers' CrossEncoder, classify and entities
against transformers' text- and token-classification pipelines; the converter keeping the
heads; the errors for a model without the needed head; the commands."""

import json
import shutil

import numpy as np
import pytest
from conftest import FIXTURES

import edgellm
from edgellm.cli import main
from edgellm.errors import ArgumentError, EdgeLLMError, ModelKindError

HEADS = FIXTURES / "heads"


def _load(path):
    """One thread: the heads' kernels are tiny, so a busy machine's thread wake-ups would
    cost more than the work."""
    return edgellm.load(path, threads=1)


def _ref(name):
    return json.loads((HEADS / name / "reference.json").read_text("utf-8"))


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    from converter.hf_source import open_hf
    from converter.pack import convert

    root = tmp_path_factory.mktemp("heads")
    done = {}

    def get(name, src=None):
        if name not in done:
            done[name] = root / f"{name}.edgellm"
            convert(open_hf(src or HEADS / name), done[name], "f32", progress=False)
        return done[name]
    return get


def test_rerank_matches_cross_encoder(packed):
    ref = _ref("cross-encoder")
    assert ref["activation"] == "Sigmoid"  # CrossEncoder's default for one label
    assert len(ref["sets"]) == 20
    with _load(packed("cross-encoder")) as llm:
        assert llm.heads.kind == "reranker"
        for s in ref["sets"]:
            got = llm.rerank(s["query"], s["documents"])
            assert [r["index"] for r in got] == [r["index"] for r in s["ranking"]], s["query"]
            for r in got:
                assert set(r) == {"index", "relevance_score"}
                assert abs(r["relevance_score"] - s["scores"][r["index"]]) < 1e-4
        long = ref["long"]  # past the 128 positions: cut longest-first, as transformers
        got = llm.rerank(long["query"], long["documents"])
        for r in got:
            assert abs(r["relevance_score"] - long["scores"][r["index"]]) < 1e-4
        s = ref["sets"][3]
        top = llm.rerank(s["query"], s["documents"], top_n=2, return_documents=True)
        assert [r["index"] for r in top] == [r["index"] for r in s["ranking"][:2]]
        assert top[0]["document"] == {"text": s["documents"][top[0]["index"]]}
        assert llm.rerank("q", []) == []
        assert len(llm.rerank("q", ("a",), top_n=5)) == 1
        for bad in ({"documents": "one string"}, {"documents": ["a", 3]},
                    {"documents": ["a"], "top_n": 0}, {"documents": ["a"], "top_n": True},
                    {"documents": ["a"], "return_documents": "yes"}):
            with pytest.raises(ArgumentError):
                llm.rerank("q", **bad)
        with pytest.raises(ArgumentError, match="query"):
            llm.rerank(None, ["a"])


def test_rerank_reads_a_sentence_transformers_6_cross_encoder(packed, tmp_path):
    """CrossEncoder.save_pretrained (6.x) writes modules.json with a Transformer alone and
    the activation in config_sentence_transformers.json: here Identity (raw logits)."""
    src = tmp_path / "ce"
    shutil.copytree(HEADS / "cross-encoder", src)
    (src / "modules.json").write_text(json.dumps([{
        "idx": 0, "name": "0", "path": "",
        "type": "sentence_transformers.base.modules.transformer.Transformer"}]))
    (src / "config_sentence_transformers.json").write_text(json.dumps({
        "model_type": "CrossEncoder", "activation_fn": "torch.nn.modules.linear.Identity"}))
    s = _ref("cross-encoder")["sets"][0]
    with _load(packed("ce-st6", src)) as llm:
        assert llm.packed.header.get("embedding") is None
        for r in llm.rerank(s["query"], s["documents"]):
            assert abs(r["relevance_score"] - s["logits"][r["index"]]) < 1e-4


@pytest.mark.parametrize("name", ["seq-classifier", "xlmr-classifier"])
def test_classify_matches_text_classification_pipeline(packed, name):
    ref = _ref(name)

    def same(got, want):
        assert got["label"] == want["label"] and abs(got["score"] - want["score"]) < 1e-4

    with _load(packed(name)) as llm:
        for got, want in zip(llm.classify(ref["texts"]), ref["batch"], strict=True):
            same(got, want)
        same(llm.classify(ref["texts"][0]), ref["default"][0][0])  # one string: one result
        for k, key in ((None, "all"), (2, "top2")):
            for got, want in zip(llm.classify(ref["texts"], top_k=k), ref[key], strict=True):
                assert len(got) == len(want)
                for g, w in zip(got, want):
                    same(g, w)
        assert llm.classify([]) == []
        for bad in ({"texts": 3}, {"texts": ["a"], "top_k": 0}, {"texts": ["a"], "top_k": "2"}):
            with pytest.raises(ArgumentError):
                llm.classify(**bad)


def test_entities_match_token_classification_pipeline(packed):
    ref = _ref("token-classifier")
    with _load(packed("token-classifier")) as llm:
        for text, want in zip(ref["texts"], ref["simple"], strict=True):
            got = llm.entities(text)
            assert [(e["entity_group"], e["word"], e["start"], e["end"]) for e in got] == \
                [(e["entity_group"], e["word"], e["start"], e["end"]) for e in want], text
            assert all(abs(g["score"] - w["score"]) < 1e-4 for g, w in zip(got, want))
            assert all(text[e["start"]:e["end"]] for e in got)  # spans are in the text
        with pytest.raises(ArgumentError):
            llm.entities(["a list"])


def test_a_model_without_the_head_is_refused_naming_what_it_is(packed, converted):
    with _load(packed("seq-classifier")) as llm:
        assert llm.heads.kind == "classifier"
        with pytest.raises(ModelKindError, match="sequence classifier.*token-classification"):
            llm.entities("x")
        with pytest.raises(ModelKindError, match="3 labels, not a reranker"):
            llm.rerank("q", ["d"])
    with _load(packed("token-classifier")) as llm:
        assert llm.heads.kind == "tagger"
        with pytest.raises(ModelKindError, match="token classifier.*sequence-classification"):
            llm.classify("x")
    with _load(packed("bert-tiny", FIXTURES / "embed" / "bert-tiny")) as llm:
        with pytest.raises(ModelKindError, match="BertModel is an embedding model"):
            llm.rerank("q", ["d"])
        assert llm.embed("still embeds").shape == (64,) and llm.heads.kind == "embedding"
    with _load(converted("llama")) as llm:
        with pytest.raises(ModelKindError, match="text generator"):
            llm.classify("x")
        assert llm.heads.kind == "generator"


def test_a_classifier_without_its_head_tensors_still_embeds(packed, tmp_path):
    """As a classifier converted before heads were kept: an embedding model, and a call
    needing the head says so."""
    from safetensors.numpy import load_file, save_file

    src = tmp_path / "headless"
    shutil.copytree(HEADS / "seq-classifier", src)
    weights = load_file(src / "model.safetensors")
    save_file({k: v for k, v in weights.items() if not k.startswith(("bert.pooler.",
                                                                      "classifier."))},
              src / "model.safetensors")
    with _load(packed("headless", src)) as llm:
        assert llm.heads.kind == "embedding" and llm.embed("x").shape == (32,)
        with pytest.raises(ModelKindError, match="without its head's tensors"):
            llm.classify("x")


def test_the_converter_keeps_heads_only_for_classifiers(packed):
    from edgellm.modelfile.format import PackedModel

    with PackedModel(packed("cross-encoder")) as p:
        assert {"pooler.dense.weight", "classifier.weight"} <= set(p.tensors)
    with PackedModel(packed("xlmr-classifier")) as p:
        assert "classifier.out_proj.weight" in p.tensors and "pooler.dense.weight" not in p.tensors
    with PackedModel(packed("bert-tiny", FIXTURES / "embed" / "bert-tiny")) as p:
        assert not any(n.startswith(("pooler.", "classifier.")) for n in p.tensors)


def test_commands(packed, capsys, tmp_path):
    def _cmd(command, name):
        return [command, "-t", "1", "-m", str(packed(name))]

    ref = _ref("seq-classifier")
    assert main([*_cmd("classify", "seq-classifier"), *ref["texts"][:2]]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["index"], r["text"], r["label"]) for r in rows] == \
        [(i, t, w["label"]) for i, (t, w) in enumerate(zip(ref["texts"][:2], ref["batch"]))]
    assert main([*_cmd("classify", "seq-classifier"), "--all", "x"]) == 0
    assert len(json.loads(capsys.readouterr().out)["labels"]) == 3
    ner = _ref("token-classifier")
    assert main([*_cmd("entities", "token-classifier"), ner["texts"][0]]) == 0
    row = json.loads(capsys.readouterr().out)
    assert [e["word"] for e in row["entities"]] == [e["word"] for e in ner["simple"][0]]
    s = _ref("cross-encoder")["sets"][0]
    docs = tmp_path / "docs.txt"
    docs.write_text("\n".join(d for d in s["documents"] if d) + "\n")
    assert main([*_cmd("rerank", "cross-encoder"), s["query"], "-f", str(docs),
                 "--top-n", "2"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(rows) == 2 and rows[0]["relevance_score"] >= rows[1]["relevance_score"]
    assert rows[0]["document"] == [d for d in s["documents"] if d][rows[0]["index"]]
    for argv in (["entities", "-m", str(packed("seq-classifier")), "x"],
                 ["rerank", "-m", str(packed("token-classifier")), "q", "d"]):
        assert main(argv) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "needs a" in err[0], err


def test_pairs_are_cut_as_transformers_cuts_them(packed):
    """Tokenizer.encodings against transformers' tokenizer(first, second,
    truncation="longest_first", max_length=n) at lengths that hit each branch."""
    with _load(packed("cross-encoder")) as llm:
        for case in _ref("cross-encoder")["pairs"]:
            enc = llm.tokenizer.encodings([case["first"]], [case["second"]],
                                          case["max_length"])[0]
            assert (enc.ids, enc.type_ids) == (case["input_ids"], case["token_type_ids"]), \
                (case["max_length"], case["first"][:20], case["second"][:20])


def test_multi_label_classifiers_score_by_sigmoid(packed, tmp_path):
    src = tmp_path / "multi"
    shutil.copytree(HEADS / "seq-classifier", src)
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config,
                                                 "problem_type": "multi_label_classification"}))
    ref = _ref("seq-classifier")
    with _load(packed("multi", src)) as llm:
        for got, want in zip(llm.classify(ref["texts"], top_k=None), ref["sigmoid"],
                             strict=True):
            assert [g["label"] for g in got] == [w["label"] for w in want]
            assert all(abs(g["score"] - w["score"]) < 1e-4 for g, w in zip(got, want))


AWKWARD = [None, True, -1, 0, 2**70, float("nan"), "x", "\udcff", b"ab", [1, 2], ["a", None],
           {"a": 1}, object(), np.float32(1.5), np.int64(3), np.array(["a"]), (), ("a",)]


@pytest.mark.parametrize("name, model, valid", [
    ("rerank", "cross-encoder", {"query": "q", "documents": ["a", "b"], "top_n": 1,
                                 "return_documents": True}),
    ("classify", "seq-classifier", {"texts": ["a"], "top_k": 2}),
    ("entities", "token-classifier", {"text": "John in Paris"})])
def test_every_keyword_takes_each_awkward_value(packed, name, model, valid):
    """Success or an EdgeLLMError of one line, never another exception."""
    with _load(packed(model)) as llm:
        for key in valid:
            for value in AWKWARD:
                try:
                    getattr(llm, name)(**{**valid, key: value})
                except EdgeLLMError as e:
                    assert "\n" not in str(e), (key, value, e)
