"""Embed texts with an embedding model (an encoder such as all-minilm-l6-v2).

Texts come from the arguments, or one per line from -f FILE ('-' or no text at all:
stdin). Output: one JSON object per line {"index", "text", "embedding"} (--format jsonl,
the default), or a float32 [N, D] .npy array (--format npy, to -o or stdout). Texts longer
than the model's max_seq_length tokens are truncated, as sentence-transformers does.
"""

from __future__ import annotations

import json
import sys

from ..errors import EdgeLLMError
from .common import add_model_arguments, int_at_least, open_model


def add_arguments(p) -> None:
    add_model_arguments(p)
    p.add_argument("texts", nargs="*", help="texts to embed (default: lines of -f or stdin)")
    p.add_argument("-f", "--file", default=None,
                   help="read one text per line from FILE ('-': stdin)")
    p.add_argument("--format", choices=("jsonl", "npy"), default="jsonl",
                   help="output format (default: jsonl)")
    p.add_argument("-o", "--output", default=None, help="output file (default: stdout)")
    norm = p.add_mutually_exclusive_group()
    norm.add_argument("--normalize", dest="normalize", action="store_const", const=True,
                      default=None, help="L2-normalize (default: as the model says)")
    norm.add_argument("--no-normalize", dest="normalize", action="store_const", const=False)
    p.add_argument("--batch-size", type=int_at_least(1), default=32,
                   help="texts per batch (default: 32)")


def _read_texts(args) -> list[str]:
    if args.texts and args.file is not None:
        raise EdgeLLMError("give texts as arguments or with -f, not both")
    if args.texts:
        return list(args.texts)
    if args.file in (None, "-"):
        text = sys.stdin.read()
    else:
        try:
            with open(args.file, encoding="utf-8") as f:
                text = f.read()
        except OSError as e:
            raise EdgeLLMError(f"{args.file}: cannot read: {e.strerror or e}") from None
        except UnicodeDecodeError:
            raise EdgeLLMError(f"{args.file}: not UTF-8 text") from None
    return text.splitlines()


def _progress(n: int):
    """A tqdm bar on stderr for long inputs (None for short ones or no terminal)."""
    from ..embed import PROGRESS_MIN

    if n < PROGRESS_MIN:
        return None, None
    from tqdm import tqdm

    bar = tqdm(total=n, desc="embedding", unit="text", file=sys.stderr, leave=False,
               disable=None)
    return bar, lambda done: bar.update(done - bar.n)


def run(args) -> int:
    texts = _read_texts(args)
    with open_model(args) as llm:
        bar, progress = _progress(len(texts))
        try:
            vectors = llm.embed(texts, normalize=args.normalize, batch_size=args.batch_size,
                                progress=progress)
        finally:
            if bar is not None:
                bar.close()
    if args.format == "npy":
        _write_npy(vectors, args.output)
    else:
        _write_jsonl(texts, vectors, args.output)
    return 0


def _write_jsonl(texts, vectors, path) -> None:
    lines = (json.dumps({"index": i, "text": t, "embedding": [float(x) for x in v]},
                        ensure_ascii=False) + "\n" for i, (t, v) in enumerate(zip(texts, vectors)))
    if path is None:
        sys.stdout.writelines(lines)
        return
    _atomic_write(path, lambda f: f.write("".join(lines).encode("utf-8")))


def _write_npy(vectors, path) -> None:
    import numpy as np

    if path is None:
        if sys.stdout.isatty():
            raise EdgeLLMError("--format npy writes binary data: give -o FILE or redirect "
                               "stdout")
        sys.stdout.flush()
        np.save(sys.stdout.buffer, vectors)
        return
    _atomic_write(path, lambda f: np.save(f, vectors))


def _atomic_write(path: str, write) -> None:
    """Write to a temporary file next to `path` (the file a symlink there names; refused if
    it is a device: output_file.py), then rename: never a half-written file. The file gets
    the umask's mode, as any other the command writes."""
    import os

    from ..runtime.output_file import target

    out = target(path, EdgeLLMError)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            write(f)
        os.replace(tmp, out)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(e, OSError):
            raise EdgeLLMError(f"{path}: cannot write: {e.strerror or e}") from None
        raise
