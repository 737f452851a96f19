"""Architectures by model_type: every module of this package with a `SPEC` (spec.py).

Adding an architecture is adding its module: it is found here on first use, by scanning
the package (as mlx-lm finds models/<model_type>.py), with no list to edit.
"""

from __future__ import annotations

import importlib
import pkgutil

from .spec import ArchSpec

_SPECS: dict[str, ArchSpec] | None = None
_SKIP = frozenset({"base", "fused", "registry", "spec", "steps"})  # modules of no architecture


def specs() -> dict[str, ArchSpec]:
    """model_type -> ArchSpec of every architecture module."""
    global _SPECS
    if _SPECS is None:
        found: dict[str, ArchSpec] = {}
        for mod in sorted(m.name for m in pkgutil.iter_modules(_package_path())):
            if mod in _SKIP:
                continue
            spec = getattr(importlib.import_module(f"{__package__}.{mod}"), "SPEC", None)
            if isinstance(spec, ArchSpec):
                for t in spec.model_types:
                    if t in found:
                        raise RuntimeError(f"model_type {t!r} is declared by two architectures")
                    found[t] = spec
        _SPECS = found
    return _SPECS


def _package_path():
    from . import __path__ as path

    return path


def spec_for(model_type: str | None) -> ArchSpec | None:
    """The architecture serving `model_type`, or None."""
    return specs().get(model_type) if isinstance(model_type, str) else None


def supported() -> tuple[str, ...]:
    """Every model_type edgellm runs, sorted."""
    return tuple(sorted(specs()))
