"""Rank documents by relevance to a query with a cross-encoder (a reranker model).

The query is the first argument; documents are the other arguments, or one per line from
-f FILE ('-' or no document argument: stdin). Output: one JSON object per line, best first:
{"index", "relevance_score", "document"}, scores as sentence-transformers' CrossEncoder
computes them.
"""

from __future__ import annotations

import json
import sys

from ..errors import EdgeLLMError
from .common import add_model_arguments, int_at_least, open_model, text_argument


def add_arguments(p) -> None:
    add_model_arguments(p)
    p.add_argument("query", type=text_argument("query"), help="the query")
    p.add_argument("texts", nargs="*", metavar="document",
                   help="documents to rank (default: lines of -f or stdin)")
    p.add_argument("-f", "--file", default=None,
                   help="read one document per line from FILE ('-': stdin)")
    p.add_argument("--top-n", type=int_at_least(1), default=None,
                   help="print only the N best (default: all)")
    p.add_argument("-o", "--output", default=None, help="output file (default: stdout)")


def run(args) -> int:
    from .embed import _read_texts

    documents = _read_texts(args)
    if not documents:
        raise EdgeLLMError("no documents to rank")
    with open_model(args) as llm:
        results = llm.rerank(args.query, documents, top_n=args.top_n)
    write_jsonl(({**r, "document": documents[r["index"]]} for r in results), args.output)
    return 0


def write_jsonl(rows, path) -> None:
    """One JSON object per line to stdout or to `path` (written whole, then renamed)."""
    lines = (json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    if path is None:
        sys.stdout.writelines(lines)
        return
    from .embed import _atomic_write

    _atomic_write(path, lambda f: f.write("".join(lines).encode("utf-8")))
