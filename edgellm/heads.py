"""Reranking, text classification and named entities on a BERT-family encoder's task head
(arch/bert.py), as sentence-transformers and transformers compute them.

    Heads(llm).rerank(query, documents, top_n=None, return_documents=False)
        -> [{"index", "relevance_score", "document"?: {"text"}}], best first
    Heads(llm).classify(texts, top_k=1) -> {"label", "score"} per text (top_k=1), or a
        list of them sorted by score (top_k=k; None: every label)
    Heads(llm).entities(text) -> [{"entity_group", "score", "word", "start", "end"}]

rerank: each (query, document) pair is one sequence, "[CLS] query [SEP] document [SEP]"
(the second text's tokens have token type 1 when the tokenizer passes token types), cut
longest-first to the model's length, through the sequence head; its one logit goes through
CrossEncoder's activation: config.json's "sentence_transformers"."activation_fn" (or the
pre-v4 "sbert_ce_default_activation_function"), else sigmoid (sentence-transformers 6.3's
default for one label). Sorted by score, ties in input order (as CrossEncoder.rank).
classify: the text-classification pipeline's function: none for problem_type
"regression", sigmoid for "multi_label_classification" or one label, softmax otherwise.
Unlike the pipeline, a single string gives one result, not a list of one.
entities: a softmax per token, its argmax label, tokens grouped as the token-classification
pipeline's aggregation_strategy="simple": a token joins the group before it when it has the
same tag (B-X / I-X / X -> X) and is not a B-; a group's score is the mean of its tokens',
its word the tokens joined by the tokenizer's decoder ([UNK] tokens: the text they cover),
its span [start, end) in characters of `text`; groups labelled "O" are dropped.
Texts longer than the model's positions (or the tokenizer's model_max_length) are cut.
"""

from __future__ import annotations

import numpy as np

from .embed import DEFAULT_BATCH, _check_text, _check_texts
from .errors import ArgumentError, FormatError, ModelKindError

# tokenizer classes whose model_input_names has token_type_ids (transformers' BERT ones);
# RoBERTa / XLM-R tokenizers and the generic fast tokenizer pass none: all types are 0
_TYPED_TOKENIZERS = ("BertTokenizer", "BertTokenizerFast", "ElectraTokenizer",
                     "ElectraTokenizerFast", "MobileBertTokenizer", "MobileBertTokenizerFast")


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


_ACTIVATIONS = {"Sigmoid": _sigmoid, "Identity": lambda x: x, "Tanh": np.tanh}


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


