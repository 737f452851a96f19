"""What `pip install .` installs: every package of the source tree is listed in pyproject.toml
(an unlisted one is left out of a non-editable install, and its imports fail there only)."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_package_is_listed():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())
                 ["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts)
             for top in ("edgellm", "converter") for p in (ROOT / top).rglob("__init__.py")}
    found.add("edgellm.models")  # package-dir: models/ holds the catalog
    assert found - listed == set(), "not in pyproject.toml's packages"
    assert listed - found == set(), "listed in pyproject.toml but not in the tree"
