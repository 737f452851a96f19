"""Download a model from the catalog and convert it (edgellm list shows the names)."""

from __future__ import annotations

import sys

from ..pull import catalog, pull


def add_arguments(p) -> None:
    p.add_argument("name", nargs="?", help="catalog name (default: the default model)")


def run(args) -> int:
    name = args.name or catalog()["default"]
    path = pull(name, say=lambda m: print(m, file=sys.stderr))
    print(path)
    return 0
