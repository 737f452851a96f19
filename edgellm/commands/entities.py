"""Find named entities with a token-classification model (BertForTokenClassification).

Texts come from the arguments, or one per line from -f FILE ('-' or no text at all:
stdin). Output: one JSON object per line, {"index", "text", "entities": [{"entity_group",
"score", "word", "start", "end"}, ...]}: tokens grouped as transformers'
token-classification pipeline with aggregation_strategy="simple"; start and end are
character offsets in the text.
"""

from __future__ import annotations

from .common import add_model_arguments, open_model
from .embed import _read_texts
from .rerank import write_jsonl


def add_arguments(p) -> None:
    add_model_arguments(p)
    p.add_argument("texts", nargs="*", help="texts to tag (default: lines of -f or stdin)")
    p.add_argument("-f", "--file", default=None,
                   help="read one text per line from FILE ('-': stdin)")
    p.add_argument("-o", "--output", default=None, help="output file (default: stdout)")


def run(args) -> int:
    texts = _read_texts(args)
    with open_model(args) as llm:
        found = [llm.entities(t) for t in texts]
    write_jsonl(({"index": i, "text": t, "entities": e}
                 for i, (t, e) in enumerate(zip(texts, found))), args.output)
    return 0
