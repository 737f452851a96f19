"""Classify texts with a text-classification model (a BERT-family *ForSequenceClassification).

Texts come from the arguments, or one per line from -f FILE ('-' or no text at all:
stdin). Output: one JSON object per line, {"index", "text", "label", "score"} (the best
label, as transformers' text-classification pipeline), or with --top-k K / --all
{"index", "text", "labels": [{"label", "score"}, ...]} sorted by score.
"""

from __future__ import annotations

from .common import add_model_arguments, int_at_least, open_model
from .embed import _read_texts
from .rerank import write_jsonl


def add_arguments(p) -> None:
    add_model_arguments(p)
    p.add_argument("texts", nargs="*", help="texts to classify (default: lines of -f or stdin)")
    p.add_argument("-f", "--file", default=None,
                   help="read one text per line from FILE ('-': stdin)")
    k = p.add_mutually_exclusive_group()
    k.add_argument("--top-k", type=int_at_least(1), default=1,
                   help="the K best labels of each text (default: 1)")
    k.add_argument("--all", dest="top_k", action="store_const", const=None,
                   help="every label of each text, best first")
    p.add_argument("-o", "--output", default=None, help="output file (default: stdout)")


def run(args) -> int:
    texts = _read_texts(args)
    with open_model(args) as llm:
        results = llm.classify(texts, top_k=args.top_k)
    rows = ({"index": i, "text": t, **r} if args.top_k == 1 else
            {"index": i, "text": t, "labels": r} for i, (t, r) in enumerate(zip(texts, results)))
    write_jsonl(rows, args.output)
    return 0
