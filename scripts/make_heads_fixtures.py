#!/usr/bin/env python3
"""Tiny random classification checkpoints and their references (run once).

    python scripts/make_heads_fixtures.py

Needs torch, transformers and sentence-transformers (not project dependencies). Writes
into tests/fixtures/heads/, each model with the WordPiece tokenizer of
tests/fixtures/embed/bert-tiny:
  cross-encoder/   BertForSequenceClassification, 1 label (a reranker);
                   reference.json: CrossEncoder.predict scores (its default activation for
                   one label: sigmoid), the raw logits, and CrossEncoder.rank of 20
                   query/document sets
  seq-classifier/  BertForSequenceClassification, 3 labels with id2label;
                   reference.json: the text-classification pipeline with the default top_k,
                   top_k=None and top_k=2
  xlmr-classifier/ XLMRobertaForSequenceClassification, 2 labels (the RoBERTa head);
                   reference.json as seq-classifier's
  token-classifier/ BertForTokenClassification, BIO labels (PER, LOC, ORG);
                   reference.json: the token-classification pipeline with
                   aggregation_strategy="simple"
Weights are drawn wider than transformers' default (std 0.02) so that scores spread and
orderings and argmaxes are not near-ties. The BERT fixtures' tokenizer_config names
BertTokenizer (token types passed to the model, as for BERT checkpoints); the XLM-R one
keeps the generic class (no token types, as RoBERTa's tokenizers).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
import transformers
from sentence_transformers import CrossEncoder

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "fixtures" / "heads"
TOKENIZER = ROOT / "tests" / "fixtures" / "embed" / "bert-tiny"
SIZES = dict(vocab_size=600, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
             intermediate_size=64, max_position_embeddings=128, initializer_range=0.25)

QUERIES = ["how do cats sleep", "python class definition", "the capital of france",
           "what is a neural network", "install numba on a raspberry pi",
           "best way to store data", "who wrote the report", "a man is eating food",
           "return the value of the object", "weather in zurich today",
           "define a function", "are dogs loyal", "how to read a file", "semantic search",
           "revenue grew in europe", "the girl is carrying a baby", "string format",
           "test the model", "where is the station", ""]
DOCUMENTS = ["Cats sleep for most of the day, often in the sun.",
             "A class in Python is defined with the class keyword.",
             "Paris is the capital and largest city of France.",
             "A neural network is a model made of layers of units.",
             "Use pip to install numba; on arm64 a wheel exists.",
             "Store data in a database or as files on disk.",
             "The report was written by the finance team.",
             "A man is eating a piece of bread.",
             "def value(self): return self.object",
             "It is sunny in Zürich with 12 degrees.",
             "def f(x): return x + 1",
             "Dogs are loyal and friendly animals.",
             "with open(path) as f: text = f.read()",
             "Semantic search ranks documents by meaning.",
             "Revenue grew 12.5% in Europe and Asia.",
             "The girl is carrying a baby.",
             "Use str.format or f-strings to format text.",
             "Tests compare the model with a reference.",
             "The station is next to the river.",
             "", "x", "Ünïcödé naïve café résumé 東京"]
TEXTS = ["I love this film, it is great!", "The service was slow and the food cold.",
         "It is a table.", "", "Ünïcödé, naïve café: résumé — 東京 and Zürich!",
         "def fibonacci(n): return n if n < 2 else fibonacci(n - 1)",
         "The quarterly report shows revenue grew 12.5% year over year."]
NER_TEXTS = ["John Smith works for Acme Corp in New York.",
             "Angela Merkel met Emmanuel Macron in Paris on Monday.",
             "the station is next to the river in zurich",
             "Ünïcödé café in 東京 🙂 and Zürich!",
             "x", "", "   spaced   out   words  ",
             "def fibonacci(n): return n if n < 2 else fibonacci(n - 1)",
             # longer than model_max_length (128): the pipeline cuts it
             " ".join(["Angela Merkel met Emmanuel Macron in Paris on Monday."] * 12)]
NER_LABELS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC", "B-ORG", "I-ORG"]


def _save(model, name: str, tokenizer_class: str | None = "BertTokenizer") -> Path:
    """Save `model` with the WordPiece tokenizer; tokenizer_class as BERT checkpoints name
    it (its model_input_names has token_type_ids: a pair's second text gets type 1)."""
    out = OUT / name
    if out.exists():
        shutil.rmtree(out)
    model.save_pretrained(out)
    shutil.copy(TOKENIZER / "tokenizer.json", out / "tokenizer.json")
    config = json.loads((TOKENIZER / "tokenizer_config.json").read_text("utf-8"))
    if tokenizer_class:
        config["tokenizer_class"] = tokenizer_class
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n", "utf-8")
    return out


def _dump(out: Path, ref: dict) -> None:
    (out / "reference.json").write_text(json.dumps(ref, indent=1, ensure_ascii=False) + "\n",
                                        encoding="utf-8")


def cross_encoder() -> None:
    torch.manual_seed(1)
    cfg = transformers.BertConfig(**SIZES, num_labels=1)
    out = _save(transformers.BertForSequenceClassification(cfg).eval(), "cross-encoder")
    ce = CrossEncoder(str(out), device="cpu")
    sets = []
    for k, q in enumerate(QUERIES):  # 20 sets, each query against a rotating slice of docs
        docs = [DOCUMENTS[(k + j) % len(DOCUMENTS)] for j in range(7)]
        scores = ce.predict([(q, d) for d in docs], batch_size=3).tolist()
        logits = ce.predict([(q, d) for d in docs], activation_fn=torch.nn.Identity()).tolist()
        ranked = ce.rank(q, docs, top_k=None)
        sets.append({"query": q, "documents": docs, "scores": scores, "logits": logits,
                     "ranking": [{"index": int(r["corpus_id"]), "score": float(r["score"])}
                                 for r in ranked]})
    # longer than the 128 positions together: cut longest-first
    long_q, long_d = " ".join(QUERIES[:12]), " ".join(DOCUMENTS * 3)
    long = {"query": long_q, "documents": [long_d, DOCUMENTS[0], long_q],
            "scores": ce.predict([(long_q, d) for d in (long_d, DOCUMENTS[0], long_q)]).tolist()}
    # the tokenizer's pairs cut to a length, as CrossEncoder's tokenizer call cuts them
    tok = transformers.AutoTokenizer.from_pretrained(out)
    pairs = []
    for k, length in enumerate((8, 9, 16, 17, 40, 128)):
        for first, second in ((long_q, long_d), (QUERIES[k], long_d), (long_d, QUERIES[k]),
                              (QUERIES[k], DOCUMENTS[k]), ("", "")):
            enc = tok([first], [second], truncation="longest_first", max_length=length)
            pairs.append({"first": first, "second": second, "max_length": length,
                          "input_ids": enc["input_ids"][0],
                          "token_type_ids": enc["token_type_ids"][0]})
    _dump(out, {"activation": type(ce.activation_fn).__name__, "sets": sets, "long": long,
                "pairs": pairs})


def _classifier(name: str, model, tokenizer_class: str | None = "BertTokenizer") -> None:
    out = _save(model.eval(), name, tokenizer_class)
    pipe = transformers.pipeline("text-classification", model=str(out), device="cpu")
    _dump(out, {"texts": TEXTS,
                "default": [pipe(t) for t in TEXTS],  # a string: [{"label", "score"}]
                "batch": pipe(TEXTS),  # a list: one {"label", "score"} per text
                "all": pipe(TEXTS, top_k=None), "top2": pipe(TEXTS, top_k=2),
                # what problem_type "multi_label_classification" makes the pipeline do
                "sigmoid": pipe(TEXTS, top_k=None, function_to_apply="sigmoid")})


def classifiers() -> None:
    torch.manual_seed(2)
    labels = {0: "negative", 1: "neutral", 2: "positive"}
    cfg = transformers.BertConfig(**SIZES, id2label=labels,
                                  label2id={v: k for k, v in labels.items()})
    _classifier("seq-classifier", transformers.BertForSequenceClassification(cfg))
    torch.manual_seed(3)
    labels = {0: "LABEL_A", 1: "LABEL_B"}
    cfg = transformers.XLMRobertaConfig(**SIZES, id2label=labels, type_vocab_size=1,
                                        pad_token_id=0, bos_token_id=2, eos_token_id=3,
                                        label2id={v: k for k, v in labels.items()})
    _classifier("xlmr-classifier", transformers.XLMRobertaForSequenceClassification(cfg), None)


def token_classifier() -> None:
    torch.manual_seed(4)
    labels = dict(enumerate(NER_LABELS))
    cfg = transformers.BertConfig(**SIZES, id2label=labels,
                                  label2id={v: k for k, v in labels.items()})
    out = _save(transformers.BertForTokenClassification(cfg).eval(), "token-classifier")
    pipe = transformers.pipeline("token-classification", model=str(out), device="cpu",
                                 aggregation_strategy="simple")
    raw = transformers.pipeline("token-classification", model=str(out), device="cpu")

    def plain(entities):
        return [{k: (float(v) if k == "score" else int(v) if k in ("start", "end", "index")
                     else v) for k, v in e.items()} for e in entities]
    _dump(out, {"texts": NER_TEXTS, "simple": [plain(pipe(t)) for t in NER_TEXTS],
                "none": [plain(raw(t)) for t in NER_TEXTS]})


if __name__ == "__main__":
    print("transformers", transformers.__version__)
    cross_encoder()
    tok = transformers.AutoTokenizer.from_pretrained(OUT / "cross-encoder")
    assert "token_type_ids" in tok("a", "b"), type(tok)  # the pairs' types reach the model
    classifiers()
    token_classifier()