class Heads:
    """The task head of an LLM's encoder (a ModelKindError names what the model is when it
    has not the head a call needs)."""

    def __init__(self, llm):
        self.llm = llm
        self.model = llm.model
        self.where = str(llm.packed.path)
        self.config = llm.packed.config
        tc = llm.packed.tokenizer_config
        names = tc.get("model_input_names")
        self.typed = "token_type_ids" in names if isinstance(names, list) else \
            tc.get("tokenizer_class") in _TYPED_TOKENIZERS
        limit = tc.get("model_max_length")
        self.max_length = self.model.context if getattr(self.model, "context", None) else 0
        if isinstance(limit, int) and not isinstance(limit, bool) and limit > 1:
            self.max_length = min(self.max_length, limit)

    # what the model is -------------------------------------------------------------------
    @property
    def kind(self) -> str:
        """What the model serves: "reranker" (a sequence head with one label),
        "classifier", "tagger" (a token head), "embedding" (an encoder without a head) or
        "generator" (a decoder): for a router choosing the calls a model answers."""
        model = self.model
        if getattr(model, "generates", True):
            return "generator"
        if model.head is None:
            return "embedding"
        if model.task == "token":
            return "tagger"
        return "reranker" if model.num_labels == 1 else "classifier"

    def _need(self, kind: str, use: str) -> None:
        """ModelKindError naming what the model is unless it has the `kind` ("sequence" /
        "token") head that `use` (the call's name) needs."""
        model, arch = self.model, (self.config.get("architectures") or ["?"])[0]
        head = {"sequence": "ForSequenceClassification", "token": "ForTokenClassification"}
        needs = f"{use} needs a {kind}-classification head (*{head[kind]})"
        if getattr(model, "generates", True):
            raise ModelKindError(f"{self.where}: {self.llm.packed.architecture} is a text "
                                 f"generator: {needs} on a BERT-family encoder")
        if model.task == kind and model.head is not None:
            return
        what = {"sequence": "a sequence classifier (classify, rerank)",
                "token": "a token classifier (entities)"}.get(model.task,
                                                              "an embedding model (embed)")
        if model.task and model.head is None:
            what = f"{arch} without its head's tensors (converted for embeddings)"
        raise ModelKindError(f"{self.where}: {arch} is {what}: {needs}")

    def labels(self) -> list[str]:
        """The head's labels in id order (config id2label; LABEL_i where it has none)."""
        id2label = self.config.get("id2label")
        id2label = id2label if isinstance(id2label, dict) else {}
        return [str(id2label.get(str(i), id2label.get(i, f"LABEL_{i}")))
                for i in range(self.model.num_labels)]

    # running the head ----------------------------------------------------------------------
    def _logits(self, firsts: list[str], seconds: list[str] | None,
                batch_size: int) -> np.ndarray:
        """Sequence-head logits float32 [n, labels] of texts (or text pairs)."""
        out = np.zeros((len(firsts), self.model.num_labels), np.float32)
        tok = self.llm.tokenizer
        for s in range(0, len(firsts), batch_size):
            encs = tok.encodings(firsts[s:s + batch_size], None if seconds is None
                                 else seconds[s:s + batch_size], self.max_length)
            ids = [self.llm._in_vocab(e.ids) for e in encs]
            offsets = np.concatenate([[0], np.cumsum([len(i) for i in ids])]).astype(np.int64)
            types = np.fromiter((t for e in encs for t in e.type_ids), np.int64,
                                int(offsets[-1])) if self.typed else None
            out[s:s + len(encs)] = self.model.classify(
                np.fromiter((i for x in ids for i in x), np.int64, int(offsets[-1])),
                offsets, types)
        return out

    def _activation(self):
        st = self.config.get("sentence_transformers")
        path = st.get("activation_fn") if isinstance(st, dict) else None
        path = path or self.config.get("sbert_ce_default_activation_function")
        if path is None:
            return _sigmoid  # CrossEncoder's default for one label
        fn = _ACTIVATIONS.get(str(path).rsplit(".", 1)[-1])
        if fn is None:
            raise FormatError(f"{self.where}: config activation_fn {str(path)[:80]!r} is not "
                              f"supported ({', '.join(_ACTIVATIONS)})")
        return fn

    # the calls ---------------------------------------------------------------------------
    def rerank(self, query, documents, top_n=None, return_documents=False,
               batch_size: int = DEFAULT_BATCH) -> list[dict]:
        """Documents by relevance to `query`, best first (see the module doc)."""
        query = _check_text(query, "query")
        docs = _check_documents(documents)
        if top_n is not None and (isinstance(top_n, bool) or not isinstance(top_n, int)
                                  or top_n < 1):
            raise ArgumentError(f"top_n must be an int >= 1 or None, got {top_n!r:.40}")
        if not isinstance(return_documents, bool):
            raise ArgumentError(f"return_documents must be True or False, got "
                                f"{return_documents!r:.40}")
        _check_batch(batch_size)
        self._need("sequence", "rerank")
        if self.model.num_labels != 1:
            raise ModelKindError(f"{self.where}: a classifier with {self.model.num_labels} "
                                 "labels, not a reranker (one score): use classify()")
        activation = self._activation()
        scores = activation(self._logits([query] * len(docs), docs, batch_size)[:, 0]
                            .astype(np.float64)) if docs else np.zeros(0)
        order = sorted(range(len(docs)), key=lambda i: -scores[i])[:top_n]
        return [{"index": i, "relevance_score": float(scores[i]),
                 **({"document": {"text": docs[i]}} if return_documents else {})}
                for i in order]

    def classify(self, texts, top_k=1, batch_size: int = DEFAULT_BATCH):
        """Labels and scores of each text (see the module doc)."""
        single = isinstance(texts, str)
        items = [_check_text(texts)] if single else _check_texts(texts)
        if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int)
                                  or top_k < 1):
            raise ArgumentError(f"top_k must be an int >= 1 or None, got {top_k!r:.40}")
        _check_batch(batch_size)
        self._need("sequence", "classify")
        labels, problem = self.labels(), self.config.get("problem_type")
        logits = self._logits(items, None, batch_size) if items else \
            np.zeros((0, len(labels)), np.float32)
        if problem == "regression":
            scores = logits
        elif problem == "multi_label_classification" or len(labels) == 1:
            scores = _sigmoid(logits)
        else:
            scores = _softmax(logits)
        out = []
        for row in scores:
            ranked = sorted(range(len(labels)), key=lambda j: -row[j])  # stable: ties by id
            found = [{"label": labels[j], "score": float(row[j])} for j in ranked[:top_k]]
            out.append(found[0] if top_k == 1 else found)
        return out[0] if single else out

    def entities(self, text) -> list[dict]:
        """Named entities of one text (see the module doc)."""
        text = _check_text(text)
        self._need("token", "entities")
        tok, labels = self.llm.tokenizer, self.labels()
        enc = tok.encodings([text], None, self.max_length)[0]
        ids = self.llm._in_vocab(enc.ids)
        scores = _softmax(self.model.tag(np.array(ids, np.int64),
                                         np.array([0, len(ids)], np.int64)))
        unk = tok.token_to_id(tok.special_tokens.get("unk_token", "[UNK]") or "[UNK]")
        tokens = []  # (label, score, word, start, end) of each non-special token
        for k, (i, special, (start, end)) in enumerate(zip(ids, enc.special_tokens_mask,
                                                           enc.offsets)):
            if special:
                continue
            j = int(scores[k].argmax())
            word = text[start:end] if i == unk else enc.tokens[k]
            tokens.append((labels[j], scores[k, j], word, start, end))
        groups, run = [], []
        for t in tokens:
            if run and _tag(t[0])[1] == _tag(run[-1][0])[1] and _tag(t[0])[0] != "B":
                run.append(t)
                continue
            if run:
                groups.append(run)
            run = [t]
        if run:
            groups.append(run)
        out = []
        for g in groups:
            group = g[0][0].split("-", 1)[-1]
            if group == "O":  # the pipeline's ignore_labels
                continue
            out.append({"entity_group": group,
                        "score": float(np.mean(np.array([t[1] for t in g], np.float32))),
                        "word": tok.convert_tokens_to_string([t[2] for t in g]),
                        "start": int(g[0][3]), "end": int(g[-1][4])})
        return out


def _tag(label: str) -> tuple[str, str]:
    """("B" | "I", entity) of a BIO label; a label without a prefix continues ("I")."""
    if label.startswith(("B-", "I-")):
        return label[0], label[2:]
    return "I", label


def _check_documents(documents) -> list[str]:
    """A list of str (ArgumentError naming "documents" or the bad item otherwise)."""
    try:
        return _check_texts(documents)
    except ArgumentError as e:
        raise ArgumentError(str(e).replace("texts", "documents", 1)) from None


def _check_batch(batch_size) -> None:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ArgumentError(f"batch_size must be an int >= 1, got {batch_size!r:.40}")
