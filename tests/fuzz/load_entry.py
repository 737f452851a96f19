"""Fuzz driver: `edgellm generate` on a packed file, then the Python API's load + logits().

    python tests/fuzz/load_entry.py FILE [--chat]

Runs the CLI's main() exactly as `python -m edgellm generate ...` does (its exit code is
this process's), then `edgellm.load(FILE).logits(ids)`, printing one line to stderr:
"FUZZ-API ok", "FUZZ-API typed: <message>" (an EdgeLLMError), or letting any other exception
escape with its traceback, which run_fuzz.py counts.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main() -> int:
    path, chat = sys.argv[1], "--chat" in sys.argv[2:]
    from edgellm.cli import main as cli

    argv = ["generate", "-m", path, "-p", "Hello, world", "-n", "3", "--temp", "0", "-t", "1"]
    try:
        rc = cli(argv + (["--chat", "--system", "Be brief."] if chat else []))
    except SystemExit as e:  # argparse; never expected here
        rc = e.code if isinstance(e.code, int) else 2
    sys.stdout.flush()

    import edgellm
    from edgellm.errors import EdgeLLMError

    try:
        with edgellm.load(path, threads=1) as llm:
            vocab = llm.args.vocab_size
            llm.logits([i % vocab for i in (1, 2, 3, 4)])
        print("FUZZ-API ok", file=sys.stderr)
    except EdgeLLMError as e:
        print(f"FUZZ-API typed: {' '.join(str(e).split())}", file=sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(main())
