"""The README as a newcomer meets it: short, its test command the one CI runs, its Python
blocks valid, its links alive, every `edgellm` / `convert-model` line in its shell blocks
accepted by the command's own parser (nothing is run: the real-model tests run the first
command), and its placeholders named as such."""

from __future__ import annotations

import ast
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text("utf-8")
FENCES = re.findall(r"```(\w*)\n(.*?)```", README, re.S)


def test_readme_is_short():
    assert len(README.splitlines()) <= 450


def test_the_test_command_is_the_one_ci_runs():
    ci = [ln for ln in (ROOT / ".ci" / "run").read_text().splitlines()
          if ln.startswith("pip install")]
    assert ci and all(ln in README for ln in ci)


@pytest.mark.parametrize("code", [c for lang, c in FENCES if lang == "python"],
                         ids=lambda c: c.splitlines()[0][:40])
def test_python_blocks_parse(code):
    ast.parse(code)


def test_relative_links_resolve():
    text = re.sub(r"```.*?```", "", README, flags=re.S)
    for link in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text):
        if not link.startswith("http"):
            assert (ROOT / link).exists(), link


def _command_lines():
    for lang, code in FENCES:
        if lang != "sh":
            continue
        for line in code.splitlines():
            for part in line.split(" && "):
                words = shlex.split(part.split(" #")[0].split(" > ")[0], posix=True)
                if words and words[0] in ("edgellm", "convert-model"):
                    yield words


@pytest.mark.parametrize("words", list(_command_lines()), ids=" ".join)
def test_shell_lines_parse(words):
    if words[0] == "edgellm":
        from edgellm.cli import build_parser
    else:
        from converter.cli import build_parser
    build_parser().parse_args(words[1:])
